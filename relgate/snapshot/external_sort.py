"""Out-of-core sort by sampleId: sorted runs spilled to parquet, merged in key ranges.

:func:`aligned` walks several streams, each sorted by the key, in lock step: every step
yields one frame per stream holding exactly the rows whose keys fall in the same key
range, and the ranges of successive steps are disjoint and ascending.  Merging sorted
runs is a stable sort of each step's frames; the multiset diff of two sorted tables is
the sum of the diffs of their aligned steps (every check is local to a key).  Memory is
one read chunk per stream plus the rows sharing the step's last key.
"""

from __future__ import annotations

import tempfile
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path

import polars as pl
import pyarrow.parquet as pq

KEY = "sampleId"
#: Rows read from a spilled run at a time during the merge.
READ_ROWS = 65_536
#: Rows the merge reads ahead over all runs together (split between the runs), and the
#: least it reads from one run at a time.
MERGE_ROWS = 1_000_000
MIN_READ_ROWS = 8_192
#: Rows held in memory before they are sorted and spilled as one run.
RUN_ROWS = 2_000_000


class _Cursor:
    """One sorted stream with a buffer of rows not yet emitted."""

    def __init__(self, frames: Iterable[pl.DataFrame], empty: pl.DataFrame) -> None:
        self._frames = iter(frames)
        self.buffer = empty
        self.done = False

    def pull(self) -> None:
        """Append the stream's next non-empty frame to the buffer (or mark it done)."""
        for frame in self._frames:
            if frame.height:
                self.buffer = pl.concat([self.buffer, frame]) if self.buffer.height else frame
                return
        self.done = True

    def last(self) -> str:
        return str(self.buffer[KEY][-1])

    def take_through(self, frontier: str | None) -> pl.DataFrame:
        """Rows with key <= ``frontier`` (all rows for None), removed from the buffer."""
        if frontier is None:
            taken, self.buffer = self.buffer, self.buffer.clear()
            return taken
        cut = int(self.buffer[KEY].search_sorted(frontier, side="right"))
        taken, self.buffer = self.buffer[:cut], self.buffer[cut:]
        return taken


def aligned(
    streams: Sequence[Iterable[pl.DataFrame]], empties: Sequence[pl.DataFrame]
) -> Iterator[list[pl.DataFrame]]:
    """Per step, one frame per stream over the same key range (see the module text)."""
    cursors = [_Cursor(s, e) for s, e in zip(streams, empties, strict=True)]
    while True:
        for cur in cursors:
            if not cur.done and not cur.buffer.height:
                cur.pull()
        live = [c for c in cursors if not c.done]
        if not live:
            if any(c.buffer.height for c in cursors):
                yield [c.take_through(None) for c in cursors]
            return
        frontier = min(c.last() for c in live)
        for cur in live:
            while not cur.done and cur.last() == frontier:
                cur.pull()
        yield [c.take_through(frontier) for c in cursors]


def _run_frames(path: Path, rows: int) -> Iterator[pl.DataFrame]:
    for batch in pq.ParquetFile(path).iter_batches(batch_size=rows):
        frame = pl.from_arrow(batch)
        if isinstance(frame, pl.DataFrame):
            yield frame


class SortedRuns:
    """Frames in, one stable sort by key out; runs beyond :data:`RUN_ROWS` go to disk."""

    def __init__(self, schema: pl.Schema, run_rows: int | None = None) -> None:
        self._empty = pl.DataFrame(schema=schema)
        self._run_rows = run_rows or RUN_ROWS
        self._held: list[pl.DataFrame] = []
        self._held_rows = 0
        self._spill: tempfile.TemporaryDirectory[str] | None = None
        self._paths: list[Path] = []
        self.rows = 0

    def add(self, frame: pl.DataFrame) -> None:
        self._held.append(frame)
        self._held_rows += frame.height
        self.rows += frame.height
        if self._held_rows >= self._run_rows:
            self._flush()

    def _sorted_held(self) -> pl.DataFrame:
        held = pl.concat(self._held, how="vertical") if self._held else self._empty
        self._held, self._held_rows = [], 0
        return held.sort(KEY, maintain_order=True)

    def _flush(self) -> None:
        if self._spill is None:
            self._spill = tempfile.TemporaryDirectory(prefix="relgate-runs-")
        path = Path(self._spill.name) / f"run-{len(self._paths):05d}.parquet"
        # row groups of one merge read: the merge holds one row group per run, not 2M rows
        self._sorted_held().write_parquet(
            path, compression="lz4", statistics=False, row_group_size=READ_ROWS
        )
        self._paths.append(path)

    def merged(self, chunk_rows: int | None = None) -> Iterator[pl.DataFrame]:
        """The sorted rows in chunks (duplicates of a key in the order they were added)."""
        chunk_rows = chunk_rows or READ_ROWS
        if not self._paths:
            held = self._sorted_held()
            for start in range(0, held.height, chunk_rows):
                yield held.slice(start, chunk_rows)
            return
        if self._held:
            self._flush()
        per_run = max(MIN_READ_ROWS, MERGE_ROWS // len(self._paths))
        streams = [_run_frames(p, min(chunk_rows, per_run)) for p in self._paths]
        for parts in aligned(streams, [self._empty] * len(streams)):
            merged = pl.concat(parts, how="vertical")
            if merged.height:
                yield merged.sort(KEY, maintain_order=True)

    def close(self) -> None:
        if self._spill is not None:
            self._spill.cleanup()
            self._spill = None
        self._paths, self._held = [], []

    def __enter__(self) -> SortedRuns:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
