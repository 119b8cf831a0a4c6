"""The in-toto/SLSA statement of a snapshot: what it was built from, all by digest.

Subjects are the manifest (its ``snapshotId``) and the membership table.  Materials
(``resolvedDependencies``) are resolved from the manifest's pins alone, so anyone holding
the manifest can recompute them (:func:`snapshot_materials`, used both to build the
statement and to cross-check one): an Iceberg table is its metadata file's digest and
snapshot id, an object prefix its pin list plus every object version with its byte
digest, a CDC log its pin list plus every pinned segment's bytes with their offset range,
then the transform's artifact digest and every parent snapshot.  No material is named by
a source id, table name or tag; each ``uri`` is an immutable reference.

The statement is signed by the builder key, stored content-addressed and recorded in the
catalog as the ``snapshot-provenance`` report of the snapshot.
"""

from __future__ import annotations

import json

from pydantic import StrictInt, StrictStr, TypeAdapter, ValidationError
from sqlalchemy import Connection

from relgate import __version__
from relgate.catalog.audit import latest_report, record_report
from relgate.catalog.snapshot_table import get_snapshot
from relgate.errors import IntegrityError, NotFoundError, RejectedError
from relgate.integrity.contract import Contract
from relgate.integrity.digests import is_digest, sha256_digest
from relgate.integrity.signing import Role
from relgate.integrity.statement import (
    MATERIAL_DIGEST_CHECK,
    STATEMENT_CHECK,
    BuildDefinition,
    Builder,
    BuildMetadata,
    ResourceDescriptor,
    RunDetails,
    SlsaProvenance,
    Statement,
    builder_id,
    open_statement,
    require_materials,
    require_subjects,
    sign_statement,
)
from relgate.lifecycle.pins import PublisherLease
from relgate.objects.cas import ContentRef, digest_of_uri
from relgate.objects.layout import cas_key
from relgate.snapshot import manifest as mf
from relgate.sources.source import CdcPin, IcebergPin, ObjectPrefixPin, PinList, SourceEntry
from relgate.workspace import Workspace

BUILD_TYPE = "https://relgate.dev/dataset-snapshot/build/v1"
#: The catalog report kind (``reports.subject_kind``) of a snapshot's statement.
REPORT_KIND = "snapshot-provenance"
#: The builder kind in the builder id (``<namespace>/snapshot-builder/<keyid>``).
BUILDER_KIND = "snapshot-builder"
SUBJECT_MANIFEST = "snapshot-manifest"
SUBJECT_MEMBERS = "membership"

_OBJECTS: TypeAdapter[list[tuple[StrictStr, StrictStr, StrictStr, StrictInt]]] = TypeAdapter(
    list[tuple[StrictStr, StrictStr, StrictStr, StrictInt]]
)
_SEGMENTS: TypeAdapter[list[tuple[StrictStr, StrictStr, StrictInt]]] = TypeAdapter(
    list[tuple[StrictStr, StrictStr, StrictInt]]
)


class SnapshotProvenance(Contract):
    """A verified statement and where it is stored (what ``snapshot provenance`` prints)."""

    snapshot: StrictStr
    statement_digest: StrictStr
    statement_version: StrictStr
    materials: StrictInt
    statement: Statement


def _pin_list(ws: Workspace, pins: PinList, field: str, what: str) -> list[object]:
    """The list ``field`` of a pin document at its exact version (content-checked)."""
    digest = digest_of_uri(pins.uri)
    doc = json.loads(ws.cas.get(digest, pins.object_version))
    items = doc.get(field) if isinstance(doc, dict) else None
    if not isinstance(items, list) or len(items) != pins.count:
        raise IntegrityError(
            f"{what} pin list does not match the manifest",
            object=f"{pins.uri}@{pins.object_version}",
            check="pin-list",
            digest=digest,
        )
    return items


def _list_descriptor(pins: PinList, **annotations: str | int) -> ResourceDescriptor:
    return ResourceDescriptor.of(digest_of_uri(pins.uri), uri=pins.uri, annotations=annotations)


def _iceberg(entry: IcebergPin) -> list[ResourceDescriptor]:
    meta = entry.metadata_file
    if meta is None or not is_digest(meta.file_digest):
        raise RejectedError(
            "iceberg pin records no metadata-file digest (manifest older than provenance)",
            object=entry.table_snapshot,
            check=MATERIAL_DIGEST_CHECK,
        )
    annotations: dict[str, str | int] = {"tableSnapshot": entry.table_snapshot, "size": meta.size}
    return [
        ResourceDescriptor.of(
            meta.file_digest, uri=f"iceberg-metadata:{meta.file_digest}", annotations=annotations
        )
    ]


def _objects(ws: Workspace, entry: ObjectPrefixPin) -> list[ResourceDescriptor]:
    items = _pin_list(ws, entry.objects, "objects", "object")
    try:
        objects = _OBJECTS.validate_python(items)
    except ValidationError:
        raise IntegrityError(
            "object pin list entries are malformed",
            object=entry.objects.uri,
            check="pin-list",
            digest=digest_of_uri(entry.objects.uri),
        ) from None
    out = [
        _list_descriptor(entry.objects, objects=entry.objects.count, bytes=entry.objects.size_bytes)
    ]
    out += [
        ResourceDescriptor.of(digest, uri=f"{key}@{version}", annotations={"size": size})
        for key, version, digest, size in objects
    ]
    return out


def _segments(ws: Workspace, entry: CdcPin) -> list[ResourceDescriptor]:
    items = _pin_list(ws, entry.segments, "segments", "CDC")
    try:
        segments = _SEGMENTS.validate_python(items)
    except ValidationError:
        raise IntegrityError(
            "CDC pin list entries are malformed",
            object=entry.segments.uri,
            check="pin-list",
            digest=digest_of_uri(entry.segments.uri),
        ) from None
    out = [
        _list_descriptor(
            entry.segments,
            offsetLow=0,
            offsetHigh=entry.high_offset,
            commitWatermark=entry.commit_watermark,
        )
    ]
    low = 0
    for key, version, events in segments:
        data = ws.store.get(key, version)  # the exact pinned version, hashed as read
        annotations: dict[str, str | int] = {
            "offsetLow": low,
            "offsetHigh": low + events - 1,
            "events": events,
        }
        out.append(
            ResourceDescriptor.of(
                sha256_digest(data), uri=f"{key}@{version}", annotations=annotations
            )
        )
        low += events
    return out


def source_materials(ws: Workspace, entry: SourceEntry) -> list[ResourceDescriptor]:
    """The materials one pinned source resolves to (see the module docstring)."""
    if isinstance(entry, IcebergPin):
        return _iceberg(entry)
    if isinstance(entry, ObjectPrefixPin):
        return _objects(ws, entry)
    return _segments(ws, entry)


def transform_digest(transform_image: str) -> str:
    """The digest part of ``repository/name@sha256:...`` (the artifact, not its name)."""
    digest = transform_image.rpartition("@")[2]
    if not is_digest(digest):
        raise RejectedError(
            "transform is not pinned by digest",
            object="transformImage",
            check=MATERIAL_DIGEST_CHECK,
        )
    return digest


def snapshot_materials(ws: Workspace, manifest: mf.SnapshotManifest) -> list[ResourceDescriptor]:
    """Every material of the manifest's statement, recomputed from its pins."""
    out: list[ResourceDescriptor] = []
    for entry in manifest.sources:
        out += source_materials(ws, entry)
    transform = transform_digest(manifest.transform_image)
    out.append(ResourceDescriptor.of(transform, uri=f"transform:{transform}"))
    out += [ResourceDescriptor.of(p, uri=f"relgate-snapshot:{p}") for p in manifest.parents]
    return out


def subjects(manifest: mf.SnapshotManifest) -> dict[str, str]:
    """Subject name -> digest: the manifest and its membership table."""
    return {SUBJECT_MANIFEST: manifest.snapshot_id, SUBJECT_MEMBERS: manifest.members_ref.digest}


def snapshot_statement(ws: Workspace, manifest: mf.SnapshotManifest, keyid: str) -> Statement:
    """The statement for a sealed manifest, issued by the builder key ``keyid``."""
    generated = manifest.provenance.was_generated_by
    media = {SUBJECT_MANIFEST: mf.PAYLOAD_TYPE, SUBJECT_MEMBERS: manifest.members.media_type}
    return Statement(
        subject=tuple(
            ResourceDescriptor.of(digest, name=name, media_type=media[name])
            for name, digest in subjects(manifest).items()
        ),
        predicate=SlsaProvenance(
            build_definition=BuildDefinition(
                build_type=BUILD_TYPE,
                external_parameters={
                    "purpose": manifest.purpose,
                    "parents": list(manifest.parents),
                    "recordSchema": manifest.record_schema,
                    "selectionPolicy": manifest.selection_policy,
                    "splitPolicy": manifest.split_policy,
                    "transform": transform_digest(manifest.transform_image),
                    "tombstoneWatermark": manifest.tombstone_watermark,
                    "benchmarkFence": manifest.benchmark_fence,
                },
                internal_parameters={"activity": generated.activity},
                resolved_dependencies=tuple(snapshot_materials(ws, manifest)),
            ),
            run_details=RunDetails(
                builder=Builder(
                    id=builder_id(BUILDER_KIND, keyid), version={"relgate": __version__}
                ),
                metadata=BuildMetadata(
                    invocation_id=f"relgate-build:{generated.build_id}",
                    started_on=generated.started_at_time,
                    finished_on=generated.ended_at_time,
                ),
            ),
        ),
    )


def store_statement(
    ws: Workspace, manifest: mf.SnapshotManifest, lease: PublisherLease
) -> ContentRef:
    """Build, sign (builder key) and store the statement; the lease covers it first."""
    statement = snapshot_statement(ws, manifest, ws.signing_key.keyid)
    data = json.dumps(sign_statement(statement, ws.signing_key), sort_keys=True).encode()
    lease.cover(cas_key(sha256_digest(data)))  # leased before it exists
    return ws.cas.put(data)


def record_statement(conn: Connection, manifest: mf.SnapshotManifest, ref: ContentRef) -> None:
    """Record the statement as the snapshot's ``snapshot-provenance`` report."""
    record_report(conn, REPORT_KIND, manifest.snapshot_id, ref.digest, ref.version_id, True)


def check_materials(ws: Workspace, manifest: mf.SnapshotManifest, statement: Statement) -> None:
    """The validation cross-check: the statement's materials are exactly what the
    manifest's pins resolve to now (else :data:`MATERIALS_CHECK`, exit 3)."""
    require_materials(statement, snapshot_materials(ws, manifest), subject=manifest.snapshot_id)


def verify_provenance(ws: Workspace, digest: str) -> SnapshotProvenance:
    """Open the recorded statement of a snapshot: builder-key signature, subjects equal to
    the manifest and its membership table, every material with a digest and equal to the
    manifest's pins.  Any failure is exit 3 naming the object, the check and a digest."""
    row = get_snapshot(ws.db, digest)
    manifest = mf.load(ws.store, ws.trusted_keys, digest, row["envelope_version"])
    report = latest_report(ws.db, digest, REPORT_KIND)
    if report is None:
        raise NotFoundError(
            "no provenance statement is recorded for this snapshot",
            object="snapshot",
            check=STATEMENT_CHECK,
            digest=digest,
        )
    ref_digest, version = str(report["report_digest"]), str(report["report_version"])
    where = f"{cas_key(ref_digest)}@{version}"
    statement = open_statement(
        ws.cas.get(ref_digest, version),
        ws.trusted_keys,
        role=Role.BUILDER,
        kind=BUILDER_KIND,
        subject=where,
    )
    require_subjects(statement, subjects(manifest), subject=where)
    check_materials(ws, manifest, statement)
    return SnapshotProvenance(
        snapshot=digest,
        statement_digest=ref_digest,
        statement_version=version,
        materials=len(statement.materials),
        statement=statement,
    )
