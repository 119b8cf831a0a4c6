"""Snapshot records in the catalog database."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection

from relgate.catalog.db import Database, execute, one, rows, utcnow
from relgate.catalog.states import history, resolve_digest
from relgate.errors import NotFoundError
from relgate.snapshot.manifest import SnapshotManifest


def insert_snapshot(
    conn: Connection, manifest: SnapshotManifest, envelope_version: str, *, actor: str
) -> None:
    now = utcnow()
    execute(
        conn,
        "INSERT INTO snapshots (digest, state, purpose, member_count, tombstone_watermark, benchmark_fence,"
        " members_digest, members_version, manifest_version, envelope_version, created_at, updated_at)"
        " VALUES (:d, 'BUILDING', :p, :n, :t, :b, :md, :mv, :ev, :ev, :now, :now)",
        {
            "d": manifest.digest,
            "p": manifest.purpose,
            "n": manifest.member_count,
            "t": manifest.tombstone_watermark,
            "b": manifest.benchmark_fence,
            "md": manifest.members_ref.digest,
            "mv": manifest.members_ref.version_id,
            "ev": envelope_version,
            "now": now,
        },
    )
    execute(
        conn,
        "INSERT INTO snapshot_events (digest, from_state, to_state, actor, reason, at)"
        " VALUES (:d, NULL, 'BUILDING', :a, 'manifest signed and stored', :now)",
        {"d": manifest.digest, "a": actor, "now": now},
    )


def get_snapshot(db: Database, digest: str) -> dict[str, Any]:
    with db.tx() as conn:
        return get_snapshot_conn(conn, digest)


def get_snapshot_conn(conn: Connection, digest: str) -> dict[str, Any]:
    row = one(conn, "SELECT * FROM snapshots WHERE digest = :d", {"d": digest})
    if row is None:
        raise NotFoundError("unknown snapshot", object="snapshot", check="exists", digest=digest)
    return row


def resolve(db: Database, ref: str) -> str:
    return resolve_digest(db, "snapshot", ref)


def list_snapshots(db: Database) -> list[dict[str, Any]]:
    with db.tx() as conn:
        return rows(
            conn,
            "SELECT digest, state, purpose, member_count, tombstone_watermark, benchmark_fence, created_at FROM snapshots ORDER BY created_at",
        )


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
