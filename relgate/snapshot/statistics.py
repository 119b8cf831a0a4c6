"""Snapshot statistics: counts and distributions of a snapshot's members, no sample text.

Computed at build time in the same streaming pass as selection (the selector hands every
batch of kept rows, content included, to a :class:`StatisticsObserver` before it drops the
content), stored content-addressed and named by the manifest's ``statistics`` field
(``{uri, objectVersion, size}``, so garbage collection keeps it as long as the snapshot).

The document (``relgate.snapshot.statistics.v1``) holds, per split and per source, member
and token counts; a token-length histogram overall and per split; and, when the record
schema declares a ``label`` column, that column's value distribution (the
:data:`TOP_LABELS` most frequent values, then one ``other`` count).

Token-length buckets are fixed powers of two so that any two snapshots' histograms compare
bucket by bucket: bucket ``b`` counts records whose token count has bit length ``b``, i.e.
bucket 0 is exactly 0 tokens and bucket ``b >= 1`` is ``[2**(b-1), 2**b)``; the last
bucket, ``b = MAX_BUCKET``, is open-ended (``>= 2**(MAX_BUCKET-1)``).  ``bucketEdges``
lists each bucket's lower edge.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable
from typing import Final, Literal

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import Field, StrictInt, StrictStr

from relgate.documents import snapshot_manifest as mf
from relgate.errors import RejectedError
from relgate.integrity.contract import Contract
from relgate.records.record_schema import RecordSchema, arrow_type
from relgate.records.tokens import TokenizerBytes, token_counts
from relgate.snapshot.tokenizer import ROLE as TOKENIZER_ROLE
from relgate.workspace import Workspace

SCHEMA: Final = "relgate.snapshot.statistics.v1"
#: The open-ended last bucket: token counts of 2**24 and more.
MAX_BUCKET: Final = 25
#: Lower edge of every bucket (0, 1, 2, 4, ..., 2**24).
BUCKET_EDGES: Final = (0, *(1 << (b - 1) for b in range(1, MAX_BUCKET + 1)))
#: Label values listed by name; the rest are counted as ``other``.
TOP_LABELS: Final = 20


def bucket_label(bucket: int) -> str:
    """``0``, ``1``, ``2-3``, ..., ``16777216+``."""
    if bucket == 0:
        return "0"
    low = BUCKET_EDGES[bucket]
    if bucket == MAX_BUCKET:
        return f"{low}+"
    high = (1 << bucket) - 1
    return str(low) if low == high else f"{low}-{high}"


def buckets_of(tokens: np.ndarray) -> np.ndarray:
    """The bucket (bit length, capped at :data:`MAX_BUCKET`) of every token count."""
    counts = np.asarray(tokens, dtype=np.int64)
    _, exponent = np.frexp(counts.astype(np.float64))
    bits = np.where(counts > 0, exponent, 0).astype(np.int64)
    return np.minimum(bits, MAX_BUCKET)


class GroupCount(Contract):
    """Members and tokens of one split or source."""

    name: StrictStr
    members: StrictInt
    tokens: StrictInt


class Histogram(Contract):
    """Records per token-length bucket (index = bucket, see the module docstring)."""

    name: StrictStr
    counts: tuple[StrictInt, ...] = Field(min_length=MAX_BUCKET + 1, max_length=MAX_BUCKET + 1)


class LabelCount(Contract):
    value: StrictStr | None
    count: StrictInt


class LabelDistribution(Contract):
    """The label column's values: the most frequent, by count then value; the rest summed."""

    column: StrictStr
    distinct: StrictInt
    top: tuple[LabelCount, ...]
    other: StrictInt


class SnapshotStatistics(Contract):
    """The statistics document (see the module docstring)."""

    schema_name: Literal["relgate.snapshot.statistics.v1"] = Field(default=SCHEMA, alias="schema")
    record_schema: StrictStr
    members: StrictInt
    tokens: StrictInt
    bucket_edges: tuple[StrictInt, ...]
    by_split: tuple[GroupCount, ...]
    by_source: tuple[GroupCount, ...]
    token_lengths: Histogram
    token_lengths_by_split: tuple[Histogram, ...]
    label: LabelDistribution | None


def _histogram(name: str, cells: dict[int, int]) -> Histogram:
    return Histogram(name=name, counts=tuple(cells.get(b, 0) for b in range(MAX_BUCKET + 1)))


class StatisticsObserver:
    """Accumulates statistics over member batches (callable: the selector's observer)."""

    def __init__(self, records: RecordSchema, fetch: TokenizerBytes | None) -> None:
        self.records = records
        self.fetch = fetch
        #: (split, sourceId, bucket) -> [members, tokens]
        self.cells: dict[tuple[str, str, int], list[int]] = {}
        self.labels: Counter[str | None] = Counter()

    def _tokens(self, frame: pl.DataFrame) -> np.ndarray:
        rule = self.records.tokens
        table = frame.to_arrow()
        if rule.column is not None:  # polars hands back its own Arrow types: the declared one
            declared = arrow_type(self.records.field(rule.column).type)
            column = pc.cast(table.column(rule.column), declared)
            table = pa.table({rule.column: column})
        counts = token_counts(table, rule, self.fetch)
        return np.asarray(counts.to_numpy(zero_copy_only=False), dtype=np.int64)

    def __call__(self, frame: pl.DataFrame) -> None:
        if frame.height == 0:
            return
        tokens = self._tokens(frame)
        grouped = (
            pl.DataFrame(
                {
                    "split": frame["split"],
                    "sourceId": frame["sourceId"],
                    "bucket": buckets_of(tokens),
                    "tokens": tokens,
                }
            )
            .group_by("split", "sourceId", "bucket")
            .agg(pl.len().alias("members"), pl.col("tokens").sum())
        )
        for split, source, bucket, members, total in grouped.iter_rows():
            cell = self.cells.setdefault((str(split), str(source), int(bucket)), [0, 0])
            cell[0] += int(members)
            cell[1] += int(total)
        label = self.records.label
        if label is not None:
            values = frame[label].cast(pl.String)
            for value, count in values.value_counts().iter_rows():
                self.labels[value] += int(count)

    def _groups(self, axis: int) -> tuple[GroupCount, ...]:
        sums: dict[str, list[int]] = {}
        for key, (members, tokens) in self.cells.items():
            acc = sums.setdefault(str(key[axis]), [0, 0])
            acc[0] += members
            acc[1] += tokens
        return tuple(
            GroupCount(name=name, members=m, tokens=t) for name, (m, t) in sorted(sums.items())
        )

    def _label(self) -> LabelDistribution | None:
        if self.records.label is None:
            return None
        ranked = sorted(self.labels.items(), key=lambda kv: (-kv[1], kv[0] is None, kv[0] or ""))
        top = ranked[:TOP_LABELS]
        return LabelDistribution(
            column=self.records.label,
            distinct=len(ranked),
            top=tuple(LabelCount(value=v, count=c) for v, c in top),
            other=sum(c for _, c in ranked[TOP_LABELS:]),
        )

    def document(self) -> SnapshotStatistics:
        overall: dict[int, int] = {}
        per_split: dict[str, dict[int, int]] = {}
        for (split, _source, bucket), (members, _tokens) in self.cells.items():
            overall[bucket] = overall.get(bucket, 0) + members
            cells = per_split.setdefault(split, {})
            cells[bucket] = cells.get(bucket, 0) + members
        by_split = self._groups(0)
        return SnapshotStatistics(
            record_schema=self.records.digest(),
            members=sum(g.members for g in by_split),
            tokens=sum(g.tokens for g in by_split),
            bucket_edges=BUCKET_EDGES,
            by_split=by_split,
            by_source=self._groups(1),
            token_lengths=_histogram("all", overall),
            token_lengths_by_split=tuple(
                _histogram(name, cells) for name, cells in sorted(per_split.items())
            ),
            label=self._label(),
        )


def artifact_fetch(ws: Workspace, artifacts: Iterable[mf.ArtifactRef]) -> TokenizerBytes:
    """Tokenizer bytes by digest from the artifacts a build pins (exact versions)."""
    pinned = {a.digest: a for a in artifacts if a.role == TOKENIZER_ROLE}

    def fetch(digest: str) -> bytes:
        ref = pinned.get(digest)
        if ref is None:
            raise RejectedError(
                "the build pins no tokenizer with this digest",
                object=TOKENIZER_ROLE,
                check="tokenizer-digest",
                digest=digest,
            )
        return ws.cas.get(digest, ref.object_version, size=ref.size)  # bounded by the manifest

    return fetch


def store(ws: Workspace, statistics: SnapshotStatistics) -> mf.StatisticsRef:
    """Store the document content-addressed; the manifest's reference to it."""
    ref = ws.cas.put(statistics.canonical())
    return mf.StatisticsRef(uri=ref.uri, object_version=ref.version_id, size=ref.size)


def load(ws: Workspace, manifest: mf.SnapshotManifest) -> SnapshotStatistics | None:
    """The statistics a manifest names (digest-checked read), or None if it names none."""
    ref = manifest.statistics
    if ref is None:
        return None
    data = ws.cas.get(ref.content_ref.digest, ref.object_version, size=ref.size)
    return SnapshotStatistics.parse(json.loads(data), what=f"statistics {ref.uri}")
