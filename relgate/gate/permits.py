"""Gate permits: the ``permits`` table (issued by :mod:`relgate.gate.permit_issue`).

A permit is bound to the root digest, both fence watermarks, the alias generation it was
resolved at, and the purpose.  It is issued inside a gate transaction and closed inside
one: a fence advance that hits a member of a permitted root closes every open permit on
that root before the advance commits.
"""

from __future__ import annotations

from sqlalchemy import Connection

from relgate.catalog.db import Database, execute, one, rows, utcnow
from relgate.catalog.states import RUN_LIVE_STATES
from relgate.errors import NotFoundError
from relgate.gate.hits import HitSeqs
from relgate.integrity.contract import Contract

#: ``permits.generation`` of a permit admitted by exact digest (no alias was read).
NO_GENERATION = -1


class Permit(Contract):
    """Admission of one purpose to one exact root at one gate state (a ``permits`` row)."""

    permit_id: str
    root_digest: str
    alias: str
    generation: int
    tombstone_watermark: int
    benchmark_fence: int
    purpose: str
    state: str
    created_at: str
    closed_reason: str | None = None
    closed_at: str | None = None


def insert_permit(conn: Connection, permit: Permit) -> None:
    """Write an issued permit (inside the gate transaction that admitted it)."""
    execute(
        conn,
        "INSERT INTO permits (permit_id, root_digest, alias, generation, tombstone_watermark,"
        " benchmark_fence, purpose, state, created_at) VALUES (:permit_id, :root_digest, :alias,"
        " :generation, :tombstone_watermark, :benchmark_fence, :purpose, :state, :created_at)",
        permit.model_dump(exclude={"closed_reason", "closed_at"}),
    )


def close_permit(conn: Connection, permit_id: str, reason: str) -> bool:
    """Close one open permit (a run ended); False if it was already closed."""
    changed = execute(
        conn,
        "UPDATE permits SET state = 'CLOSED', closed_reason = :why, closed_at = :now"
        " WHERE permit_id = :p AND state = 'OPEN'",
        {"why": reason, "now": utcnow(), "p": permit_id},
    )
    return changed == 1


def close_hit_permits(conn: Connection, fence_kind: str, hits: HitSeqs) -> list[str]:
    """Gate hit listener: close every open permit on a hit root and revoke its runs.

    Runs in the fence transaction, so a worker's barrier and a reader's next record see
    the closed permit and the REVOKED run as soon as the fence is visible at all.
    """
    closed: list[str] = []
    now = utcnow()
    live = ", ".join(f"'{s}'" for s in RUN_LIVE_STATES)
    revoke = (
        "UPDATE runs SET state = 'REVOKED', failure = :why, end_reason = :why, ended_at = :now,"  # noqa: S608 constant run states
        f" ended_by = 'gate', updated_at = :now WHERE root_digest = :r AND state IN ({live})"
    )
    for root, seqs in sorted(hits.items()):
        why = f"{fence_kind} fence entries {seqs} hit root {root}"
        for row in rows(
            conn,
            "SELECT permit_id FROM permits WHERE root_digest = :r AND state = 'OPEN' ORDER BY permit_id",
            {"r": root},
        ):
            if close_permit(conn, str(row["permit_id"]), why):
                closed.append(str(row["permit_id"]))
        execute(conn, revoke, {"why": why, "now": now, "r": root})
    return closed


def get_permit(db: Database, permit_id: str) -> Permit:
    with db.tx() as conn:
        row = one(conn, "SELECT * FROM permits WHERE permit_id = :p", {"p": permit_id})
    if row is None:
        raise NotFoundError("unknown permit", object=permit_id, check="exists")
    return Permit.model_validate(row)


def list_permits(
    db: Database, *, root: str | None = None, state: str | None = None
) -> list[Permit]:
    sql = "SELECT * FROM permits WHERE 1 = 1"
    params: dict[str, str] = {}
    if root:
        sql += " AND root_digest = :r"
        params["r"] = root
    if state:
        sql += " AND state = :s"
        params["s"] = state
    with db.tx() as conn:
        found = rows(conn, sql + " ORDER BY created_at", params)
    return [Permit.model_validate(r) for r in found]
