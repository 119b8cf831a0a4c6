"""The version records of the catalog: one frozen record per ``snapshots`` or ``releases``
row, the fields the gate binds to the stored envelope and the state it moves.

Readers return these, never column mappings; the gate re-verifies them against the
signed document at the moment of use.
"""

from __future__ import annotations

from sqlalchemy import Connection

from relgate.catalog.db import execute, one
from relgate.catalog.states import TABLES
from relgate.documents.verified_bytes import Verification, VerifiedBytes
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
    #: :class:`VerifiedBytes` of the stored envelope (None until it is verified)
    verified_sha256: str | None = None
    verified_trust: str | None = None

    @property
    def verified(self) -> VerifiedBytes | None:
        return verified_bytes(self.verified_sha256, self.verified_trust)

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


_RECORD_SQL = {
    kind: f"UPDATE {table} SET verified_sha256 = :h, verified_trust = :t"  # noqa: S608 constant table names
    " WHERE digest = :d AND envelope_version = :v AND (verified_sha256 IS NULL OR verified_sha256 = :h)"
    for kind, (table, _, _) in TABLES.items()
}


def verified_bytes(sha256: str | None, trust: str | None) -> VerifiedBytes | None:
    """The record of a row's two ``verified_*`` columns (None unless both are set)."""
    if sha256 is None or trust is None:
        return None
    return VerifiedBytes(sha256=sha256, trust=trust)


def record_verified(conn: Connection, verifications: list[Verification]) -> None:
    """Keep each envelope's verified bytes on its row.  Never replaces other bytes: a row
    whose recorded bytes differ keeps them (and its readers keep refusing)."""
    for v in verifications:
        params = {"h": v.verified.sha256, "t": v.verified.trust, "d": v.digest}
        execute(conn, _RECORD_SQL[v.kind], {**params, "v": v.envelope_version})


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
