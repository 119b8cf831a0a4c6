"""Content-addressed storage on top of a versioned object store.

Keys are spelled by :func:`relgate.objects.layout.cas_key`; writes are conditional creates, so an existing key is
never overwritten: a second writer of the same bytes gets the first writer's version,
and a key whose stored bytes do not hash to its name is reported, never replaced.
"""

from __future__ import annotations

from dataclasses import dataclass

from relgate.errors import IntegrityError, ObjectExistsError, UsageError
from relgate.integrity.digests import require_digest, sha256_digest
from relgate.objects.layout import CAS_PREFIX, CAS_URI_PREFIX, cas_key, cas_uri
from relgate.objects.versioned import ObjectStore, ObjectVersion

__all__ = ["CAS_PREFIX", "ContentRef", "ContentStore", "digest_of_uri", "key_for"]


@dataclass(frozen=True)
class ContentRef:
    """A pinned content-addressed object: digest plus the exact stored version."""

    digest: str
    version_id: str
    size: int

    @property
    def uri(self) -> str:
        return cas_uri(self.digest)

    @property
    def key(self) -> str:
        return cas_key(self.digest)


def key_for(digest: str) -> str:
    """The key of a content-addressed document (see :func:`relgate.objects.layout.cas_key`)."""
    return cas_key(digest)


def digest_of_uri(uri: str) -> str:
    if not uri.startswith(CAS_URI_PREFIX):
        raise UsageError("not a content-addressed URI", object=uri, check="cas-uri")
    return require_digest("sha256:" + uri[len(CAS_URI_PREFIX) :])


class ContentStore:
    def __init__(self, store: ObjectStore) -> None:
        self.store = store

    def put(self, data: bytes) -> ContentRef:
        digest = sha256_digest(data)
        key = key_for(digest)
        try:
            version = self.store.create(key, data)
        except ObjectExistsError:
            current = self.store.head(key)
            # Same name means same bytes only if they hash the same: check, never trust.
            self.get(digest, current.version_id)
            version = current
        return ContentRef(digest=digest, version_id=version.version_id, size=len(data))

    def get(self, digest: str, version_id: str) -> bytes:
        data = self.store.get(key_for(digest), version_id)
        actual = sha256_digest(data)
        if actual != digest:
            raise IntegrityError(
                "stored bytes do not match their content address",
                object=f"{key_for(digest)}@{version_id}",
                check="storage-digest",
                digest=digest,
                details={"actual": actual, "size": len(data)},
            )
        return data

    def head(self, digest: str, version_id: str) -> ObjectVersion:
        return self.store.head(key_for(digest), version_id)
