"""The version records of the catalog: one frozen record per ``snapshots`` or ``releases``
row, the fields the gate binds to the stored envelope and the state it moves.

Readers return these, never column mappings; the gate re-verifies them against the
signed document at the moment of use.
"""

from __future__ import annotations

from sqlalchemy import Connection

from relgate.catalog.db import one
from relgate.catalog.states import TABLES
from relgate.errors import NotFoundError
from relgate.integrity.contract import Record


class VersionRecord(Record):
    """What a snapshot and a release row share: identity, state, both fence watermarks,
    the membership table's exact version and the stored envelope's version."""

    digest: str
    state: str
    tombstone_watermark: int
    benchmark_fence: int
    members_digest: str
    members_version: str
    envelope_version: str
    created_at: str
    updated_at: str

    @property
    def marks(self) -> tuple[int, int]:
        """(tombstone watermark, benchmark fence) the version was built against."""
        return (self.tombstone_watermark, self.benchmark_fence)


class SnapshotRecord(VersionRecord):
    """A ``snapshots`` row."""

    purpose: str
    member_count: int
    manifest_version: str


class ReleaseRecord(VersionRecord):
    """A ``releases`` row."""

    snapshot_digest: str
    shard_count: int
    record_count: int


RECORD_OF: dict[str, type[VersionRecord]] = {"snapshot": SnapshotRecord, "release": ReleaseRecord}

_ROW_SQL = {
    kind: f"SELECT * FROM {table} WHERE digest = :d"  # noqa: S608 constant table names
    for kind, (table, _, _) in TABLES.items()
}


def _row(conn: Connection, kind: str, digest: str) -> dict[str, object]:
    row = one(conn, _ROW_SQL[kind], {"d": digest})
    if row is None:
        raise NotFoundError(f"unknown {kind}", object=kind, check="exists", digest=digest)
    return row


def read_version(conn: Connection, kind: str, digest: str) -> VersionRecord:
    """The record of one version of ``kind`` on ``conn``; NotFoundError if there is none."""
    return RECORD_OF[kind].parse(_row(conn, kind, digest), what=f"{kind} {digest}")


def read_snapshot(conn: Connection, digest: str) -> SnapshotRecord:
    return SnapshotRecord.parse(_row(conn, "snapshot", digest), what=f"snapshot {digest}")


def read_release(conn: Connection, digest: str) -> ReleaseRecord:
    return ReleaseRecord.parse(_row(conn, "release", digest), what=f"release {digest}")
