"""The ``permits`` table's store (permits are issued by :mod:`relgate.gate.permit_issue`).

A permit is bound to the root digest, both fence watermarks, the alias generation it was
resolved at, and the purpose.  It is issued inside a gate transaction and closed inside
one: a fence advance that hits a member of a permitted root closes every open permit on
that root before the advance commits.
"""

from __future__ import annotations

from sqlalchemy import Connection

from relgate.catalog.db import Database, execute, one, rows, utcnow
from relgate.errors import NotFoundError
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
