"""The production object store: S3 (or an S3-compatible service) through boto3.

The bucket must have versioning ``Enabled``: every ``put`` then adds a new immutable
version, reads pin a ``VersionId``, ``delete`` only adds a delete marker, and
``delete_version`` is the single operation that removes bytes.  ``create`` is a
conditional write (``If-None-Match: *``), which S3 evaluates against the current version
atomically, so of several concurrent creators exactly one gets a 200 and the others a
412 (or a 409 ``ConditionalRequestConflict`` while another write is in flight).

Transient failures are retried by botocore's ``standard`` retry mode, never by hand.  A
retried ``create`` whose first attempt was applied but whose response was lost surfaces
as ObjectExistsError: callers that need to tell "I won" from "someone else won" compare
bytes, as the content-addressed layer does.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, BinaryIO

import boto3
from botocore.config import Config
from botocore.exceptions import ClientError

from relgate.errors import (
    NotFoundError,
    ObjectExistsError,
    RejectedError,
    RelgateError,
    UsageError,
)
from relgate.objects.versioned import ObjectStore, ObjectVersion, Writable, size_refusal

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client
    from mypy_boto3_s3.type_defs import ObjectIdentifierTypeDef, PaginatorConfigTypeDef

# Error codes S3 (and moto) return for "this key or version is not there".  HEAD has no
# body, so its errors arrive as bare status codes.  405 is what S3 answers when the
# named version is a delete marker.
_NOT_FOUND_CODES = frozenset(
    {"NoSuchKey", "NoSuchVersion", "NotFound", "404", "MethodNotAllowed", "405"}
)
# A malformed version id is a 400; with a version id in the request it means "no such
# version", not a usage error of ours.
_BAD_VERSION_CODES = frozenset({"InvalidArgument", "InvalidVersionId", "400"})
_CONDITIONAL_CREATE_LOST = frozenset({"PreconditionFailed", "412", "ConditionalRequestConflict"})
_MAX_KEY_BYTES = 1024
_READ_CHUNK = 1 << 20  # read_into streams an object in reads of this size


def _error_code(exc: ClientError) -> str:
    return str(exc.response.get("Error", {}).get("Code", ""))


def _status(exc: ClientError) -> int:
    return int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0))


def default_client_config() -> Config:
    """botocore's standard retry mode: bounded, jittered, only on retryable errors."""
    return Config(retries={"mode": "standard", "max_attempts": 5})


HTTP_NOT_FOUND = 404
HTTP_RANGE_NOT_SATISFIABLE = 416


class S3ObjectStore(ObjectStore):
    kind = "s3"

    def __init__(  # noqa: PLR0913 keyword-only options mirroring boto3's client arguments
        self,
        bucket: str,
        *,
        prefix: str = "",
        endpoint_url: str | None = None,
        region: str | None = None,
        aws_access_key_id: str | None = None,
        aws_secret_access_key: str | None = None,
        aws_session_token: str | None = None,
        client: S3Client | None = None,
        config: Config | None = None,
        verify_versioning: bool = True,
        list_page_size: int | None = None,
    ) -> None:
        if not bucket:
            raise UsageError("bucket name is required", object="s3", check="bucket-name")
        if prefix and not prefix.endswith("/"):
            prefix += "/"
        self.bucket = bucket
        self.prefix = prefix
        # With a ready client, record where it points, so describe() and anyone opening
        # the same store elsewhere see the real endpoint.
        self.endpoint_url = endpoint_url or (client.meta.endpoint_url if client else None)
        self.region = region or (client.meta.region_name if client else None)
        self._verify_versioning = verify_versioning
        self._pagination: PaginatorConfigTypeDef = (
            {"PageSize": list_page_size} if list_page_size else {}
        )
        self._versioning_checked = False
        if client is None:
            session = boto3.session.Session(
                aws_access_key_id=aws_access_key_id,
                aws_secret_access_key=aws_secret_access_key,
                aws_session_token=aws_session_token,
                region_name=region,
            )
            merged = default_client_config()
            if config is not None:
                merged = merged.merge(config)
            client = session.client("s3", endpoint_url=endpoint_url, config=merged)
        self.client: S3Client = client

    def describe(self) -> str:
        return f"s3://{self.bucket}/{self.prefix}"

    # -- bucket --------------------------------------------------------------------------
    def ensure_bucket(self) -> None:
        """Create the bucket with versioning Enabled if missing; refuse one without it.

        An existing bucket whose versioning is off or Suspended is refused rather than
        switched on: someone chose that, and overwrites there would destroy bytes.
        """
        try:
            self.client.head_bucket(Bucket=self.bucket)
        except ClientError as exc:
            if _error_code(exc) not in ("404", "NoSuchBucket", "NotFound"):
                raise
            self._create_bucket()
        self._check_versioning(force=True)

    def _create_bucket(self) -> None:
        region = self.client.meta.region_name
        kwargs: dict[str, Any] = {"Bucket": self.bucket}
        if region and region != "us-east-1":
            kwargs["CreateBucketConfiguration"] = {"LocationConstraint": region}
        try:
            self.client.create_bucket(**kwargs)
        except ClientError as exc:
            # A concurrent ensure_bucket got there first: versioning is checked below.
            if _error_code(exc) not in ("BucketAlreadyOwnedByYou",):
                raise
            return
        self.client.put_bucket_versioning(
            Bucket=self.bucket, VersioningConfiguration={"Status": "Enabled"}
        )

    def _check_versioning(self, *, force: bool = False) -> None:
        if self._versioning_checked or (not force and not self._verify_versioning):
            return
        with self._s3_errors():
            status = self.client.get_bucket_versioning(Bucket=self.bucket).get("Status")
        if status != "Enabled":
            raise RejectedError(
                f"bucket versioning is {status or 'not enabled'}; relgate needs Enabled",
                object=f"s3://{self.bucket}",
                check="bucket-versioning",
            )
        self._versioning_checked = True

    # -- keys ----------------------------------------------------------------------------
    def _s3_key(self, key: str) -> str:
        # The same key syntax as the local store, so a key valid in one is valid in both.
        if not key or key.startswith("/") or "\x00" in key:
            raise UsageError("invalid object key", object=repr(key), check="key-syntax")
        full = self.prefix + key
        if len(full.encode("utf-8")) > _MAX_KEY_BYTES:
            raise UsageError("object key too long", object=repr(key), check="key-syntax")
        return full

    def _user_key(self, s3_key: str) -> str:
        return s3_key[len(self.prefix) :]

    @staticmethod
    def _not_found(key: str, version_id: str | None) -> NotFoundError:
        if version_id is None:
            return NotFoundError("no current version", object=key, check="exists")
        return NotFoundError("no such object version", object=f"{key}@{version_id}", check="exists")

    def _is_not_found(self, exc: ClientError, version_id: str | None) -> bool:
        code = _error_code(exc)
        if code in _NOT_FOUND_CODES or _status(exc) == HTTP_NOT_FOUND:
            return True
        return version_id is not None and code in _BAD_VERSION_CODES

    def _translate(self, exc: ClientError, key: str | None, version_id: str | None) -> RelgateError:
        """One RelgateError per S3 failure, naming the bucket, key and version involved."""
        code = _error_code(exc)
        if code == "NoSuchBucket":
            return NotFoundError(
                "bucket does not exist", object=f"s3://{self.bucket}", check="bucket-exists"
            )
        if key is not None and self._is_not_found(exc, version_id):
            return self._not_found(key, version_id)
        where = f"s3://{self.bucket}/{self.prefix}{key or ''}"
        if version_id is not None:
            where += f"@{version_id}"
        return RelgateError(
            "S3 request failed",
            object=where,
            check="s3-request",
            details={"s3_error": code, "status": _status(exc)},
        )

    @contextlib.contextmanager
    def _s3_errors(self, key: str | None = None, version_id: str | None = None) -> Iterator[None]:
        try:
            yield
        except ClientError as exc:
            raise self._translate(exc, key, version_id) from exc

    # -- writes --------------------------------------------------------------------------
    def _version_of(self, key: str, response: Any, size: int) -> ObjectVersion:
        version_id = response.get("VersionId")
        if not version_id or version_id == "null":
            raise RejectedError(
                "write returned no version id; bucket versioning is not Enabled",
                object=f"s3://{self.bucket}/{self.prefix}{key}",
                check="bucket-versioning",
            )
        return ObjectVersion(key=key, version_id=version_id, size=size)

    def put(self, key: str, data: bytes) -> ObjectVersion:
        s3_key = self._s3_key(key)
        self._check_versioning()
        with self._s3_errors(key):
            response = self.client.put_object(Bucket=self.bucket, Key=s3_key, Body=data)
        return self._version_of(key, response, len(data))

    def put_file(self, key: str, source: Path) -> ObjectVersion:
        """One PUT streamed from the open file (botocore reads it in chunks)."""
        s3_key = self._s3_key(key)
        self._check_versioning()
        with open(source, "rb") as body, self._s3_errors(key):
            size = os.fstat(body.fileno()).st_size
            response = self.client.put_object(Bucket=self.bucket, Key=s3_key, Body=body)
        return self._version_of(key, response, size)

    def create(self, key: str, data: bytes) -> ObjectVersion:
        return self._create(key, data, len(data))

    def create_file(self, key: str, source: Path) -> ObjectVersion:
        with open(source, "rb") as body:
            return self._create(key, body, os.fstat(body.fileno()).st_size)

    def _create(self, key: str, body: bytes | BinaryIO, size: int) -> ObjectVersion:
        s3_key = self._s3_key(key)
        self._check_versioning()
        try:
            response = self.client.put_object(
                Bucket=self.bucket, Key=s3_key, Body=body, IfNoneMatch="*"
            )
        except ClientError as exc:
            if _error_code(exc) in _CONDITIONAL_CREATE_LOST or _status(exc) in (409, 412):
                raise ObjectExistsError(
                    "object already exists",
                    object=key,
                    check="conditional-create",
                    details={"s3_error": _error_code(exc)},
                ) from None
            raise self._translate(exc, key, None) from exc
        return self._version_of(key, response, size)

    def delete(self, key: str) -> None:
        s3_key = self._s3_key(key)
        self._check_versioning()
        # On a versioned bucket this only adds a delete marker; no bytes are removed.
        with self._s3_errors(key):
            self.client.delete_object(Bucket=self.bucket, Key=s3_key)

    def delete_version(self, key: str, version_id: str) -> None:
        s3_key = self._s3_key(key)
        self._check_versioning()
        # S3 answers 204 for a version that does not exist; the contract says NotFoundError,
        # and a delete marker's id is not a data version either (HEAD on it is a 405).
        self._head(key, s3_key, version_id)
        with self._s3_errors(key, version_id):
            self.client.delete_object(Bucket=self.bucket, Key=s3_key, VersionId=version_id)

    # -- reads ---------------------------------------------------------------------------
    def get(self, key: str, version_id: str, *, max_size: int | None = None) -> bytes:
        s3_key = self._s3_key(key)
        with self._s3_errors(key, version_id):
            response = self.client.get_object(Bucket=self.bucket, Key=s3_key, VersionId=version_id)
            body = response["Body"]
            if max_size is None:
                return body.read()
            length = int(response.get("ContentLength", 0))
            if length > max_size:  # refused from the response headers, body left unread
                body.close()
                raise size_refusal(key, version_id, max_size, length)
            data = body.read(max_size + 1)
            body.close()
        if len(data) > max_size:
            raise size_refusal(key, version_id, max_size, len(data))
        return data

    def read_into(
        self, key: str, version_id: str, sink: Writable, *, max_size: int | None = None
    ) -> int:
        """Stream an exact version into ``sink`` in 1 MiB reads (never the whole object in
        memory); with ``max_size`` a larger one is refused from its headers, and no more
        than ``max_size + 1`` bytes are read whatever the headers said."""
        s3_key = self._s3_key(key)
        total = 0
        with self._s3_errors(key, version_id):
            response = self.client.get_object(Bucket=self.bucket, Key=s3_key, VersionId=version_id)
            body = response["Body"]
            try:
                length = int(response.get("ContentLength", 0))
                if max_size is not None and length > max_size:
                    raise size_refusal(key, version_id, max_size, length)
                limit = None if max_size is None else max_size + 1
                while limit is None or total < limit:
                    chunk = body.read(
                        _READ_CHUNK if limit is None else min(_READ_CHUNK, limit - total)
                    )
                    if not chunk:
                        break
                    total += len(chunk)
                    if max_size is not None and total > max_size:
                        raise size_refusal(key, version_id, max_size, total)
                    sink.write(chunk)
            finally:
                body.close()
        return total

    def get_range(self, key: str, version_id: str, start: int, length: int) -> bytes:
        if start < 0 or length < 0:
            raise UsageError(
                "range start and length must be non-negative",
                object=f"{key}@{version_id}",
                check="range",
            )
        s3_key = self._s3_key(key)
        if length == 0:
            self._head(key, s3_key, version_id)
            return b""
        try:
            response = self.client.get_object(
                Bucket=self.bucket,
                Key=s3_key,
                VersionId=version_id,
                Range=f"bytes={start}-{start + length - 1}",
            )
        except ClientError as exc:
            if _error_code(exc) == "InvalidRange" or _status(exc) == HTTP_RANGE_NOT_SATISFIABLE:
                # Past the end of an existing version: like a file read, no bytes.
                return b""
            raise self._translate(exc, key, version_id) from exc
        with self._s3_errors(key, version_id):
            return response["Body"].read()

    def _head(self, key: str, s3_key: str, version_id: str | None) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"Bucket": self.bucket, "Key": s3_key}
        if version_id is not None:
            kwargs["VersionId"] = version_id
        with self._s3_errors(key, version_id):
            response: dict[str, Any] = dict(self.client.head_object(**kwargs))
        if response.get("DeleteMarker"):
            raise self._not_found(key, version_id)
        return response

    def head(self, key: str, version_id: str | None = None) -> ObjectVersion:
        s3_key = self._s3_key(key)
        response = self._head(key, s3_key, version_id)
        actual_id = str(response.get("VersionId") or version_id or "null")
        if version_id is None:
            is_latest = True
        else:
            try:
                current = self._head(key, s3_key, None)
                is_latest = current.get("VersionId") == version_id
            except NotFoundError:
                is_latest = False
        return ObjectVersion(
            key=key,
            version_id=actual_id,
            size=int(response.get("ContentLength", 0)),
            is_latest=is_latest,
        )

    def _versions_by_key(self, prefix: str) -> Iterator[tuple[str, list[dict[str, Any]]]]:
        """(s3 key, data versions oldest first) per key, keys in S3's (code point) order.

        ListObjectVersions returns keys in order and each key's versions newest first,
        possibly split across pages, so versions are buffered per key.
        """
        paginator = self.client.get_paginator("list_object_versions")
        current_key: str | None = None
        buffered: list[dict[str, Any]] = []
        pages = paginator.paginate(
            Bucket=self.bucket, Prefix=self.prefix + prefix, PaginationConfig=self._pagination
        )
        for page in self._pages(pages):
            for version in page.get("Versions", []):
                s3_key = version["Key"]
                if s3_key != current_key:
                    if current_key is not None:
                        yield current_key, buffered[::-1]
                    current_key, buffered = s3_key, []
                buffered.append(dict(version))
        if current_key is not None:
            yield current_key, buffered[::-1]

    def _pages(self, pages: Iterable[Any]) -> Iterator[Any]:
        iterator = iter(pages)
        while True:
            with self._s3_errors():
                page = next(iterator, None)
            if page is None:
                return
            yield page

    def list(self, prefix: str = "") -> Iterator[ObjectVersion]:
        for s3_key, versions in self._versions_by_key(prefix):
            # IsLatest is false on every data version when a delete marker is current.
            for version in versions:
                if version.get("IsLatest"):
                    yield ObjectVersion(
                        key=self._user_key(s3_key),
                        version_id=str(version["VersionId"]),
                        size=int(version.get("Size", 0)),
                        is_latest=True,
                    )

    def list_versions(self, prefix: str = "") -> Iterator[ObjectVersion]:
        for s3_key, versions in self._versions_by_key(prefix):
            for version in versions:
                yield ObjectVersion(
                    key=self._user_key(s3_key),
                    version_id=str(version["VersionId"]),
                    size=int(version.get("Size", 0)),
                    is_latest=bool(version.get("IsLatest")),
                )

    # -- housekeeping --------------------------------------------------------------------
    def destroy_bucket(self) -> None:
        """Remove every version, every delete marker and the bucket (tests, never prod)."""
        paginator = self.client.get_paginator("list_object_versions")
        for page in paginator.paginate(Bucket=self.bucket):
            doomed: list[ObjectIdentifierTypeDef] = [
                {"Key": v["Key"], "VersionId": v["VersionId"]}
                for v in [*page.get("Versions", []), *page.get("DeleteMarkers", [])]
            ]
            if doomed:
                self.client.delete_objects(Bucket=self.bucket, Delete={"Objects": doomed})
        self.client.delete_bucket(Bucket=self.bucket)
