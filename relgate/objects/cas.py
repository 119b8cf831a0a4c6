"""Content-addressed storage on top of a versioned object store.

Keys are spelled by :func:`relgate.objects.layout.cas_key`; writes are conditional creates, so an existing key is
never overwritten: a second writer of the same bytes gets the first writer's version
once its stored bytes hash to the key.  A stored version that does not (truncated,
damaged, or larger than the content) is a *storage fault*: it is named (key, version,
expected, actual) and repaired by writing a **new version** of the same content (the
faulty version stays, for the record); the fault is handed to ``on_fault`` (the
workspace records it as a ``storage-repair`` gate event) and the writer gets the new
version, so a damaged object never blocks a later build of the same content.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from relgate_trust.digests import file_sha256_digest, sha256_digest, spelled

from relgate.errors import IntegrityError, ObjectExistsError, UsageError
from relgate.integrity.digests import require_digest
from relgate.objects.layout import CAS_PREFIX, CAS_URI_PREFIX, cas_key, cas_uri
from relgate.objects.versioned import SIZE_MISMATCH, ObjectStore, ObjectVersion

__all__ = [
    "CAS_PREFIX",
    "STORAGE_DIGEST",
    "ContentRef",
    "ContentStore",
    "StorageFault",
    "digest_fault",
    "digest_of_uri",
    "key_for",
]

#: The check a stored version whose bytes do not hash to its content address fails.
STORAGE_DIGEST = "storage-digest"
#: A file handed to :meth:`ContentStore.put_file` changed while it was stored.
CONTENT_CHANGED = "content-changed"


@dataclass(frozen=True)
class StorageFault:
    """A stored CAS version that failed its digest (or its size), and its repair."""

    key: str
    version: str
    expected: str
    actual: str
    check: str
    repaired_version: str


def digest_fault(
    key: str, version_id: str, expected: str, actual: str, size: int
) -> IntegrityError:
    """A stored version whose bytes do not hash to the digest that names it."""
    return IntegrityError(
        "stored bytes do not match their content address",
        object=f"{key}@{version_id}",
        check=STORAGE_DIGEST,
        digest=expected,
        details={
            "key": key,
            "version": version_id,
            "expected": expected,
            "actual": actual,
            "size": size,
        },
    )


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
    def __init__(
        self, store: ObjectStore, *, on_fault: Callable[[StorageFault], None] | None = None
    ) -> None:
        self.store = store
        self.on_fault = on_fault

    def put(self, data: bytes) -> ContentRef:
        digest = sha256_digest(data)
        key = key_for(digest)
        try:
            version = self.store.create(key, data)
        except ObjectExistsError:
            version = self._existing(key, digest, len(data), lambda: self.store.put(key, data))
        return ContentRef(digest=digest, version_id=version.version_id, size=len(data))

    def put_file(
        self, source: Path, *, before_store: Callable[[str], None] | None = None
    ) -> ContentRef:
        """:meth:`put` of a file, streamed: hashed in one read and stored without holding
        it in memory.  ``before_store(key)`` runs once the key is known and before anything
        is written (a publisher lease covers it there).  A file that grew or shrank while it
        was copied is refused (``content-changed``)."""
        with open(source, "rb") as fh:
            digest = file_sha256_digest(fh)
            size = os.fstat(fh.fileno()).st_size
        key = key_for(digest)
        if before_store is not None:
            before_store(key)
        try:
            version = self.store.create_file(key, source)
        except ObjectExistsError:
            version = self._existing(key, digest, size, lambda: self.store.put_file(key, source))
        if version.size != size:
            raise IntegrityError(
                "the file changed while it was stored",
                object=f"{key}@{version.version_id}",
                check=CONTENT_CHANGED,
                digest=digest,
                details={"hashed": size, "stored": version.size},
            )
        return ContentRef(digest=digest, version_id=version.version_id, size=size)

    def _existing(
        self, key: str, digest: str, size: int, rewrite: Callable[[], ObjectVersion]
    ) -> ObjectVersion:
        """The current version of ``key`` when it holds these bytes.  Same name means same
        bytes only if they hash the same: it is hashed by a streamed read (bounded by
        ``size``), and one that fails is repaired by ``rewrite``."""
        current = self.store.head(key)
        try:
            self._verify_stored(digest, current.version_id, size)
        except IntegrityError as exc:
            if exc.check not in (STORAGE_DIGEST, SIZE_MISMATCH):
                raise
            return self._repair(key, digest, faulty=current.version_id, exc=exc, write=rewrite)
        return current

    def _verify_stored(self, digest: str, version_id: str, size: int) -> None:
        """Hash an exact stored version by a streamed read (bounded by ``size``)."""
        key = key_for(digest)
        sink = _HashingWriter(_Discard())
        with _naming(digest):
            self.store.read_into(key, version_id, sink, max_size=size)
        actual = spelled(sink.sha.hexdigest())
        if actual != digest:
            raise digest_fault(key, version_id, digest, actual, sink.size)

    def _repair(
        self,
        key: str,
        expected: str,
        *,
        faulty: str,
        exc: IntegrityError,
        write: Callable[[], ObjectVersion],
    ) -> ObjectVersion:
        """A new version of the same content over a stored version that failed its digest;
        the fault is recorded, the faulty version is left as it is."""
        version = write()
        actual = exc.details.get("actual")
        fault = StorageFault(
            key=key,
            version=faulty,
            expected=expected,
            actual=str(actual) if exc.check == STORAGE_DIGEST else f"size:{actual}",
            check=str(exc.check),
            repaired_version=version.version_id,
        )
        if self.on_fault is not None:
            self.on_fault(fault)
        return version

    def get(self, digest: str, version_id: str, *, size: int | None = None) -> bytes:
        """The exact stored version, hashed; with ``size`` (what a signed document
        records) a larger object is refused (``size-mismatch``) before it is read."""
        key = key_for(digest)
        with _naming(digest):
            data = self.store.get(key, version_id, max_size=size)
        actual = sha256_digest(data)
        if actual != digest:
            raise digest_fault(key, version_id, digest, actual, len(data))
        return data

    def fetch_to(
        self, digest: str, version_id: str, target: Path, *, size: int | None = None
    ) -> None:
        """Copy the exact stored version to ``target`` (atomically), hashing it on the way:
        a version that does not hash to ``digest`` is refused (nothing is left at
        ``target``); with ``size`` a larger one is refused before it is read."""
        key = key_for(digest)
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=".part-")
        try:
            with os.fdopen(fd, "wb") as fh:
                hashed = _HashingWriter(fh)
                with _naming(digest):
                    self.store.read_into(key, version_id, hashed, max_size=size)
            actual = spelled(hashed.sha.hexdigest())
            if actual != digest:
                raise digest_fault(key, version_id, digest, actual, hashed.size)
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)

    def head(self, digest: str, version_id: str) -> ObjectVersion:
        return self.store.head(key_for(digest), version_id)


@contextlib.contextmanager
def _naming(digest: str) -> Iterator[None]:
    """A size refusal of a content-addressed read names the digest it was read for."""
    try:
        yield
    except IntegrityError as exc:
        if exc.digest is None:
            exc.digest = digest
        raise


class _Discard:
    """A sink that keeps nothing (a verification that only hashes)."""

    def write(self, chunk: bytes) -> int:
        return len(chunk)


class _HashingWriter:
    """A file-like sink that hashes what passes through it."""

    def __init__(self, fh: object) -> None:
        self._fh = fh
        self.sha = hashlib.sha256()
        self.size = 0

    def write(self, chunk: bytes) -> int:
        self.sha.update(chunk)
        self.size += len(chunk)
        return self._fh.write(chunk)  # type: ignore[attr-defined,no-any-return]
