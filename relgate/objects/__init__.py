"""Versioned object stores: a local embedded store and S3 (boto3), one contract."""

from relgate.objects.base import ObjectStore, ObjectVersion
from relgate.objects.cas import ContentStore

__all__ = ["ContentStore", "ObjectStore", "ObjectVersion"]
