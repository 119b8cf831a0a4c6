"""The in-toto/SLSA statement of a snapshot: what it was built from, all by digest.

Subjects are the manifest (its ``snapshotId``) and the membership table.  Materials
(``resolvedDependencies``) are resolved from the manifest's pins alone, so anyone holding
the manifest can recompute them (:func:`snapshot_materials`, used both to build the
statement and to cross-check one): an Iceberg table is its metadata file's digest and
snapshot id, an object prefix its pin list plus every object version with its byte
digest, a CDC log its pin list plus every pinned segment's bytes with their offset range,
then the transform's artifact digest, the pinned tokenizer file (if the record schema
counts tokens with one) and every parent snapshot.  No material is named by
a source id, table name or tag; each ``uri`` is an immutable reference.

The statement is signed by the builder key, stored content-addressed and recorded in the
catalog as the ``snapshot-provenance`` report of the snapshot.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from typing import TypeVar

from pydantic import StrictInt, StrictStr, TypeAdapter, ValidationError
from relgate_trust.digests import is_digest, sha256_digest
from sqlalchemy import Connection

from relgate import __version__
from relgate.catalog.audit import latest_report, record_report
from relgate.catalog.snapshot_table import get_snapshot
from relgate.documents import snapshot_manifest as mf
from relgate.documents.source_pins import CdcPin, IcebergPin, ObjectPrefixPin, PinList, SourceEntry
from relgate.errors import IntegrityError, NotFoundError, RejectedError
from relgate.holds.pins import PublisherLease
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
    SpelledDigest,
    Statement,
    VerifiedStatement,
    builder_id,
    open_statement,
    require_materials,
    require_subjects,
    sign_statement,
)
from relgate.objects.cas import ContentRef, digest_of_uri
from relgate.objects.layout import cas_key
from relgate.workspace import Workspace

BUILD_TYPE = "https://relgate.dev/dataset-snapshot/build/v1"
#: The catalog report kind (``reports.subject_kind``) of a snapshot's statement.
REPORT_KIND = "snapshot-provenance"
#: The builder kind in the builder id (``<namespace>/snapshot-builder/<keyid>``).
BUILDER_KIND = "snapshot-builder"
SUBJECT_MANIFEST = "snapshot-manifest"
SUBJECT_MEMBERS = "membership"

_OBJECTS: TypeAdapter[list[tuple[StrictStr, StrictStr, SpelledDigest, StrictInt]]] = TypeAdapter(
    list[tuple[StrictStr, StrictStr, SpelledDigest, StrictInt]]
)
_SEGMENTS: TypeAdapter[list[tuple[StrictStr, StrictStr, StrictInt]]] = TypeAdapter(
    list[tuple[StrictStr, StrictStr, StrictInt]]
)


_Row = TypeVar("_Row")


def _pin_rows(
    ws: Workspace, pins: PinList, field: str, rows: TypeAdapter[list[_Row]], what: str
) -> list[_Row]:
    """The rows ``field`` of a pin document at its exact version (content-checked, typed)."""
    digest = digest_of_uri(pins.uri)
    try:
        doc = json.loads(ws.cas.get(digest, pins.object_version))
        parsed = rows.validate_python(doc.get(field) if isinstance(doc, dict) else None)
    except (ValueError, RecursionError, ValidationError):  # ValidationError is a ValueError
        parsed = None
    if parsed is None or len(parsed) != pins.count:
        raise IntegrityError(
            f"{what} pin list does not match the manifest",
            object=f"{pins.uri}@{pins.object_version}",
            check="pin-list",
            digest=digest,
        )
    return parsed


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
    objects = _pin_rows(ws, entry.objects, "objects", _OBJECTS, "object")
    out = [
        _list_descriptor(entry.objects, objects=entry.objects.count, bytes=entry.objects.size_bytes)
    ]
    out += [
        ResourceDescriptor.of(digest, uri=f"{key}@{version}", annotations={"size": size})
        for key, version, digest, size in objects
    ]
    return out


def _segments(ws: Workspace, entry: CdcPin) -> list[ResourceDescriptor]:
    segments = _pin_rows(ws, entry.segments, "segments", _SEGMENTS, "CDC")
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
    tokenizer = manifest.record_schema_document.tokens.tokenizer
    if tokenizer is not None:  # the pinned tokenizer file that counts tokens
        out.append(ResourceDescriptor.of(tokenizer, uri=f"tokenizer:{tokenizer}"))
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


def open_recorded(
    ws: Workspace,
    subject_digest: str,
    *,
    report_kind: str,
    role: Role,
    kind: str,
    subjects: Mapping[str, str],
    materials: Callable[[], Sequence[ResourceDescriptor]],
) -> VerifiedStatement:
    """The newest statement recorded for ``subject_digest`` (catalog report ``report_kind``):
    signed by a trusted key of ``role`` whose id the builder id names, its subjects exactly
    ``subjects``, its materials exactly ``materials()`` (computed only once the signature
    holds).  Exit 3 when none is recorded or any check fails, naming object, check, digest."""
    report = latest_report(ws.db, subject_digest, report_kind)
    if report is None:
        raise NotFoundError(
            f"no provenance statement is recorded ({report_kind})",
            object=subject_digest,
            check=STATEMENT_CHECK,
            digest=subject_digest,
        )
    digest, version = report.report_digest, report.report_version
    where = f"{cas_key(digest)}@{version}"
    data = ws.cas.get(digest, version)
    statement = open_statement(data, ws.trusted_keys, role=role, kind=kind, subject=where)
    require_subjects(statement, subjects, subject=where)
    require_materials(statement, materials(), subject=where)
    return VerifiedStatement(
        subject_digest=subject_digest,
        statement_digest=digest,
        statement_version=version,
        materials=len(statement.materials),
        statement=statement,
    )


def verify_provenance(ws: Workspace, digest: str) -> VerifiedStatement:
    """Open the recorded statement of a snapshot: builder-key signature, subjects equal to
    the manifest and its membership table, every material with a digest and equal to what
    the manifest's pins resolve to (the cross-check)."""
    row = get_snapshot(ws.db, digest)
    manifest = mf.load(ws.store, ws.trusted_keys, digest, row.envelope_version)
    return open_recorded(
        ws,
        digest,
        report_kind=REPORT_KIND,
        role=Role.BUILDER,
        kind=BUILDER_KIND,
        subjects=subjects(manifest),
        materials=lambda: snapshot_materials(ws, manifest),
    )
