"""Membership from pinned sources: read, transform, select, fence, split, sort.

The one function that turns pinned source versions into a membership table.  The builder
runs it to produce a snapshot; validation and replay run it again from the manifest alone
and diff the results against what was stored.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import polars as pl

from relgate.membership import COLUMNS
from relgate.policy import SelectionPolicy, SplitPolicy
from relgate.records import content_digests
from relgate.sources.base import Source


@dataclass(frozen=True)
class Fenced:
    """Fence entries at or below the watermarks a snapshot is built against."""

    sample_ids: frozenset[str]
    content_digests: frozenset[str]


@dataclass
class SelectionResult:
    members: pl.DataFrame
    counts: dict[str, int]


def select_members(
    sources: dict[str, Source],
    entries: list[dict[str, Any]],
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
    frames = []
    read_rows = 0
    for entry in entries:
        table = sources[entry["id"]].read(entry)
        read_rows += table.num_rows
        frame = pl.from_arrow(table)
        assert isinstance(frame, pl.DataFrame)
        frames.append(frame.with_columns(pl.lit(entry["id"]).alias("sourceId")))
    if frames:
        raw = pl.concat(frames, how="vertical")
    else:
        raw = pl.DataFrame(
            schema={
                "sampleId": pl.String,
                "lang": pl.String,
                "text": pl.String,
                "sourceVersion": pl.String,
                "sourceId": pl.String,
            }
        )
    if canary is not None:
        raw = canary(raw)
    selected = transform(raw.lazy()).filter(selection.expression()).collect()
    after_selection = selected.height
    digests = content_digests(selected["lang"].to_arrow(), selected["text"].to_arrow())
    selected = selected.with_columns(pl.from_arrow(digests).alias("logicalContentDigest"))  # type: ignore[union-attr]
    tomb = selected["sampleId"].is_in(list(fenced.sample_ids))
    bench = selected["logicalContentDigest"].is_in(list(fenced.content_digests))
    kept = selected.filter(~tomb & ~bench)
    splits = pl.from_arrow(split.assign(kept["sampleId"].to_arrow()))
    columns = [*COLUMNS, "lang", "text"] if keep_content else COLUMNS
    members = kept.with_columns(splits.alias("split")).select(columns).sort("sampleId")  # type: ignore[union-attr]
    counts = {
        "sourceRows": read_rows,
        "selected": after_selection,
        "excludedTombstoned": int(tomb.sum()),
        "excludedBenchmark": int((bench & ~tomb).sum()),
        "members": members.height,
    }
    return SelectionResult(members, counts)
