"""Membership from pinned sources: read, transform, select, fence, split, sort.

The one function that turns pinned source versions into a membership table.  The builder
runs it to produce a snapshot; validation and replay run it again from the manifest alone
and diff the results against what was stored.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass

import polars as pl
import pyarrow as pa

from relgate.documents.membership import COLUMNS
from relgate.documents.policy import Selection, SplitPolicy
from relgate.documents.source_pins import SourceEntry
from relgate.records.record_schema import ID_COLUMN, RecordSchema
from relgate.records.values import content_digests
from relgate.sources.source import Source

#: Rows per selection batch.
BATCH_ROWS = 262_144
#: The column selection's verdict is held in while a batch is filtered.
_KEEP = "__relgateSelected"
#: The polars schema of a member batch.
MEMBER_FRAME_SCHEMA = pl.Schema({c: pl.String() for c in COLUMNS})


@dataclass(frozen=True)
class Fenced:
    """Fence entries at or below the watermarks a snapshot is built against."""

    sample_ids: frozenset[str]
    content_digests: frozenset[str]


class Selector:
    """Selection as a stream of member batches; ``counts`` fill in as batches are drawn."""

    def __init__(
        self,
        *,
        transform: Callable[[pl.LazyFrame], pl.LazyFrame],
        records: RecordSchema,
        selection: Selection,
        split: SplitPolicy,
        fenced: Fenced,
        canary: Callable[[pl.DataFrame], pl.DataFrame] | None = None,
        keep_content: bool = False,
        observer: Callable[[pl.DataFrame], None] | None = None,
    ) -> None:
        self.transform = transform
        self.records = records
        self.selection = selection
        self.split = split
        self.canary = canary
        #: sees every batch of kept rows with content and split (build-time statistics)
        self.observer = observer
        own = [c for c in records.column_names if c != ID_COLUMN]
        self.columns = [*COLUMNS, *own] if keep_content else list(COLUMNS)
        self.tomb_ids = pl.Series("t", sorted(fenced.sample_ids), dtype=pl.String)
        self.bench_digests = pl.Series("b", sorted(fenced.content_digests), dtype=pl.String)
        self.counts = dict.fromkeys(
            (
                "sourceRows",
                "excludedByTransform",
                "excludedBySelection",
                "selected",
                "excludedTombstoned",
                "excludedBenchmark",
            ),
            0,
        )

    def batch(self, frame: pl.DataFrame) -> pl.DataFrame:
        """The members of one source batch (``sourceId`` already set), unsorted."""
        counts = self.counts
        if self.canary is not None:
            frame = self.canary(frame)
        expression = self.selection.expression(self.records).fill_null(value=False)
        transformed = self.transform(frame.lazy()).with_columns(expression.alias(_KEEP)).collect()
        keep = transformed[_KEEP]
        kept_rows = int(keep.sum())
        # Each counter is counted where it happens, so the validation report's row
        # accounting (source rows = transform drops + selection drops + selected) is a check.
        counts["excludedByTransform"] += frame.height - transformed.height
        counts["excludedBySelection"] += transformed.height - kept_rows
        selected = transformed.filter(keep).drop(_KEEP)
        counts["selected"] += selected.height
        digests = content_digests(selected.to_arrow(), self.records)
        selected = selected.with_columns(pl.Series("logicalContentDigest", digests))
        tomb = selected["sampleId"].is_in(self.tomb_ids.implode())
        bench = selected["logicalContentDigest"].is_in(self.bench_digests.implode())
        counts["excludedTombstoned"] += int(tomb.sum())
        counts["excludedBenchmark"] += int((bench & ~tomb).sum())
        kept = selected.filter(~tomb & ~bench)
        splits = pl.Series("split", self.split.assign(kept["sampleId"].to_arrow()))
        kept = kept.with_columns(splits)
        if self.observer is not None:
            self.observer(kept)
        return kept.select(self.columns)

    def members(
        self, sources: Mapping[str, Source], entries: Sequence[SourceEntry]
    ) -> pl.DataFrame:
        """Every member batch, sorted by sampleId in memory (for callers that need the
        whole table; build and validation stream :meth:`batches` instead)."""
        parts = list(self.batches(sources, entries))
        if not parts:
            return pl.DataFrame(schema=self.frame_schema)
        return pl.concat(parts, how="vertical").sort("sampleId", maintain_order=True)

    @property
    def frame_schema(self) -> pl.Schema:
        """The polars schema of a member batch (with content when it is kept)."""
        if self.columns == list(COLUMNS):
            return MEMBER_FRAME_SCHEMA
        empty = pl.from_arrow(self.records.arrow_schema().empty_table())
        if not isinstance(empty, pl.DataFrame):  # a Table always gives a DataFrame
            raise TypeError("polars gave a Series for an arrow table")
        typed = dict(empty.schema)
        return pl.Schema({c: typed.get(c, pl.String()) for c in self.columns})

    def batches(
        self, sources: Mapping[str, Source], entries: Sequence[SourceEntry]
    ) -> Iterator[pl.DataFrame]:
        """Member batches of every pinned source in order (each source read in batches)."""
        for entry in entries:
            for table in _rebatched(sources[entry.id].read_batches(entry)):
                self.counts["sourceRows"] += table.num_rows
                frame = pl.from_arrow(table)
                if not isinstance(frame, pl.DataFrame):  # a Table always gives a DataFrame
                    raise TypeError(f"polars gave {type(frame).__name__} for an arrow table")
                yield self.batch(frame.with_columns(pl.lit(entry.id).alias("sourceId")))


def _rebatched(tables: Iterable[pa.Table]) -> Iterator[pa.Table]:
    """Source batches regrouped to about :data:`BATCH_ROWS` rows (bounded transient memory)."""
    held: list[pa.Table] = []
    rows = 0
    for table in tables:
        held.append(table)
        rows += table.num_rows
        if rows >= BATCH_ROWS:
            yield pa.concat_tables(held).combine_chunks()
            held, rows = [], 0
    if held and rows:
        yield pa.concat_tables(held).combine_chunks()
