"""Versioned object stores: a local embedded store and S3 (boto3), one contract."""

from relgate.objects.cas import ContentStore
from relgate.objects.s3 import S3ObjectStore
from relgate.objects.versioned import ObjectStore, ObjectVersion

__all__ = ["ContentStore", "ObjectStore", "ObjectVersion", "S3ObjectStore"]
