"""Shard bytes for a reader, through an optional local cache checked against the descriptor.

Used by run workers and the training reader (the verifier itself keeps no cache: it reads
the exact pinned version every time, :mod:`relgate.release.verify.worker`).
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from relgate.documents.shard_descriptor import ENCRYPTED_SHARD_MEDIA_TYPE, ShardDescriptor
from relgate.errors import IntegrityError
from relgate.integrity.contract import JsonValue
from relgate.objects.layout import release_shard_key
from relgate.objects.versioned import ObjectStore
from relgate.release.metrics import current
from relgate.release.verify.worker import sha256_of

#: A descriptor as typed, or as signed (a wire object from a root).
DescriptorLike = ShardDescriptor | Mapping[str, JsonValue]


def as_descriptor(descriptor: DescriptorLike) -> ShardDescriptor:
    if isinstance(descriptor, ShardDescriptor):
        return descriptor
    return ShardDescriptor.parse(dict(descriptor), what="shard descriptor")


def object_key(descriptor: DescriptorLike) -> str:
    """Objects are addressed by the digest of their stored bytes (never by listing).

    A descriptor as signed needs only its ``digest`` and ``mediaType`` here: the collector
    computes keys for every descriptor of every root, malformed ones included.
    """
    if isinstance(descriptor, ShardDescriptor):
        return descriptor.object_key
    return release_shard_key(
        str(descriptor["digest"]),
        encrypted=descriptor["mediaType"] == ENCRYPTED_SHARD_MEDIA_TYPE,
    )


def fetch_shard(
    store: ObjectStore,
    descriptor: DescriptorLike,
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    root: str = "unknown",
) -> tuple[bytes, str]:
    """Shard bytes for a reader (run workers), through an optional local cache.

    A cached copy is used only if its size and SHA-256 match the descriptor; a stale or
    corrupt copy is discarded and the exact pinned version re-read (status ``rejected``).
    Returns ``(bytes, status)`` with status ``off``, ``hit``, ``miss`` or ``rejected``;
    raises IntegrityError if the pinned version itself does not match.
    """
    d = as_descriptor(descriptor)
    want = d.storage_digest
    status = "off"
    cached: Path | None = None
    if cache_dir is not None:
        cached = Path(cache_dir) / (want.removeprefix("sha256:") + ".shard")
        status = "miss"
        if cached.exists():
            data = cached.read_bytes() if cached.stat().st_size == d.size else b""
            if len(data) == d.size and sha256_of(data) == want:
                return data, "hit"
            status = "rejected"
            cached.unlink(missing_ok=True)
            current().cache_corrupted(root)
    key = d.object_key
    data = store.get(key, d.object_version, max_size=d.size)  # size-mismatch past d.size
    actual = sha256_of(data)
    if actual != want or len(data) != d.size:
        raise IntegrityError(
            "pinned shard version does not match its descriptor",
            object=f"{d.id} {key}@{d.object_version}",
            check="storage-digest",
            digest=want,
            details={"actual": actual, "size": len(data)},
        )
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.part")
        tmp.write_bytes(data)
        os.replace(tmp, cached)
    return data, status
