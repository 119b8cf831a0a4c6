"""Membership from pinned sources: read, transform, select, fence, split, sort.

The one function that turns pinned source versions into a membership table.  The builder
runs it to produce a snapshot; validation and replay run it again from the manifest alone
and diff the results against what was stored.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import polars as pl

from relgate.snapshot.membership import COLUMNS
from relgate.snapshot.policy import SelectionPolicy, SplitPolicy
from relgate.sources.schema import content_digests
from relgate.sources.source import Source, SourceEntry

#: Rows per selection batch.
BATCH_ROWS = 1_000_000


@dataclass(frozen=True)
class Fenced:
    """Fence entries at or below the watermarks a snapshot is built against."""

    sample_ids: frozenset[str]
    content_digests: frozenset[str]


@dataclass(frozen=True)
class SelectionResult:
    """The sorted member table and the counters of each selection stage."""

    members: pl.DataFrame
    counts: dict[str, int]


def select_members(
    sources: Mapping[str, Source],
    entries: Sequence[SourceEntry],
    *,
    transform: Callable[[pl.LazyFrame], pl.LazyFrame],
    selection: SelectionPolicy,
    split: SplitPolicy,
    fenced: Fenced,
    canary: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
    keep_content: bool = False,
) -> SelectionResult:
    """Members sorted by sampleId; with ``keep_content`` also the transformed ``lang`` and
    ``text`` columns (what a shard writer needs; never stored in a membership table)."""
    columns = [*COLUMNS, "lang", "text"] if keep_content else COLUMNS
    tomb_ids = list(fenced.sample_ids)
    bench_digests = list(fenced.content_digests)
    parts: list[pl.DataFrame] = []
    counts = dict.fromkeys(("sourceRows", "selected", "excludedTombstoned", "excludedBenchmark"), 0)
    for entry in entries:
        table = sources[entry.id].read(entry)
        counts["sourceRows"] += table.num_rows
        # Batches bound the transient memory of transform, hashing and filtering; only
        # the membership columns (and content, for writers) outlive a batch.
        for offset in range(0, max(table.num_rows, 1), BATCH_ROWS):
            frame = pl.from_arrow(table.slice(offset, BATCH_ROWS))
            if not isinstance(frame, pl.DataFrame):  # a Table always gives a DataFrame
                raise TypeError(f"polars gave {type(frame).__name__} for an arrow table")
            frame = frame.with_columns(pl.lit(entry.id).alias("sourceId"))
            if canary is not None:
                frame = canary(frame)
            selected = transform(frame.lazy()).filter(selection.expression()).collect()
            counts["selected"] += selected.height
            digests = content_digests(selected["lang"].to_arrow(), selected["text"].to_arrow())
            selected = selected.with_columns(pl.Series("logicalContentDigest", digests))
            tomb = selected["sampleId"].is_in(tomb_ids)
            bench = selected["logicalContentDigest"].is_in(bench_digests)
            counts["excludedTombstoned"] += int(tomb.sum())
            counts["excludedBenchmark"] += int((bench & ~tomb).sum())
            kept = selected.filter(~tomb & ~bench)
            splits = pl.Series("split", split.assign(kept["sampleId"].to_arrow()))
            parts.append(kept.with_columns(splits).select(columns))
    schema = {c: pl.String for c in columns}
    members = (
        pl.concat(parts, how="vertical").sort("sampleId") if parts else pl.DataFrame(schema=schema)
    )
    counts["members"] = members.height
    return SelectionResult(members, counts)
