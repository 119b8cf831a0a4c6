"""Gate permits: admission of one purpose to one root at one gate state.

A permit is bound to the root digest, both fence watermarks, the alias generation it was
resolved at, and the purpose.  It is issued inside a gate transaction and closed inside
one: a fence advance that hits a member of a permitted root closes every open permit on
that root before the advance commits.
"""

from __future__ import annotations

import uuid
from typing import Any

from sqlalchemy import Connection

from relgate.catalog.db import Database, execute, one, rows, utcnow
from relgate.errors import NotFoundError, RejectedError
from relgate.gate import read_alias, read_fences


def acquire(conn: Connection, *, alias: str, purpose: str) -> dict[str, Any]:
    """Resolve ``alias`` once and issue a permit for ``purpose`` (call inside gate_tx)."""
    fences = read_fences(conn)
    generation, root = read_alias(conn, alias, "release")
    if root is None:
        raise RejectedError(
            f"alias {alias!r} has no published release", object=alias, check="alias-active"
        )
    release = one(
        conn, "SELECT state, snapshot_digest FROM releases WHERE digest = :d", {"d": root}
    )
    if release is None or release["state"] != "PUBLISHED":
        raise RejectedError(
            "alias points at a release that is not PUBLISHED",
            object=alias,
            check="release-state",
            digest=root,
        )
    snapshot = one(
        conn, "SELECT purpose FROM snapshots WHERE digest = :d", {"d": release["snapshot_digest"]}
    )
    if snapshot is None or snapshot["purpose"] != purpose:
        raise RejectedError(
            f"purpose {purpose!r} is not what the data was admitted for",
            object=alias,
            check="purpose",
            digest=root,
            details={"admitted": snapshot["purpose"] if snapshot else None},
        )
    hits = one(conn, "SELECT COUNT(*) AS n FROM fence_hits WHERE subject_digest = :d", {"d": root})
    if hits and int(hits["n"]):
        raise RejectedError(
            "fence entries hit members of this root", object=alias, check="fence-hits", digest=root
        )
    permit = {
        "permit_id": "permit-" + uuid.uuid4().hex[:16],
        "root_digest": root,
        "alias": alias,
        "generation": generation,
        "tombstone_watermark": fences.tombstone_watermark,
        "benchmark_fence": fences.benchmark_fence,
        "purpose": purpose,
        "state": "OPEN",
        "created_at": utcnow(),
    }
    execute(
        conn,
        "INSERT INTO permits (permit_id, root_digest, alias, generation, tombstone_watermark, benchmark_fence,"
        " purpose, state, created_at) VALUES (:permit_id, :root_digest, :alias, :generation,"
        " :tombstone_watermark, :benchmark_fence, :purpose, :state, :created_at)",
        permit,
    )
    return permit


def close_hit_permits(conn: Connection, fence_kind: str, hits: dict[str, list[int]]) -> list[str]:
    """Gate hit listener: close every open permit whose root a fence entry just hit."""
    closed: list[str] = []
    now = utcnow()
    for root, seqs in sorted(hits.items()):
        for row in rows(
            conn,
            "SELECT permit_id FROM permits WHERE root_digest = :r AND state = 'OPEN'",
            {"r": root},
        ):
            execute(
                conn,
                "UPDATE permits SET state = 'CLOSED', closed_reason = :why, closed_at = :now WHERE permit_id = :p",
                {
                    "why": f"{fence_kind} fence entries {seqs} hit this root",
                    "now": now,
                    "p": row["permit_id"],
                },
            )
            closed.append(str(row["permit_id"]))
    return closed


def get_permit(db: Database, permit_id: str) -> dict[str, Any]:
    with db.tx() as conn:
        row = one(conn, "SELECT * FROM permits WHERE permit_id = :p", {"p": permit_id})
    if row is None:
        raise NotFoundError("unknown permit", object=permit_id, check="exists")
    return row


def list_permits(
    db: Database, *, root: str | None = None, state: str | None = None
) -> list[dict[str, Any]]:
    sql = "SELECT * FROM permits WHERE 1 = 1"
    params: dict[str, Any] = {}
    if root:
        sql += " AND root_digest = :r"
        params["r"] = root
    if state:
        sql += " AND state = :s"
        params["s"] = state
    with db.tx() as conn:
        return rows(conn, sql + " ORDER BY created_at", params)
