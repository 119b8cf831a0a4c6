"""Release records in the catalog database."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from relgate.catalog.db import Database, execute, rows, utcnow
from relgate.catalog.states import resolve_digest
from relgate.catalog.versions import ReleaseRecord, read_release
from relgate.documents.release_root import ReleaseManifest
from relgate.documents.verified_bytes import VerifiedBytes
from relgate.errors import RejectedError
from relgate.integrity.contract import JsonObject, Record


def insert_release(
    conn: Connection,
    manifest: ReleaseManifest | JsonObject,
    *,
    members_digest: str,
    members_version: str,
    envelope_version: str,
    actor: str,
    verified: VerifiedBytes | None = None,
) -> None:
    """The release row, STAGED; ``verified``: its stored envelope's verified bytes."""
    body = manifest.document() if isinstance(manifest, ReleaseManifest) else manifest
    totals = body["totals"]
    if not isinstance(totals, dict):
        raise RejectedError(
            "a release root's totals are an object", object="release", check="schema"
        )
    now = utcnow()
    execute(
        conn,
        "INSERT INTO releases (digest, state, snapshot_digest, members_digest, members_version, tombstone_watermark,"
        " benchmark_fence, shard_count, record_count, envelope_version, verified_sha256, verified_trust,"
        " created_at, updated_at)"
        " VALUES (:d, 'STAGED', :s, :md, :mv, :t, :b, :sc, :rc, :ev, :vh, :vt, :now, :now)",
        {
            "d": body["rootId"],
            "s": body["datasetSnapshot"],
            "md": members_digest,
            "mv": members_version,
            "t": body["tombstoneWatermark"],
            "b": body["benchmarkFence"],
            "sc": totals["shards"],
            "rc": totals["records"],
            "ev": envelope_version,
            "vh": verified.sha256 if verified else None,
            "vt": verified.trust if verified else None,
            "now": now,
        },
    )
    execute(
        conn,
        "INSERT INTO release_events (digest, from_state, to_state, actor, reason, at)"
        " VALUES (:d, NULL, 'STAGED', :a, 'shards staged, root manifest signed', :now)",
        {"d": body["rootId"], "a": actor, "now": now},
    )


def get_release(db: Database, digest: str) -> ReleaseRecord:
    with db.tx() as conn:
        return read_release(conn, digest)


def resolve_release(db: Database, ref: str) -> str:
    return resolve_digest(db, "release", ref)


class ReleaseSummary(Record):
    """A release as ``relgate release list`` prints it."""

    digest: str
    state: str
    snapshot_digest: str
    shard_count: int
    record_count: int
    created_at: str


def list_releases(db: Database) -> list[ReleaseSummary]:
    with db.tx() as conn:
        found = rows(
            conn,
            "SELECT digest, state, snapshot_digest, shard_count, record_count, created_at FROM releases ORDER BY created_at",
        )
    return [ReleaseSummary.model_validate(r) for r in found]


@dataclass(frozen=True)
class VerificationAttempt:
    """One recorded ``release verify`` (typed: read by the CLI, Dagster and the metrics)."""

    digest: str
    outcome: str  # VERIFIED | INVALID | UNAVAILABLE
    state: str  # the release's catalog state after the attempt
    checks: tuple[str, ...]
    report_digest: str
    report_version: str
    actor: str
    at: str

    def to_json(self) -> dict[str, Any]:
        return {
            "digest": self.digest,
            "outcome": self.outcome,
            "state": self.state,
            "checks": list(self.checks),
            "reportDigest": self.report_digest,
            "reportVersion": self.report_version,
            "actor": self.actor,
            "at": self.at,
        }


def record_attempt(
    conn: Connection,
    digest: str,
    *,
    outcome: str,
    state: str,
    checks: list[str],
    report_digest: str,
    report_version: str,
    actor: str,
) -> None:
    execute(
        conn,
        "INSERT INTO verification_attempts (digest, outcome, state, checks, report_digest,"
        " report_version, actor, at) VALUES (:d, :o, :s, :c, :r, :v, :a, :now)",
        {
            "d": digest,
            "o": outcome,
            "s": state,
            "c": json.dumps(sorted(checks)),
            "r": report_digest,
            "v": report_version,
            "a": actor,
            "now": utcnow(),
        },
    )


def verification_attempts(db: Database, digest: str) -> list[VerificationAttempt]:
    with db.tx() as conn:
        found = rows(
            conn,
            "SELECT * FROM verification_attempts WHERE digest = :d ORDER BY id",
            {"d": digest},
        )
    return [
        VerificationAttempt(
            digest=str(r["digest"]),
            outcome=str(r["outcome"]),
            state=str(r["state"]),
            checks=tuple(json.loads(r["checks"])),
            report_digest=str(r["report_digest"]),
            report_version=str(r["report_version"]),
            actor=str(r["actor"]),
            at=str(r["at"]),
        )
        for r in found
    ]
