"""The object-key layout: the one place a stored object's key is spelled.

Every kind of object has one function here: signed manifests (snapshot and release
envelopes) under ``manifests/``, content-addressed documents (membership tables, source
pins, reports, approvals, provenance) under ``cas/sha256/``, release shards under
``shards/sha256/`` and checkpoint trees under ``checkpoints/``.  Nothing else in the
project spells a key or a prefix.

An object looks orphaned when the reference and the listing spell its key differently:
``s3://bucket/shards/...`` against ``shards/...``, ``shards//sha256/./X`` against
``shards/sha256/X``, percent-encoding, or an upper-case hex digest in a content address.
The collector compares canonical keys only, and deletes by the exact stored key and
version the listing returned.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

from relgate.integrity.digests import hex_of

#: Signed manifests (DSSE envelopes) of snapshots and releases.
MANIFEST_ROOT = "manifests/"
SNAPSHOT_MANIFEST_PREFIX = "manifests/snapshots/"
RELEASE_MANIFEST_PREFIX = "manifests/releases/"
ENVELOPE_SUFFIX = ".dsse.json"
#: Content-addressed documents: membership tables, source pins, reports, approvals.
CAS_ROOT = "cas/"
CAS_PREFIX = "cas/sha256/"
CAS_URI_PREFIX = "cas://sha256/"
#: Release shards, addressed by the digest of their stored bytes.
SHARD_ROOT = "shards/"
SHARD_PREFIX = "shards/sha256/"
SHARD_SUFFIX = ".parquet"
ENCRYPTED_SHARD_SUFFIX = ".parquet.aesgcm"
#: Checkpoint trees published to the origin.
CHECKPOINT_ROOT = "checkpoints/"
#: Prefixes the garbage collector manages; nothing outside them is ever a candidate.
MANAGED_PREFIXES = (MANIFEST_ROOT, CAS_ROOT, SHARD_ROOT)

_MANIFEST_PREFIX = {"snapshot": SNAPSHOT_MANIFEST_PREFIX, "release": RELEASE_MANIFEST_PREFIX}


def envelope_key(kind: str, digest: str) -> str:
    """The DSSE envelope of one snapshot or release manifest."""
    return f"{_MANIFEST_PREFIX[kind]}{hex_of(digest)}{ENVELOPE_SUFFIX}"


def snapshot_envelope_key(digest: str) -> str:
    return envelope_key("snapshot", digest)


def release_envelope_key(digest: str) -> str:
    return envelope_key("release", digest)


def envelope_subject(key: str) -> tuple[str, str] | None:
    """(kind, digest) of a canonical envelope key, or None for any other key."""
    for kind, prefix in _MANIFEST_PREFIX.items():
        if key.startswith(prefix) and key.endswith(ENVELOPE_SUFFIX):
            return kind, "sha256:" + key[len(prefix) : -len(ENVELOPE_SUFFIX)]
    return None


def cas_key(digest: str) -> str:
    """A content-addressed document (membership, source pin, report, approval)."""
    return CAS_PREFIX + hex_of(digest)


def cas_uri(digest: str) -> str:
    """The ``cas://`` URI manifests use to name a content-addressed document."""
    return CAS_URI_PREFIX + hex_of(digest)


#: Membership tables, reports and approvals are content-addressed documents.
membership_key = cas_key
report_key = cas_key
approval_key = cas_key
#: Schema-evolution reports and snapshot statistics are content-addressed documents too.
evolution_report_key = cas_key
statistics_key = cas_key


def shard_key(digest: str, *, encrypted: bool = False) -> str:
    """A release shard, by the digest of its stored bytes."""
    return SHARD_PREFIX + hex_of(digest) + (ENCRYPTED_SHARD_SUFFIX if encrypted else SHARD_SUFFIX)


def digest_named_by(key: str) -> str | None:
    """The content digest a canonical CAS or shard key names (None for other keys)."""
    name = key.rsplit("/", 1)[-1]
    if key.startswith((CAS_PREFIX, SHARD_PREFIX)):
        return "sha256:" + name.split(".", 1)[0]
    return None


_SCHEME = re.compile(r"([a-zA-Z][a-zA-Z0-9+.-]*)://([^/]*)/?(.*)")
_HEX64 = re.compile(r"([0-9a-fA-F]{64})((?:\.[A-Za-z0-9]+)*)")


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
    match = _SCHEME.fullmatch(ref)
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
    return "/".join(_canonical_segment(segment) for segment in parts)


def _canonical_segment(segment: str) -> str:
    """A 64-hex digest segment (with any suffix) and ``sha256`` are lower-cased."""
    hexmatch = _HEX64.fullmatch(segment)
    if hexmatch:
        return hexmatch.group(1).lower() + hexmatch.group(2).lower()
    if segment.lower() == "sha256":
        return "sha256"
    return segment


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


#: Membership tables are content-addressed documents.
membership_key = cas_key


def cdc_segment_key(prefix: str, first_offset: int) -> str:
    """One immutable CDC log segment under the source's configured prefix."""
    return f"{prefix}{first_offset:020d}.jsonl"


#: The names the release modules use for the same two keys.
release_shard_key = shard_key
release_manifest_key = release_envelope_key
#: Where release shards live (the writer's staging checks name it).
RELEASE_SHARD_PREFIX = SHARD_PREFIX
