"""Versioned object stores (a local embedded store and S3, one contract), content-addressed
storage on top, and the one object-key layout (:mod:`relgate.objects.layout`)."""

from relgate.objects.cas import ContentStore
from relgate.objects.s3 import S3ObjectStore
from relgate.objects.versioned import ObjectStore, ObjectVersion

__all__ = ["ContentStore", "ObjectStore", "ObjectVersion", "S3ObjectStore"]
