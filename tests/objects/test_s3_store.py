"""S3-specific behaviour beyond the shared contract: bucket checks, prefixes, raw S3."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import boto3
import pytest
from botocore.exceptions import ClientError

from relgate.errors import NotFoundError, ObjectExistsError, RejectedError
from relgate.objects.s3 import S3ObjectStore

pytestmark = pytest.mark.s3


def _bucket_name() -> str:
    return f"relgate-t-{uuid.uuid4().hex[:24]}"


@pytest.fixture
def versioned(moto_s3_endpoint: str) -> Iterator[S3ObjectStore]:
    store = S3ObjectStore(_bucket_name(), endpoint_url=moto_s3_endpoint)
    store.ensure_bucket()
    try:
        yield store
    finally:
        store.destroy_bucket()


def test_moto_honours_if_none_match_on_put(versioned: S3ObjectStore) -> None:
    """The raw S3 behaviour create() relies on, straight through boto3 to moto's server."""
    client = versioned.client
    client.put_object(Bucket=versioned.bucket, Key="raw", Body=b"1", IfNoneMatch="*")
    with pytest.raises(ClientError) as info:
        client.put_object(Bucket=versioned.bucket, Key="raw", Body=b"2", IfNoneMatch="*")
    assert info.value.response["ResponseMetadata"]["HTTPStatusCode"] == 412
    assert info.value.response["Error"]["Code"] == "PreconditionFailed"
    versions = client.list_object_versions(Bucket=versioned.bucket, Prefix="raw")
    assert len(versions["Versions"]) == 1


def test_ensure_bucket_creates_a_versioned_bucket_once(moto_s3_endpoint: str) -> None:
    store = S3ObjectStore(_bucket_name(), endpoint_url=moto_s3_endpoint)
    store.ensure_bucket()
    store.ensure_bucket()  # idempotent
    try:
        status = store.client.get_bucket_versioning(Bucket=store.bucket)["Status"]
        assert status == "Enabled"
    finally:
        store.destroy_bucket()


@pytest.mark.parametrize("suspend", [False, True])
def test_refuses_a_bucket_without_versioning(moto_s3_endpoint: str, suspend: bool) -> None:
    name = _bucket_name()
    client = boto3.client("s3", endpoint_url=moto_s3_endpoint)
    client.create_bucket(Bucket=name)
    if suspend:
        client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Enabled"})
        client.put_bucket_versioning(Bucket=name, VersioningConfiguration={"Status": "Suspended"})
    try:
        for attempt in (
            lambda: S3ObjectStore(name, endpoint_url=moto_s3_endpoint).ensure_bucket(),
            lambda: S3ObjectStore(name, endpoint_url=moto_s3_endpoint).put("k", b"x"),
            lambda: S3ObjectStore(name, endpoint_url=moto_s3_endpoint).create("k", b"x"),
        ):
            with pytest.raises(RejectedError) as info:
                attempt()
            assert info.value.check == "bucket-versioning"
            assert name in str(info.value.object)
            assert info.value.exit_code == 3
        # Nothing was written to the refused bucket.
        assert client.list_objects_v2(Bucket=name).get("KeyCount", 0) == 0
    finally:
        client.delete_bucket(Bucket=name)


def test_prefixes_isolate_stores_sharing_a_bucket(versioned: S3ObjectStore) -> None:
    a = S3ObjectStore(versioned.bucket, prefix="tenant-a", endpoint_url=versioned.endpoint_url)
    b = S3ObjectStore(versioned.bucket, prefix="tenant-b/", endpoint_url=versioned.endpoint_url)
    va = a.create("k", b"a")
    b.create("k", b"b")  # same key, other prefix: no conflict
    with pytest.raises(ObjectExistsError):
        a.create("k", b"again")
    assert [(v.key, v.version_id) for v in a.list()] == [("k", va.version_id)]
    assert [v.key for v in b.list_versions()] == ["k"]
    raw = versioned.client.list_objects_v2(Bucket=versioned.bucket)["Contents"]
    assert sorted(o["Key"] for o in raw) == ["tenant-a/k", "tenant-b/k"]


def test_accepts_an_existing_client(versioned: S3ObjectStore) -> None:
    store = S3ObjectStore(versioned.bucket, client=versioned.client)
    v = store.put("k", b"x")
    assert versioned.get("k", v.version_id) == b"x"


def test_list_spans_pages(versioned: S3ObjectStore) -> None:
    """ListObjectVersions pages (1000 entries) split a key's versions; order survives."""
    ids = [versioned.put("many", str(i).encode()).version_id for i in range(5)]
    versioned.put("other", b"o")
    paginated = S3ObjectStore(versioned.bucket, client=versioned.client, list_page_size=2)
    assert [v.version_id for v in paginated.list_versions("many")] == ids
    current = [(v.key, v.version_id) for v in paginated.list()]
    assert current == [("many", ids[-1]), ("other", current[1][1])]


def test_a_missing_bucket_is_named(moto_s3_endpoint: str) -> None:
    store = S3ObjectStore(_bucket_name(), endpoint_url=moto_s3_endpoint)
    for attempt in (
        lambda: store.put("k", b"x"),
        lambda: store.get("k", "some-version"),
        lambda: list(store.list()),
    ):
        with pytest.raises(NotFoundError) as info:
            attempt()
        assert info.value.object == f"s3://{store.bucket}"
        assert info.value.check == "bucket-exists"
