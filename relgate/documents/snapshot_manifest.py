"""The ``training.dataset.snapshot.v1`` manifest, its signature and its storage.

The manifest enumerates facts: pinned source versions, both fence watermarks, record
schema, policies by digest (and their full text, so replay needs nothing else), the
transform by its pinned artifact's digest (and its typed pin), the membership table by
content address and tuple root, and PROV-style lineage whose edges are digests.  Its
digest (the ``snapshotId``) is SHA-256 over the RFC 8785 form without ``snapshotId``,
``signatures`` or transport fields.

:class:`SnapshotBody` is the manifest before sealing and :class:`SnapshotManifest` the
sealed one; both are :class:`~relgate.integrity.contract.Contract` models whose JSON is
exactly the signed payload (an optional field that is absent stays absent).  A verified
payload that does not survive the round trip through the model byte for byte is refused.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any, Final, Literal, Self

from pydantic import Field, StrictInt, StrictStr, model_validator

from relgate.documents.kind import DocumentKind
from relgate.documents.policy import Selection, SplitPolicy
from relgate.documents.source_pins import SourceEntry
from relgate.documents.transform_spec import TransformSpec
from relgate.errors import RejectedError
from relgate.integrity.contract import Contract, JsonObject, JsonValue
from relgate.integrity.signing import SigningKey, TrustedKeys
from relgate.integrity.statement import SpelledDigest
from relgate.objects.cas import ContentRef, digest_of_uri
from relgate.objects.layout import SNAPSHOT_MANIFEST_PREFIX, snapshot_envelope_key
from relgate.objects.versioned import ObjectStore
from relgate.records.record_schema import CHECK as RECORD_SCHEMA_CHECK
from relgate.records.record_schema import RecordSchema

SCHEMA: Final = "training.dataset.snapshot.v1"
PAYLOAD_TYPE = "application/vnd.relgate.dataset-snapshot.v1+json"
#: Re-exported: the one spelling is :data:`relgate.objects.layout.SNAPSHOT_MANIFEST_PREFIX`.
MANIFEST_PREFIX = SNAPSHOT_MANIFEST_PREFIX
MEMBERS_MEDIA_TYPE = "application/vnd.apache.parquet"

REQUIRED_FIELDS = (
    "schema",
    "parents",
    "sources",
    "tombstoneWatermark",
    "benchmarkFence",
    "recordSchema",
    "recordSchemaDocument",
    "selectionPolicy",
    "transformImage",
    "members",
    "splitPolicy",
    "purpose",
    "splits",
    "policies",
    "provenance",
)


def envelope_key(digest: str) -> str:
    """Where the signed envelope of a snapshot manifest is stored."""
    return snapshot_envelope_key(digest)


class MembersRef(Contract):
    """The membership table: its content address, exact version, size and tuple root."""

    uri: StrictStr
    object_version: StrictStr
    size: StrictInt
    count: StrictInt
    tuple_root: StrictStr
    media_type: StrictStr

    @property
    def content_ref(self) -> ContentRef:
        return ContentRef(digest_of_uri(self.uri), self.object_version, self.size)


class ArtifactRef(Contract):
    """A content-addressed object a snapshot needs besides its membership (a tokenizer, a
    transform's wheel or image): held as long as the snapshot is."""

    role: StrictStr
    uri: StrictStr
    object_version: StrictStr
    size: StrictInt

    @property
    def digest(self) -> str:  # type: ignore[override]  # an artifact's digest is its address
        return digest_of_uri(self.uri)

    @property
    def content_ref(self) -> ContentRef:
        return ContentRef(digest_of_uri(self.uri), self.object_version, self.size)


class StatisticsRef(Contract):
    """The snapshot's statistics document (:mod:`relgate.snapshot.statistics`)."""

    uri: StrictStr
    object_version: StrictStr
    size: StrictInt

    @property
    def content_ref(self) -> ContentRef:
        return ContentRef(digest_of_uri(self.uri), self.object_version, self.size)


class EmbeddedPolicies(Contract):
    """The full text of the policies the manifest names by digest."""

    selection: Selection
    split: SplitPolicy


class Derivation(Contract):
    """``prov:wasDerivedFrom``: a pinned source (the digest of its canonical manifest
    entry, which carries its snapshot id, pin list or metadata-file digest) or a parent
    snapshot (its snapshotId)."""

    #: an immutable digest, never a source id, table name or tag
    entity: SpelledDigest
    kind: StrictStr


class Generation(Contract):
    """``prov:wasGeneratedBy``: the build activity."""

    activity: StrictStr
    build_id: StrictStr
    transform: StrictStr
    started_at_time: StrictStr
    ended_at_time: StrictStr


class Association(Contract):
    """``prov:wasAssociatedWith``: who built it, with what, signed by which key."""

    agent: StrictStr
    builder: StrictStr
    keyid: StrictStr


class Provenance(Contract):
    was_derived_from: tuple[Derivation, ...]
    was_generated_by: Generation
    was_associated_with: Association


class SnapshotBody(Contract):
    """A snapshot manifest before sealing (no ``snapshotId`` yet)."""

    schema_name: Literal["training.dataset.snapshot.v1"] = Field(default=SCHEMA, alias="schema")
    parents: tuple[StrictStr, ...]
    sources: tuple[SourceEntry, ...]
    tombstone_watermark: StrictInt
    benchmark_fence: StrictInt
    record_schema: StrictStr
    record_schema_document: RecordSchema
    selection_policy: StrictStr
    #: ``repository/name@sha256:...``: the one-line display of :attr:`transform`.
    transform_image: StrictStr
    #: The typed pin (wheel name/version/digest, OCI image digests, or the test-only
    #: built-in kind).
    transform: TransformSpec
    members: MembersRef
    split_policy: StrictStr
    purpose: StrictStr
    splits: dict[StrictStr, StrictInt]
    member_counts_by_source: dict[StrictStr, StrictInt] | None = Field(
        default=None, exclude_if=lambda value: value is None
    )
    policies: EmbeddedPolicies
    provenance: Provenance
    artifacts: tuple[ArtifactRef, ...] | None = Field(
        default=None, exclude_if=lambda value: not value
    )
    statistics: StatisticsRef | None = Field(default=None, exclude_if=lambda value: value is None)

    @model_validator(mode="after")
    def _schema_digest(self) -> Self:
        actual = self.record_schema_document.digest()
        if actual != self.record_schema:
            raise RejectedError(
                "recordSchema is not the digest of the record schema the manifest carries",
                object="recordSchema",
                check=RECORD_SCHEMA_CHECK,
                digest=self.record_schema,
                details={"actual": actual},
            )
        return self

    def artifact(self, role: str, digest: str) -> ArtifactRef:
        """The artifact of ``role`` with content address ``digest`` (refused if absent)."""
        for ref in self.artifacts or ():
            if ref.role == role and ref.digest == digest:
                return ref
        raise RejectedError(
            f"manifest holds no {role} artifact with this digest",
            object=role,
            check="artifact-known",
            digest=digest,
        )


class SnapshotManifest(SnapshotBody):
    """A sealed snapshot manifest: ``snapshotId`` is the digest of the rest."""

    snapshot_id: StrictStr

    @property
    def digest(self) -> str:  # type: ignore[override]  # a manifest's digest is its snapshotId
        return self.snapshot_id

    @property
    def body(self) -> JsonObject:
        """The signed payload as decoded JSON (a fresh copy)."""
        return self.to_json()

    @property
    def members_ref(self) -> ContentRef:
        return self.members.content_ref

    @property
    def member_count(self) -> int:
        return self.members.count

    @property
    def tuple_root(self) -> str:
        return self.members.tuple_root

    def source(self, source_id: str) -> SourceEntry:
        for entry in self.sources:
            if entry.id == source_id:
                return entry
        raise KeyError(source_id)


KIND = DocumentKind(SCHEMA, PAYLOAD_TYPE, "snapshotId", REQUIRED_FIELDS)


def from_payload(body: JsonObject, *, subject: str = "manifest") -> SnapshotManifest:
    """The model of a verified payload, refused unless it reproduces the payload exactly."""
    manifest = SnapshotManifest.parse(body, what=subject)
    if manifest.to_json() != body:
        raise RejectedError(
            "manifest does not survive the round trip through its model",
            object=subject,
            check="schema",
            digest=manifest.snapshot_id,
        )
    return manifest


def seal(body: SnapshotBody | Mapping[str, JsonValue]) -> SnapshotManifest:
    """Compute the digest of a manifest body and set ``snapshotId`` from it."""
    raw = body.to_json() if isinstance(body, SnapshotBody) else dict(body)
    return from_payload(KIND.seal(raw))


def sign(manifest: SnapshotManifest, key: SigningKey) -> JsonObject:
    """The DSSE envelope of the manifest's canonical bytes."""
    return KIND.sign(manifest.to_json(), key)


def store_envelope(store: ObjectStore, manifest: SnapshotManifest, envelope: JsonObject) -> str:
    """Create the envelope object (never overwritten); its version id."""
    version = store.create(
        envelope_key(manifest.digest), json.dumps(envelope, sort_keys=True).encode()
    )
    return version.version_id


def open_envelope(
    envelope: bytes | str | JsonObject,
    trusted: TrustedKeys,
    *,
    expected: str | None = None,
    subject: str = "manifest",
) -> SnapshotManifest:
    """Verify signature, schema and digest; return the manifest the envelope vouches for."""
    body = KIND.open(envelope, trusted, expected=expected, subject=subject)
    return from_payload(body, subject=subject)


def load(
    store: ObjectStore, trusted: TrustedKeys, digest: str, version_id: str
) -> SnapshotManifest:
    """Open the envelope stored at an exact version; it must hold ``digest``."""
    key = envelope_key(digest)
    body = KIND.load(store, trusted, key=key, digest=digest, version_id=version_id)
    return from_payload(body, subject=key)


def bound_fields(document: Mapping[str, Any]) -> dict[str, JsonValue]:
    """The fields a ``snapshots`` row repeats, read from a sealed manifest as signed (raw
    on purpose, like :func:`relgate.documents.release_root.bound_fields`)."""
    members = document["members"]
    return {
        "digest": document["snapshotId"],
        "tombstone_watermark": int(document["tombstoneWatermark"]),
        "benchmark_fence": int(document["benchmarkFence"]),
        "members_digest": digest_of_uri(str(members["uri"])),
        "members_version": str(members["objectVersion"]),
        "member_count": int(members["count"]),
        "purpose": document["purpose"],
    }
