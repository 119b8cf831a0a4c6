"""The object-store contract shared by the local store and S3.

Every write creates a new immutable version; nothing is overwritten in place.  ``create``
is a conditional create (S3 ``If-None-Match: *``, locally an atomic directory claim) that
fails when the key already has a live current version.  Reads always name an exact version.
"""

from __future__ import annotations

import abc
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from relgate.errors import IntegrityError

#: The check a read refuses under when the stored version is larger than the size its
#: signed document records (never read past that size + 1 byte, never parsed).
SIZE_MISMATCH = "size-mismatch"


def size_refusal(key: str, version_id: str, expected: int, actual: int) -> IntegrityError:
    """A stored version larger than the size its signed document records."""
    return IntegrityError(
        "stored object is larger than the size its signed document records; not read",
        object=f"{key}@{version_id}",
        check=SIZE_MISMATCH,
        details={"key": key, "version": version_id, "expected": expected, "actual": actual},
    )


class Writable(Protocol):
    """Where :meth:`ObjectStore.read_into` streams bytes."""

    def write(self, chunk: bytes, /) -> int: ...


@dataclass(frozen=True)
class ObjectVersion:
    key: str
    version_id: str
    size: int
    is_latest: bool = True


class ObjectStore(abc.ABC):
    """A versioned bucket.  Implementations must be safe across processes."""

    #: URI scheme-ish label used in manifests and error messages (``local`` or ``s3``).
    kind: str = "abstract"

    @abc.abstractmethod
    def put(self, key: str, data: bytes) -> ObjectVersion:
        """Write a new version of ``key`` (the previous versions stay readable)."""

    @abc.abstractmethod
    def create(self, key: str, data: bytes) -> ObjectVersion:
        """Conditional create: raise ObjectExistsError if ``key`` has a live current version."""

    def put_file(self, key: str, source: Path) -> ObjectVersion:
        """:meth:`put` of a file's bytes; stores that can stream override it (local, S3)
        so a large object is never held in memory."""
        return self.put(key, source.read_bytes())

    def create_file(self, key: str, source: Path) -> ObjectVersion:
        """:meth:`create` of a file's bytes (streamed where the store overrides it)."""
        return self.create(key, source.read_bytes())

    @abc.abstractmethod
    def get(self, key: str, version_id: str, *, max_size: int | None = None) -> bytes:
        """Read an exact version; NotFoundError if that version does not exist.

        With ``max_size`` (the size a signed document records) a larger version is refused
        (:func:`size_refusal`, check ``size-mismatch``) and no more than ``max_size + 1``
        bytes are ever read."""

    def read_into(
        self, key: str, version_id: str, sink: Writable, *, max_size: int | None = None
    ) -> int:
        """Stream an exact version into ``sink`` (bounded like :meth:`get`); its size."""
        data = self.get(key, version_id, max_size=max_size)
        sink.write(data)
        return len(data)

    @abc.abstractmethod
    def get_range(self, key: str, version_id: str, start: int, length: int) -> bytes:
        """Read ``length`` bytes at ``start`` of an exact version."""

    @abc.abstractmethod
    def head(self, key: str, version_id: str | None = None) -> ObjectVersion:
        """Describe an exact version, or the current one; NotFoundError if absent/deleted."""

    @abc.abstractmethod
    def list(self, prefix: str = "") -> Iterator[ObjectVersion]:
        """Current (live, non-deleted) versions of keys under ``prefix``, sorted by key."""

    @abc.abstractmethod
    def list_versions(self, prefix: str = "") -> Iterator[ObjectVersion]:
        """Every stored (non-purged) data version under ``prefix``, by key then age."""

    @abc.abstractmethod
    def delete(self, key: str) -> None:
        """Hide the current version behind a delete marker; old versions stay readable."""

    @abc.abstractmethod
    def delete_version(self, key: str, version_id: str) -> None:
        """Permanently remove one exact version (garbage collection only)."""

    def describe(self) -> str:
        return self.kind
