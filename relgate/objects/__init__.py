"""Versioned object stores (a local embedded store and S3, one contract), content-addressed
storage on top, and the one object-key layout (:mod:`relgate.objects.layout`).

``S3ObjectStore`` is resolved on first use: importing boto3 costs ~0.1 s, which a process
on the embedded store (every CLI call of the demo) should not pay."""

from typing import TYPE_CHECKING, Any

from relgate.objects.cas import ContentStore
from relgate.objects.versioned import ObjectStore, ObjectVersion

if TYPE_CHECKING:
    from relgate.objects.s3 import S3ObjectStore


def __getattr__(name: str) -> Any:
    if name == "S3ObjectStore":
        from relgate.objects.s3 import S3ObjectStore  # noqa: PLC0415 - see the docstring

        return S3ObjectStore
    raise AttributeError(name)


__all__ = ["ContentStore", "ObjectStore", "ObjectVersion", "S3ObjectStore"]
