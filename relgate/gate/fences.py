"""Fences: the two global watermarks (tombstones, benchmark items) and their entries.

The one ``fences`` row holds both watermarks; every gate transaction reads it first.  An
advance appends entries with consecutive sequence numbers and moves one watermark, inside
the caller's gate transaction.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field, field_serializer
from sqlalchemy import Connection

from relgate.catalog.db import execute, one, rows
from relgate.errors import NotFoundError
from relgate.integrity.contract import Contract

FenceKind = Literal["tombstone", "benchmark"]

#: Per fence: the watermark column and the statement that appends one entry.
_FENCE_SQL: dict[str, tuple[str, str]] = {
    "tombstone": (
        "tombstone_watermark",
        "INSERT INTO tombstones (seq, sample_id, reason, actor, state, created_at)"
        " VALUES (:s, :v, :note, :a, 'FENCED', :now)",
    ),
    "benchmark": (
        "benchmark_fence",
        "INSERT INTO benchmark_items (seq, content_digest, benchmark, actor, created_at)"
        " VALUES (:s, :v, :note, :a, :now)",
    ),
}
_UPDATE_WATERMARK = {
    column: f"UPDATE fences SET {column} = :w, updated_at = :now WHERE id = 1"  # noqa: S608 constant column names
    for column, _ in _FENCE_SQL.values()
}


class Fences(Contract):
    """Both watermarks at one gate state."""

    tombstone_watermark: int
    benchmark_fence: int

    def __init__(self, tombstone_watermark: int, benchmark_fence: int) -> None:
        fields: dict[str, Any] = {
            "tombstone_watermark": tombstone_watermark,
            "benchmark_fence": benchmark_fence,
        }
        super().__init__(**fields)

    def of(self, fence_kind: str) -> int:
        """The watermark of one fence."""
        return self.tombstone_watermark if fence_kind == "tombstone" else self.benchmark_fence

    def pair(self) -> tuple[int, int]:
        return (self.tombstone_watermark, self.benchmark_fence)


class FenceAdvance(Contract):
    """What one fence advance did: the entries' sequence range, the hits, closed permits.

    ``hits`` maps each hit subject digest to the fence seqs that hit it; on the wire it is
    the count per subject (the sequence numbers are in ``fence_hits``)."""

    kind: FenceKind = Field(serialization_alias="fence")
    first_seq: int
    watermark: int
    hits: dict[str, list[int]] = Field(default_factory=dict)
    closed_permits: list[str] = Field(default_factory=list)

    @field_serializer("hits")
    def _hit_counts(self, hits: dict[str, list[int]]) -> dict[str, int]:
        return {digest: len(seqs) for digest, seqs in sorted(hits.items())}


class TombstoneEntry(Contract):
    """One row of the tombstone fence."""

    seq: int
    sample_id: str
    reason: str
    actor: str
    state: str
    created_at: str


class BenchmarkEntry(Contract):
    """One row of the benchmark fence."""

    seq: int
    content_digest: str
    benchmark: str
    actor: str
    created_at: str


def read_fences(conn: Connection) -> Fences:
    row = one(conn, "SELECT tombstone_watermark, benchmark_fence FROM fences WHERE id = 1")
    if row is None:
        raise NotFoundError(
            "gate has no fences row; run `relgate init`", object="fences", check="initialised"
        )
    return Fences(int(row["tombstone_watermark"]), int(row["benchmark_fence"]))


def fenced_entries(conn: Connection, fences: Fences) -> tuple[set[str], set[str]]:
    """Sample ids tombstoned and content digests fenced at or below ``fences``."""
    tombs = rows(
        conn, "SELECT sample_id FROM tombstones WHERE seq <= :w", {"w": fences.tombstone_watermark}
    )
    bench = rows(
        conn,
        "SELECT content_digest FROM benchmark_items WHERE seq <= :w",
        {"w": fences.benchmark_fence},
    )
    return {t["sample_id"] for t in tombs}, {b["content_digest"] for b in bench}


def append_entries(
    conn: Connection, fence_kind: str, values: list[str], *, note: str, actor: str, now: str
) -> tuple[int, int]:
    """Append ``values`` after the current watermark and move it; (first seq, watermark)."""
    column, insert = _FENCE_SQL[fence_kind]
    first = read_fences(conn).of(fence_kind) + 1
    for offset, value in enumerate(values):
        execute(
            conn, insert, {"s": first + offset, "v": value, "note": note, "a": actor, "now": now}
        )
    watermark = first + len(values) - 1
    execute(conn, _UPDATE_WATERMARK[column], {"w": watermark, "now": now})
    return first, watermark


def entries_after(
    conn: Connection, fence_kind: str, since: int
) -> list[TombstoneEntry] | list[BenchmarkEntry]:
    """Fence entries with seq above ``since``, in order."""
    if fence_kind == "tombstone":
        found = rows(conn, "SELECT * FROM tombstones WHERE seq > :s ORDER BY seq", {"s": since})
        return [TombstoneEntry.model_validate(r) for r in found]
    found = rows(conn, "SELECT * FROM benchmark_items WHERE seq > :s ORDER BY seq", {"s": since})
    return [BenchmarkEntry.model_validate(r) for r in found]
