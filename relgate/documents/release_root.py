"""The ``training.shard.release.v1`` root manifest.

Binds a dataset snapshot to physical shards: one OCI-style descriptor per shard
(:class:`~relgate.documents.shard_descriptor.ShardDescriptor`), both fence watermarks, the record
schema, totals, the ``orderedMemberTupleRoot`` and the writer parameters (serializer,
sort seed, sharding function, compression, key version).  Its digest, the ``rootId``, is
what approvals, permits and runs name.

:class:`ReleaseRoot` is the typed contract the writer builds; its JSON is byte-for-byte
the document that is sealed and signed.  :class:`ReleaseManifest` is a sealed root, typed
like the snapshot manifest.  The verifier examines a signed but malformed root field by
field (that is one of its findings), so it reads the document itself
(:func:`load_document`): the one deliberate raw pass.
"""

from __future__ import annotations

import json
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
    "bound_fields",
    "envelope_key",
    "load",
    "load_document",
    "open_document",
    "open_envelope",
    "seal",
    "seal_document",
    "sign",
    "store_envelope",
    "wire_shards",
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


class ReleaseManifest(ReleaseRoot):
    """A sealed root as signed: ``root_id`` is its digest.

    Opening a stored root (:func:`open_envelope`, :func:`load`) parses it into this model
    and refuses (check ``schema``) a signed root that is malformed or does not survive the
    round trip through the model byte for byte.  The verifier's deliberate raw pass over a
    hostile root reads the signed document itself (:func:`open_document`,
    :func:`load_document`), field by field.
    """

    @property
    def digest(self) -> str:  # type: ignore[override]  # the id, not the model's digest()
        return self.root_id

    @property
    def snapshot(self) -> str:
        return self.dataset_snapshot

    @property
    def descriptors(self) -> tuple[ShardDescriptor, ...]:
        return self.shards

    @property
    def key_version(self) -> str | None:
        return self.writer.key_version

    def shard_format(self) -> ShardFormat:
        """The shard format the signed root declares, refused unless ``recordSchema`` is
        its digest."""
        fmt = ShardFormat(self.record_schema_document.records)
        if fmt.digest != self.record_schema or fmt.document != self.record_schema_document:
            raise RejectedError(
                "recordSchema is not the digest of the shard schema the root carries",
                object=f"release {self.digest}",
                check=RECORD_SCHEMA_CHECK,
                digest=self.record_schema,
                details={"actual": fmt.digest},
            )
        return fmt

    @classmethod
    def from_document(cls, document: JsonObject, *, subject: str = "release") -> ReleaseManifest:
        """The typed view of a sealed document; refused unless it reads back byte for byte."""
        digest = str(document.get("rootId"))
        try:
            manifest = cls.parse(document, what=f"release {digest}")
        except RejectedError as exc:
            raise RejectedError(exc.message, object=subject, check="schema", digest=digest) from exc
        if not manifest.root_id or manifest.document() != document:
            raise RejectedError(
                "the signed root does not survive the round trip through its model",
                object=subject,
                check="schema",
                digest=digest,
            )
        return manifest


def bound_fields(document: JsonObject) -> dict[str, JsonValue]:
    """The fields a ``releases`` row repeats, read from a sealed root's document as signed
    (raw on purpose: the gate binds a hostile document field by field; a missing or
    mistyped field raises KeyError, TypeError or ValueError)."""
    totals = document["totals"]
    if not isinstance(totals, dict):
        raise TypeError("totals is not an object")
    return {
        "digest": document["rootId"],
        "tombstone_watermark": _integer(document["tombstoneWatermark"]),
        "benchmark_fence": _integer(document["benchmarkFence"]),
        "snapshot_digest": document["datasetSnapshot"],
        "shard_count": _integer(totals["shards"]),
        "record_count": _integer(totals["records"]),
    }


def wire_shards(document: JsonObject) -> list[JsonObject]:
    """The shard descriptors of a root document as signed (wire objects; anything that is
    not an object is left out), for the readers that must not trust the model: garbage
    collection and propagation over a possibly hostile root."""
    shards = document.get("shards")
    return [d for d in shards if isinstance(d, dict)] if isinstance(shards, list) else []


def _integer(value: JsonValue) -> int:
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"{value!r} is not an integer")
    return int(value)


def seal(root: ReleaseRoot) -> ReleaseManifest:
    """Digest the typed root into ``rootId``."""
    return ReleaseManifest.from_document(seal_document(root.document()))


def seal_document(document: JsonObject) -> JsonObject:
    """Digest a raw root document into ``rootId`` as given: test forgeries and tools that
    re-sign an opened root (the writer seals a :class:`ReleaseRoot`)."""
    return _json_object(KIND.seal(dict(document)))


def sign(manifest: ReleaseManifest | JsonObject, key: SigningKey) -> JsonObject:
    document = manifest.document() if isinstance(manifest, ReleaseManifest) else manifest
    return _json_object(KIND.sign(dict(document), key))


def store_envelope(
    store: ObjectStore, manifest: ReleaseManifest | JsonObject, envelope: JsonObject
) -> str:
    digest = manifest.digest if isinstance(manifest, ReleaseManifest) else str(manifest["rootId"])
    return store.create(
        envelope_key(digest), json.dumps(envelope, sort_keys=True).encode()
    ).version_id


def open_document(
    envelope: bytes | JsonObject,
    trusted: TrustedKeys,
    *,
    expected: str | None = None,
    subject: str = "release",
) -> JsonObject:
    """The signed root document, verified (signature, digest, identity) but not typed."""
    return _json_object(KIND.open(envelope, trusted, expected=expected, subject=subject))


def open_envelope(
    envelope: bytes | JsonObject,
    trusted: TrustedKeys,
    *,
    expected: str | None = None,
    subject: str = "release",
) -> ReleaseManifest:
    document = open_document(envelope, trusted, expected=expected, subject=subject)
    return ReleaseManifest.from_document(document, subject=subject)


def load_document(
    store: ObjectStore, trusted: TrustedKeys, digest: str, version_id: str
) -> JsonObject:
    """The stored root document at an exact version, verified but not typed."""
    key = envelope_key(digest)
    return _json_object(KIND.load(store, trusted, key=key, digest=digest, version_id=version_id))


def load(store: ObjectStore, trusted: TrustedKeys, digest: str, version_id: str) -> ReleaseManifest:
    document = load_document(store, trusted, digest, version_id)
    return ReleaseManifest.from_document(document, subject=envelope_key(digest))


def _json_object(value: JsonValue | dict[str, Any]) -> JsonObject:
    if not isinstance(value, dict):
        raise RejectedError("a release root is a JSON object", object="release", check="schema")
    return value
