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


# -- snapshot area: keys the snapshot, membership and source modules name ---------------------
# (added by the snapshot helper; identical in name and meaning to the gate helper's versions,
# so at merge keep one copy of each.)

from relgate.integrity.digests import hex_of  # noqa: E402  # block appended for the merge

SNAPSHOT_MANIFEST_PREFIX = "manifests/snapshots/"
ENVELOPE_SUFFIX = ".dsse.json"
CAS_PREFIX = "cas/sha256/"


def snapshot_envelope_key(digest: str) -> str:
    """The DSSE envelope of one snapshot manifest."""
    return f"{SNAPSHOT_MANIFEST_PREFIX}{hex_of(digest)}{ENVELOPE_SUFFIX}"


def cas_key(digest: str) -> str:
    """A content-addressed document (membership, source pin, report, approval)."""
    return CAS_PREFIX + hex_of(digest)


#: Membership tables are content-addressed documents.
membership_key = cas_key


def cdc_segment_key(prefix: str, first_offset: int) -> str:
    """One immutable CDC log segment under the source's configured prefix."""
    return f"{prefix}{first_offset:020d}.jsonl"
