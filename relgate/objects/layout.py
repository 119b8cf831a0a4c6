"""One spelling per stored object.

An object looks orphaned when the reference and the listing spell its key differently:
``s3://bucket/shards/...`` against ``shards/...``, ``shards//sha256/./X`` against
``shards/sha256/X``, percent-encoding, or an upper-case hex digest in a content address.
The collector compares canonical keys only, and deletes by the exact stored key and
version the listing returned.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://([^/]*)/?(.*)$")
_HEX64 = re.compile(r"^([0-9a-fA-F]{64})((?:\.[A-Za-z0-9]+)*)$")


def canonical_key(reference: str, *, store_prefix: str = "") -> str:
    """The canonical object key a reference names.

    * ``cas://sha256/<hex>`` -> ``cas/sha256/<hex>``; ``<scheme>://<authority>/<path>``
      (``s3://bucket/...``, ``file:///...``) -> ``<path>``;
    * percent-encoding is decoded; empty and ``.`` segments dropped, ``..`` resolved;
    * ``store_prefix`` (the store's own key prefix) is removed;
    * a 64-hex segment (with or without a file suffix) is lower-cased, so the digest
      spelling cannot split one object into two.
    """
    if _already_canonical(reference) and not store_prefix:
        return reference
    ref = reference.strip()
    match = _SCHEME.match(ref)
    if match:
        scheme, authority, path = match.groups()
        ref = f"cas/{authority}/{path}" if scheme.lower() == "cas" else path
    ref = unquote(ref)
    parts: list[str] = []
    for segment in ref.replace("\\", "/").split("/"):
        if segment in ("", "."):
            continue
        if segment == "..":
            if parts:
                parts.pop()
            continue
        parts.append(segment)
    prefix = [p for p in store_prefix.split("/") if p]
    if prefix and parts[: len(prefix)] == prefix:
        parts = parts[len(prefix) :]
    out = []
    for segment in parts:
        hexmatch = _HEX64.match(segment)
        if hexmatch:
            segment = hexmatch.group(1).lower() + hexmatch.group(2).lower()
        elif segment.lower() == "sha256":
            segment = "sha256"
        out.append(segment)
    return "/".join(out)


def _already_canonical(key: str) -> bool:
    """Fast path for the common case (what the store lists and manifests name)."""
    return (
        key == key.lower()
        and key == key.strip()
        and "%" not in key
        and "//" not in key
        and "/." not in key
        and "\\" not in key
        and ":" not in key
        and not key.startswith((".", "/"))
        and not key.endswith("/")
    )


# -- release objects (added by the release area; the lead may merge this block) ----------

from relgate.integrity.digests import hex_of  # noqa: E402 - kept in this block for the merge

#: Shard objects, addressed by the digest of their stored bytes.
RELEASE_SHARD_PREFIX = "shards/sha256/"
#: Signed release root manifests (DSSE envelopes), addressed by the root digest.
RELEASE_MANIFEST_PREFIX = "manifests/releases/"
#: The suffix of a plain shard; an encrypted shard adds :data:`ENCRYPTED_SUFFIX`.
SHARD_SUFFIX = ".parquet"
ENCRYPTED_SUFFIX = ".aesgcm"


def release_shard_key(digest: str, *, encrypted: bool) -> str:
    """``shards/sha256/<hex>.parquet`` (``.parquet.aesgcm`` when encrypted).

    The digest is not validated here: a key is computed for any descriptor of a signed
    root (the collector walks forged ones too); digests are checked where they are read.
    """
    suffix = SHARD_SUFFIX + (ENCRYPTED_SUFFIX if encrypted else "")
    return f"{RELEASE_SHARD_PREFIX}{digest.removeprefix('sha256:')}{suffix}"


def release_manifest_key(digest: str) -> str:
    """``manifests/releases/<hex>.dsse.json``: the envelope of a release root."""
    return f"{RELEASE_MANIFEST_PREFIX}{hex_of(digest)}.dsse.json"
