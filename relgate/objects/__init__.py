"""Versioned object stores: a local embedded store and S3 (boto3), one contract."""

from relgate.objects.base import ObjectStore, ObjectVersion
from relgate.objects.cas import ContentStore
from relgate.objects.s3 import S3ObjectStore

__all__ = ["ContentStore", "ObjectStore", "ObjectVersion", "S3ObjectStore"]
