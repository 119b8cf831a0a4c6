"""Snapshot records in the catalog database."""

from __future__ import annotations

import json
from collections.abc import Mapping

from pydantic import Field, StrictInt, StrictStr
from sqlalchemy import Connection

from relgate.catalog.audit import record_report
from relgate.catalog.db import Database, execute, rows, utcnow
from relgate.catalog.states import history, resolve_digest
from relgate.catalog.versions import SnapshotRecord, read_snapshot
from relgate.documents.snapshot_manifest import SnapshotManifest
from relgate.documents.verified_bytes import VerifiedBytes
from relgate.integrity.contract import Contract, Record

#: ``reports.subject_kind`` of the CAS objects a snapshot report row keeps alive (the
#: collector marks every ``reports`` row; approval reads only ``snapshot`` rows).
RETAINED_KIND = {"validation": "snapshot", "replay": "snapshot-replay"}
FINGERPRINT_KIND = "snapshot-fingerprint"


def _absent(value: object) -> bool:
    return value is None


class SnapshotReportRow(Contract):
    """One signed snapshot report as the catalog indexes it (``snapshot_reports``)."""

    snapshot: StrictStr
    kind: StrictStr
    outcome: StrictStr
    report_digest: StrictStr
    report_version: StrictStr
    comparator: StrictStr | None = Field(default=None, exclude_if=_absent)
    canary_bp: StrictInt | None = Field(default=None, exclude_if=_absent)
    fingerprint_digest: StrictStr | None = Field(default=None, exclude_if=_absent)
    fingerprint_version: StrictStr | None = Field(default=None, exclude_if=_absent)
    actor: StrictStr
    at: StrictStr | None = Field(default=None, exclude_if=_absent)


def record_snapshot_report(conn: Connection, row: SnapshotReportRow, *, ok: bool) -> None:
    """Index a stored report (and its fingerprint) against its snapshot; a validation row
    also goes into ``reports``, which approval reads (the caller holds the transaction)."""
    now = utcnow()
    execute(
        conn,
        "INSERT INTO snapshot_reports (snapshot_digest, kind, outcome, report_digest,"
        " report_version, comparator, canary_bp, fingerprint_digest, fingerprint_version,"
        " actor, at) VALUES (:s, :k, :o, :r, :v, :c, :bp, :fd, :fv, :a, :now)",
        {
            "s": row.snapshot,
            "k": row.kind,
            "o": row.outcome,
            "r": row.report_digest,
            "v": row.report_version,
            "c": row.comparator,
            "bp": row.canary_bp,
            "fd": row.fingerprint_digest,
            "fv": row.fingerprint_version,
            "a": row.actor,
            "now": now,
        },
    )
    subject = RETAINED_KIND[row.kind]
    record_report(conn, subject, row.snapshot, row.report_digest, row.report_version, ok)
    if row.fingerprint_digest and row.fingerprint_version:
        record_report(
            conn,
            FINGERPRINT_KIND,
            row.snapshot,
            row.fingerprint_digest,
            row.fingerprint_version,
            ok,
        )


_REPORT_COLUMNS = (
    "snapshot_digest AS snapshot, kind, outcome, report_digest, report_version, comparator,"
    " canary_bp, fingerprint_digest, fingerprint_version, actor, at"
)


def snapshot_reports(db: Database, digest: str, kind: str | None = None) -> list[SnapshotReportRow]:
    """The snapshot's report rows, oldest first (of one ``kind`` when given)."""
    sql = f"SELECT {_REPORT_COLUMNS} FROM snapshot_reports WHERE snapshot_digest = :d"  # noqa: S608 - constant column list
    params = {"d": digest, "k": kind}
    if kind is not None:
        sql += " AND kind = :k"
    with db.tx() as conn:
        found = rows(conn, sql + " ORDER BY id", params)
    return [SnapshotReportRow.model_validate(r) for r in found]


def insert_snapshot(
    conn: Connection,
    manifest: SnapshotManifest,
    envelope_version: str,
    *,
    actor: str,
    verified: VerifiedBytes | None = None,
) -> None:
    """The snapshot row, BUILDING; ``verified``: its stored envelope's verified bytes."""
    now = utcnow()
    execute(
        conn,
        "INSERT INTO snapshots (digest, state, purpose, member_count, tombstone_watermark, benchmark_fence,"
        " members_digest, members_version, manifest_version, envelope_version, verified_sha256, verified_trust,"
        " created_at, updated_at)"
        " VALUES (:d, 'BUILDING', :p, :n, :t, :b, :md, :mv, :ev, :ev, :vh, :vt, :now, :now)",
        {
            "d": manifest.digest,
            "p": manifest.purpose,
            "n": manifest.member_count,
            "t": manifest.tombstone_watermark,
            "b": manifest.benchmark_fence,
            "md": manifest.members_ref.digest,
            "mv": manifest.members_ref.version_id,
            "ev": envelope_version,
            "vh": verified.sha256 if verified else None,
            "vt": verified.trust if verified else None,
            "now": now,
        },
    )
    execute(
        conn,
        "INSERT INTO snapshot_events (digest, from_state, to_state, actor, reason, at)"
        " VALUES (:d, NULL, 'BUILDING', :a, 'manifest signed and stored', :now)",
        {"d": manifest.digest, "a": actor, "now": now},
    )


def get_snapshot(db: Database, digest: str) -> SnapshotRecord:
    with db.tx() as conn:
        return read_snapshot(conn, digest)


def resolve(db: Database, ref: str) -> str:
    return resolve_digest(db, "snapshot", ref)


class SnapshotSummary(Record):
    """A snapshot as ``relgate snapshot list`` prints it."""

    digest: str
    state: str
    purpose: str
    member_count: int
    tombstone_watermark: int
    benchmark_fence: int
    created_at: str


def list_snapshots(db: Database) -> list[SnapshotSummary]:
    with db.tx() as conn:
        found = rows(
            conn,
            "SELECT digest, state, purpose, member_count, tombstone_watermark, benchmark_fence, created_at FROM snapshots ORDER BY created_at",
        )
    return [SnapshotSummary.model_validate(r) for r in found]


def snapshot_history(db: Database, digest: str) -> list[dict[str, str]]:
    with db.tx() as conn:
        return history(conn, "snapshot", digest)


def record_build_failure(
    db: Database,
    build_id: str,
    state: str,
    reason: str,
    details: Mapping[str, object],
    digest: str | None = None,
) -> None:
    with db.tx() as conn:
        execute(
            conn,
            "INSERT INTO builds (build_id, state, digest, reason, details, created_at) VALUES (:i, :s, :d, :r, :x, :now)",
            {
                "i": build_id,
                "s": state,
                "d": digest,
                "r": reason,
                "x": json.dumps(details, sort_keys=True),
                "now": utcnow(),
            },
        )
