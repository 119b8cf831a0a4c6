"""The ``training.shard.release.v1`` root manifest.

Binds a dataset snapshot to physical shards: one OCI-style descriptor per shard
(:class:`~relgate.documents.shard_descriptor.ShardDescriptor`), both fence watermarks, the record
schema, totals, the ``orderedMemberTupleRoot`` and the writer parameters (serializer,
sort seed, sharding function, compression, key version).  Its digest, the ``rootId``, is
what approvals, permits and runs name.

:class:`ReleaseRoot` is the typed contract the writer builds and readers use; its JSON is
byte-for-byte the document that is sealed and signed.  :class:`ReleaseManifest` is a
signed root *as signed*: the verifier examines a signed but malformed root field by
field (that is one of its findings), so the document is kept beside its typed view.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from pydantic import Field, SerializerFunctionWrapHandler, model_serializer

from relgate.documents.kind import DocumentKind
from relgate.documents.shard_descriptor import (
    DESCRIPTOR_FIELDS,
    ENCRYPTED_SHARD_MEDIA_TYPE,
    SHARD_MEDIA_TYPE,
    ShardDescriptor,
)
from relgate.documents.shard_format import ShardFormat, ShardSchema
from relgate.errors import RejectedError
from relgate.integrity.contract import Contract, JsonObject, JsonValue
from relgate.integrity.signing import SigningKey, TrustedKeys
from relgate.objects.layout import RELEASE_MANIFEST_PREFIX, release_manifest_key
from relgate.objects.versioned import ObjectStore
from relgate.records.record_schema import CHECK as RECORD_SCHEMA_CHECK

__all__ = [
    "DESCRIPTOR_FIELDS",
    "ENCRYPTED_SHARD_MEDIA_TYPE",
    "KIND",
    "MANIFEST_PREFIX",
    "PAYLOAD_TYPE",
    "REQUIRED_FIELDS",
    "SCHEMA",
    "SHARD_MEDIA_TYPE",
    "Encryption",
    "ReleaseManifest",
    "ReleaseRoot",
    "ReleaseTotals",
    "Serializer",
    "ShardDescriptor",
    "ShardingFunction",
    "WriterParams",
    "envelope_key",
    "load",
    "open_envelope",
    "seal",
    "sign",
    "store_envelope",
]

SCHEMA = "training.shard.release.v1"
PAYLOAD_TYPE = "application/vnd.relgate.shard-release.v1+json"
MANIFEST_PREFIX = RELEASE_MANIFEST_PREFIX

REQUIRED_FIELDS = (
    "schema",
    "datasetSnapshot",
    "tombstoneWatermark",
    "benchmarkFence",
    "recordSchema",
    "recordSchemaDocument",
    "shards",
    "totals",
    "orderedMemberTupleRoot",
    "writer",
)

KIND = DocumentKind(SCHEMA, PAYLOAD_TYPE, "rootId", REQUIRED_FIELDS)


class ReleaseTotals(Contract):
    shards: int
    records: int
    tokens: int
    bytes: int


class Serializer(Contract):
    format: str
    library: str
    version: str
    stream: str


class ShardingFunction(Contract):
    """By record count (``recordsPerShard``) or by bytes (``recordBytes``, ``targetBytes``);
    the fields of the other variant are absent, not null."""

    name: str
    rule: str
    records_per_shard: int | None = None
    record_bytes: str | None = None
    target_bytes: int | None = None

    @model_serializer(mode="wrap")
    def _absent_not_null(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        out: dict[str, Any] = handler(self)
        return {k: v for k, v in out.items() if v is not None}


class Compression(Contract):
    codec: str
    level: int | None
    row_group_records: int
    dictionary_columns: tuple[str, ...]
    statistics: bool
    page_index: bool


class Encryption(Contract):
    algorithm: str
    aad: str
    nonce: str


class WriterParams(Contract):
    serializer: Serializer
    sort_seed: str
    sort_key: str
    sharding_function: ShardingFunction
    compression: Compression
    key_version: str | None
    encryption: Encryption | None


class ReleaseRoot(Contract):
    """The typed root; ``root_id`` is empty until :func:`seal` computes it."""

    schema_name: str = Field(default=SCHEMA, alias="schema")
    dataset_snapshot: str
    tombstone_watermark: int
    benchmark_fence: int
    record_schema: str
    record_schema_document: ShardSchema
    member_schema: str
    shards: tuple[ShardDescriptor, ...]
    totals: ReleaseTotals
    ordered_member_tuple_root: str
    writer: WriterParams
    root_id: str = ""

    def document(self) -> JsonObject:
        """The JSON that is sealed and signed (``rootId`` only once sealed)."""
        body: JsonObject = self.to_json()
        if not self.root_id:
            del body["rootId"]
        return body


def envelope_key(digest: str) -> str:
    return release_manifest_key(digest)


@dataclass(frozen=True)
class ReleaseManifest:
    """A sealed root as signed: ``body`` is the document, :attr:`root` its typed view."""

    body: JsonObject

    @property
    def digest(self) -> str:
        return str(self.body["rootId"])

    @property
    def shards(self) -> list[JsonObject]:
        """The descriptors as signed (wire objects); :attr:`descriptors` types them."""
        shards = self.body["shards"]
        return [d for d in shards if isinstance(d, dict)] if isinstance(shards, list) else []

    @property
    def snapshot(self) -> str:
        return str(self.body["datasetSnapshot"])

    @property
    def root(self) -> ReleaseRoot:
        """The typed root; a signed but malformed root is refused (check ``schema``)."""
        return ReleaseRoot.parse(self.body, what=f"release {self.body.get('rootId')}")

    @property
    def descriptors(self) -> tuple[ShardDescriptor, ...]:
        return self.root.shards

    def shard_format(self) -> ShardFormat:
        """The shard format the signed root declares, refused unless ``recordSchema`` is
        its digest."""
        root = self.root
        fmt = ShardFormat(root.record_schema_document.records)
        if fmt.digest != root.record_schema or fmt.document != root.record_schema_document:
            raise RejectedError(
                "recordSchema is not the digest of the shard schema the root carries",
                object=f"release {self.digest}",
                check=RECORD_SCHEMA_CHECK,
                digest=root.record_schema,
                details={"actual": fmt.digest},
            )
        return fmt

    @property
    def key_version(self) -> str | None:
        writer = self.body.get("writer")
        value = writer.get("keyVersion") if isinstance(writer, dict) else None
        return value if isinstance(value, str) else None


def seal(root: ReleaseRoot | JsonObject) -> ReleaseManifest:
    """Digest the root into ``rootId``.  A raw document is sealed as given (test forgeries
    and tools re-signing an opened root); the writer seals a :class:`ReleaseRoot`."""
    body = root.document() if isinstance(root, ReleaseRoot) else root
    return ReleaseManifest(_json_object(KIND.seal(dict(body))))


def sign(manifest: ReleaseManifest, key: SigningKey) -> JsonObject:
    return _json_object(KIND.sign(dict(manifest.body), key))


def store_envelope(store: ObjectStore, manifest: ReleaseManifest, envelope: JsonObject) -> str:
    return store.create(
        envelope_key(manifest.digest), json.dumps(envelope, sort_keys=True).encode()
    ).version_id


def open_envelope(
    envelope: bytes | JsonObject,
    trusted: TrustedKeys,
    *,
    expected: str | None = None,
    subject: str = "release",
) -> ReleaseManifest:
    return ReleaseManifest(
        _json_object(KIND.open(envelope, trusted, expected=expected, subject=subject))
    )


def load(store: ObjectStore, trusted: TrustedKeys, digest: str, version_id: str) -> ReleaseManifest:
    return ReleaseManifest(
        _json_object(
            KIND.load(
                store, trusted, key=envelope_key(digest), digest=digest, version_id=version_id
            )
        )
    )


def _json_object(value: JsonValue | dict[str, Any]) -> JsonObject:
    if not isinstance(value, dict):
        raise RejectedError("a release root is a JSON object", object="release", check="schema")
    return value
