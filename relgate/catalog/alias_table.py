"""The ``aliases`` and ``alias_history`` tables' store: every statement that writes them.

An alias moves only inside a gate transaction (:mod:`relgate.gate.aliases` decides the
move); the holds read aliases as GC roots and a version's standing reads their history,
so the two tables' one writer sits below both, here.
"""

from __future__ import annotations

from sqlalchemy import Connection

from relgate.catalog.db import execute, rows
from relgate.integrity.contract import Contract, Record


class AliasRecord(Record):
    """An ``aliases`` row: what ``name`` points at now (``kind`` None: never set)."""

    name: str
    kind: str | None = None
    generation: int | None = None
    active_digest: str | None = None


class AliasStep(Record):
    """One ``alias_history`` row as retention reads it: the digest a generation held,
    and since when."""

    name: str
    generation: int
    digest: str
    at: str


def aliases(conn: Connection) -> list[AliasRecord]:
    """Every alias, by name."""
    found = rows(conn, "SELECT name, kind, generation, active_digest FROM aliases ORDER BY name")
    return [AliasRecord.parse(row, what=f"alias {row['name']}") for row in found]


def steps(conn: Connection) -> list[AliasStep]:
    """Every alias generation ever set, by alias and generation."""
    found = rows(
        conn, "SELECT name, generation, digest, at FROM alias_history ORDER BY name, generation"
    )
    return [AliasStep.parse(row, what=f"alias {row['name']} history") for row in found]


class AliasMove(Contract):
    """One CAS step of an alias: to ``generation`` (the previous one + 1), holding
    ``subject``, made at both fence watermarks."""

    alias: str
    kind: str
    generation: int
    subject: str
    action: str
    actor: str
    tombstone_watermark: int
    benchmark_fence: int


def create(conn: Connection, move: AliasMove, now: str) -> None:
    """A new alias at generation 1, holding ``move.subject``."""
    execute(
        conn,
        "INSERT INTO aliases (name, kind, generation, active_digest, updated_at)"
        " VALUES (:n, :k, 1, :d, :now)",
        {"n": move.alias, "k": move.kind, "d": move.subject, "now": now},
    )


def move(conn: Connection, move: AliasMove, now: str) -> bool:
    """Generation ``move.generation - 1`` -> ``move.generation``, holding ``move.subject``."""
    changed = execute(
        conn,
        "UPDATE aliases SET generation = :g, active_digest = :d, updated_at = :now"
        " WHERE name = :n AND generation = :prev",
        {
            "g": move.generation,
            "d": move.subject,
            "now": now,
            "n": move.alias,
            "prev": move.generation - 1,
        },
    )
    return changed == 1


def append_history(conn: Connection, move: AliasMove, now: str) -> None:
    """The history row of one move, with the fences it was made at."""
    execute(
        conn,
        "INSERT INTO alias_history (name, generation, digest, action, actor, tombstone_watermark,"
        " benchmark_fence, at) VALUES (:n, :g, :d, :a, :who, :t, :b, :now)",
        {
            "n": move.alias,
            "g": move.generation,
            "d": move.subject,
            "a": move.action,
            "who": move.actor,
            "t": move.tombstone_watermark,
            "b": move.benchmark_fence,
            "now": now,
        },
    )
