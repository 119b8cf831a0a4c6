"""Aliases: the compare-and-swap over ``(aliasGeneration, activeDigest)``.

An alias moves only inside a gate transaction, from the generation the caller expected
to the next one; every move appends one ``alias_history`` row with the fences it was
made at.  A retry of a move that already committed returns the committed result.
"""

from __future__ import annotations

from pydantic import Field
from sqlalchemy import Connection

from relgate.catalog import alias_table
from relgate.catalog.alias_table import AliasMove, AliasRecord
from relgate.catalog.db import one, rows, utcnow
from relgate.errors import ConflictError, UsageError
from relgate.gate.fences import Fences
from relgate.integrity.contract import Contract


class AliasState(Contract):
    """One alias at one gate state."""

    alias: str
    kind: str
    generation: int
    active_digest: str | None
    tombstone_watermark: int
    benchmark_fence: int

    @property
    def fences(self) -> Fences:
        return Fences(self.tombstone_watermark, self.benchmark_fence)


class AliasChange(Contract):
    """The result of an activation, publication or rollback (or of its idempotent retry)."""

    alias: str
    kind: str
    generation: int
    active_digest: str
    tombstone_watermark: int
    benchmark_fence: int
    idempotent_retry: bool


class AliasHistoryEntry(Contract):
    """One generation of an alias: what it pointed at, who moved it, at which fences."""

    name: str
    generation: int
    subject: str = Field(validation_alias="digest", serialization_alias="digest")
    action: str
    actor: str
    tombstone_watermark: int
    benchmark_fence: int
    at: str


def alias_change(
    alias: str, kind: str, generation: int, digest: str, fences: Fences, *, idempotent: bool
) -> AliasChange:
    return AliasChange(
        alias=alias,
        kind=kind,
        generation=generation,
        active_digest=digest,
        tombstone_watermark=fences.tombstone_watermark,
        benchmark_fence=fences.benchmark_fence,
        idempotent_retry=idempotent,
    )


def read_alias(conn: Connection, alias: str, kind: str) -> tuple[int, str | None]:
    """(generation, active digest) of ``alias``; (0, None) if it was never set."""
    row = one(
        conn,
        "SELECT name, kind, generation, active_digest FROM aliases WHERE name = :n",
        {"n": alias},
    )
    return alias_of(None if row is None else AliasRecord.parse(row, what=f"alias {alias}"), kind)


def alias_kind(conn: Connection, alias: str) -> str | None:
    """What ``alias`` points at ("snapshot" or "release"); None if it was never set."""
    row = one(conn, "SELECT kind FROM aliases WHERE name = :n", {"n": alias})
    return None if row is None or row["kind"] is None else str(row["kind"])


def alias_of(record: AliasRecord | None, kind: str) -> tuple[int, str | None]:
    """:func:`read_alias` of an already-read ``aliases`` row (None: never set)."""
    if record is None or record.kind is None:
        return 0, None
    if record.kind != kind:
        raise UsageError(
            f"alias {record.name!r} points at a {record.kind}, not a {kind}",
            object=record.name,
            check="alias-kind",
        )
    return record.generation or 0, record.active_digest


def alias_history(conn: Connection, alias: str) -> list[AliasHistoryEntry]:
    found = rows(
        conn, "SELECT * FROM alias_history WHERE name = :n ORDER BY generation", {"n": alias}
    )
    return [AliasHistoryEntry.model_validate(r) for r in found]


def committed_retry(
    conn: Connection,
    alias: str,
    seen: tuple[int, str | None],
    expected: int,
    digest: str,
    action: str,
) -> bool:
    """True when ``action`` to ``digest`` from ``expected`` already committed (a retry)."""
    generation, active = seen
    if generation != expected + 1 or active != digest:
        return False
    last = one(
        conn,
        "SELECT action FROM alias_history WHERE name = :n AND generation = :g",
        {"n": alias, "g": generation},
    )
    return last is not None and last["action"] == action


def stale_generation(
    alias: str,
    generation: int,
    expected: int,
    digest: str | None,
    details: dict[str, object] | None,
) -> ConflictError:
    return ConflictError(
        f"alias {alias!r} is at generation {generation}, not {expected}",
        object=alias,
        check="alias-generation",
        digest=digest,
        details=details,
    )


def set_alias(conn: Connection, move: AliasMove) -> None:
    """Move the alias from ``generation - 1`` to ``generation`` and append its history."""
    now = utcnow()
    if move.generation == 1:
        alias_table.create(conn, move, now)
    elif not alias_table.move(conn, move, now):
        raise ConflictError(
            "alias changed concurrently",
            object=move.alias,
            check="alias-generation",
            digest=move.subject,
        )
    alias_table.append_history(conn, move, now)
