"""Diff two snapshots, the replay canary, and prove (non-)membership of a sample id."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

import numpy as np
import polars as pl
from pydantic import Field, StrictInt, StrictStr

from relgate.catalog.snapshot_table import get_snapshot
from relgate.documents import snapshot_manifest as mf
from relgate.documents.policy import BASIS_POINTS
from relgate.errors import RejectedError
from relgate.gate.transitions import open_gate
from relgate.integrity.contract import Contract
from relgate.integrity.hashing import sha256_rows
from relgate.integrity.merkle import LeafProof, MerkleTree
from relgate.integrity.tuples import MemberTuple
from relgate.snapshot import statistics as st
from relgate.snapshot.validate import Canary
from relgate.workspace import Workspace


class OldNew(Contract):
    old: StrictInt
    new: StrictInt


class CountDelta(OldNew):
    delta: StrictInt


class DiffExamples(Contract):
    added: tuple[StrictStr, ...]
    deleted: tuple[StrictStr, ...]


class CountRow(Contract):
    """One split's or source's member count, old vs new."""

    name: StrictStr
    old: StrictInt
    new: StrictInt
    delta: StrictInt


class BucketRow(Contract):
    """Records in one token-length bucket, old vs new."""

    bucket: StrictInt
    range: StrictStr
    old: StrictInt
    new: StrictInt
    delta: StrictInt


class HistogramDiff(Contract):
    """A token-length histogram (overall, or one split) old vs new, bucket by bucket."""

    name: StrictStr
    buckets: tuple[BucketRow, ...]
    divergence_ppm: StrictInt


class LabelRow(Contract):
    """One label value old vs new; a side is null when the value is not among that
    snapshot's top values (it is counted in its ``other``)."""

    value: StrictStr | None
    old: StrictInt | None
    new: StrictInt | None


class LabelDiff(Contract):
    column: StrictStr | None
    values: tuple[LabelRow, ...]
    other: OldNew
    divergence_ppm: StrictInt


class Distributions(Contract):
    """Distribution differences from the two snapshots' statistics documents.

    ``divergencePpm`` is the total variation distance (half the L1 distance between the
    two normalized distributions) in parts per million, rounded half up: 0 = identical,
    1000000 = disjoint.  For labels it is computed over the values among both snapshots'
    top values with everything else pooled per side (a lower bound when a side has more
    values than it lists)."""

    by_split: tuple[CountRow, ...]
    by_source: tuple[CountRow, ...]
    split_divergence_ppm: StrictInt
    source_divergence_ppm: StrictInt
    token_lengths: HistogramDiff
    token_lengths_by_split: tuple[HistogramDiff, ...]
    label: LabelDiff | None


class SnapshotDiff(Contract):
    """What changed between two snapshots' member tables (and, when both snapshots have
    statistics, their distributions)."""

    old: StrictStr
    new: StrictStr
    counts: OldNew
    additions: StrictInt
    deletions: StrictInt
    content_changes: StrictInt
    split_migrations: dict[StrictStr, StrictInt]
    by_source: dict[StrictStr, CountDelta]
    by_split: dict[StrictStr, CountDelta]
    examples: DiffExamples
    distributions: Distributions | None = Field(
        default=None, exclude_if=lambda value: value is None
    )


class ProvenLeaf(Contract):
    """One leaf of a proof: its index, the member tuple and the audit path (hex)."""

    index: StrictInt
    member: MemberTuple = Field(alias="tuple")
    path: tuple[StrictStr, ...]


class MembershipProof(Contract):
    """An RFC 6962 inclusion proof, or non-inclusion by the two adjacent neighbours;
    :func:`relgate.integrity.merkle.check_proof` verifies its JSON."""

    kind: Literal["inclusion", "non-inclusion"]
    sample_id: StrictStr
    snapshot: StrictStr
    root: StrictStr
    size: StrictInt
    schema_digest: StrictStr
    leaves: tuple[ProvenLeaf, ...]


def load_manifest(ws: Workspace, digest: str) -> mf.SnapshotManifest:
    """The verified manifest of a catalogued snapshot (at the envelope version its row names)."""
    row = get_snapshot(ws.db, digest)
    return mf.load(ws.store, ws.trusted_keys, digest, row.envelope_version)


def load_members(ws: Workspace, digest: str) -> pl.DataFrame:
    return ws.membership.read(load_manifest(ws, digest).members_ref)


def _counts(frame: pl.DataFrame, column: str) -> dict[str, int]:
    return {
        str(r[column]): int(r["len"]) for r in frame.group_by(column).len().iter_rows(named=True)
    }


def _delta(a: pl.DataFrame, b: pl.DataFrame, column: str) -> dict[str, CountDelta]:
    ca, cb = _counts(a, column), _counts(b, column)
    return {
        k: CountDelta(old=ca.get(k, 0), new=cb.get(k, 0), delta=cb.get(k, 0) - ca.get(k, 0))
        for k in sorted(set(ca) | set(cb))
    }


def diff(ws: Workspace, old: str, new: str, *, sample_limit: int = 20) -> SnapshotDiff:
    """Additions, deletions, content changes, split migrations, per-source/split deltas."""
    old_manifest, new_manifest = load_manifest(ws, old), load_manifest(ws, new)
    a = ws.membership.read(old_manifest.members_ref)
    b = ws.membership.read(new_manifest.members_ref)
    old_stats, new_stats = st.load(ws, old_manifest), st.load(ws, new_manifest)
    joined = a.join(b, on="sampleId", how="full", suffix="_new", coalesce=True)
    added = joined.filter(pl.col("sourceId").is_null())
    deleted = joined.filter(pl.col("sourceId_new").is_null())
    both = joined.filter(pl.col("sourceId").is_not_null() & pl.col("sourceId_new").is_not_null())
    moved = both.filter(pl.col("split") != pl.col("split_new"))
    changed = both.filter(pl.col("logicalContentDigest") != pl.col("logicalContentDigest_new"))
    migrations = {
        f"{r['split']}->{r['split_new']}": int(r["len"])
        for r in moved.group_by("split", "split_new").len().iter_rows(named=True)
    }
    return SnapshotDiff(
        old=old,
        new=new,
        counts=OldNew(old=a.height, new=b.height),
        additions=added.height,
        deletions=deleted.height,
        content_changes=changed.height,
        split_migrations=migrations,
        by_source=_delta(a, b, "sourceId"),
        by_split=_delta(a, b, "split"),
        examples=DiffExamples(
            added=tuple(added["sampleId"].head(sample_limit).to_list()),
            deleted=tuple(deleted["sampleId"].head(sample_limit).to_list()),
        ),
        distributions=distributions(old_stats, new_stats)
        if old_stats is not None and new_stats is not None
        else None,
    )


PPM = 1_000_000


def divergence_ppm(old: Sequence[int], new: Sequence[int]) -> int:
    """Total variation distance of two count vectors (same categories) in ppm, exact
    integer arithmetic rounded half up (an empty side against a non-empty one is 1e6)."""
    a, b = sum(old), sum(new)
    if a == 0 or b == 0:
        return 0 if a == b else PPM
    spread = sum(abs(x * b - y * a) for x, y in zip(old, new, strict=True))
    denominator = 2 * a * b
    return (spread * PPM + denominator // 2) // denominator


def _count_rows(old: Sequence[st.GroupCount], new: Sequence[st.GroupCount]) -> tuple[CountRow, ...]:
    a = {g.name: g.members for g in old}
    b = {g.name: g.members for g in new}
    return tuple(
        CountRow(name=k, old=a.get(k, 0), new=b.get(k, 0), delta=b.get(k, 0) - a.get(k, 0))
        for k in sorted(set(a) | set(b))
    )


def _rows_ppm(rows: Sequence[CountRow]) -> int:
    return divergence_ppm([r.old for r in rows], [r.new for r in rows])


def _histogram_diff(name: str, old: Sequence[int], new: Sequence[int]) -> HistogramDiff:
    rows = tuple(
        BucketRow(bucket=b, range=st.bucket_label(b), old=x, new=y, delta=y - x)
        for b, (x, y) in enumerate(zip(old, new, strict=True))
    )
    return HistogramDiff(name=name, buckets=rows, divergence_ppm=divergence_ppm(old, new))


def _label_diff(
    old: st.LabelDistribution | None, new: st.LabelDistribution | None
) -> LabelDiff | None:
    if old is None and new is None:
        return None
    a = {c.value: c.count for c in old.top} if old is not None else {}
    b = {c.value: c.count for c in new.top} if new is not None else {}
    values = sorted(set(a) | set(b), key=lambda v: (v is None, v or ""))
    both = [v for v in values if v in a and v in b]
    total_a = sum(a.values()) + (old.other if old is not None else 0)
    total_b = sum(b.values()) + (new.other if new is not None else 0)
    pooled_a = total_a - sum(a[v] for v in both)
    pooled_b = total_b - sum(b[v] for v in both)
    return LabelDiff(
        column=new.column if new is not None else old.column if old is not None else None,
        values=tuple(LabelRow(value=v, old=a.get(v), new=b.get(v)) for v in values),
        other=OldNew(old=old.other if old else 0, new=new.other if new else 0),
        divergence_ppm=divergence_ppm(
            [*(a[v] for v in both), pooled_a], [*(b[v] for v in both), pooled_b]
        ),
    )


def distributions(old: st.SnapshotStatistics, new: st.SnapshotStatistics) -> Distributions:
    """Old vs new counts, token-length histograms and label distribution."""
    by_split = _count_rows(old.by_split, new.by_split)
    by_source = _count_rows(old.by_source, new.by_source)
    empty = (0,) * (st.MAX_BUCKET + 1)
    split_a = {h.name: h.counts for h in old.token_lengths_by_split}
    split_b = {h.name: h.counts for h in new.token_lengths_by_split}
    return Distributions(
        by_split=by_split,
        by_source=by_source,
        split_divergence_ppm=_rows_ppm(by_split),
        source_divergence_ppm=_rows_ppm(by_source),
        token_lengths=_histogram_diff("all", old.token_lengths.counts, new.token_lengths.counts),
        token_lengths_by_split=tuple(
            _histogram_diff(k, split_a.get(k, empty), split_b.get(k, empty))
            for k in sorted(set(split_a) | set(split_b))
        ),
        label=_label_diff(old.label, new.label),
    )


def shadow_diff(ws: Workspace, alias: str, new: str) -> SnapshotDiff | None:
    """The diff of ``new`` against the alias's active snapshot (None when there is none,
    or it is ``new`` itself)."""
    active = open_gate(ws).alias(alias, "snapshot").active_digest
    if active is None or active == new:
        return None
    return diff(ws, active, new)


def canary_filter(basis_points: int) -> Canary:
    """A fixed canary: ids whose SHA-256 bucket is below ``basis_points`` of 10000."""

    def keep(frame: pl.DataFrame) -> pl.DataFrame:
        if basis_points >= BASIS_POINTS:
            return frame
        raw = sha256_rows(frame["sampleId"].to_arrow(), prefix=b"canary\x00")
        words = np.frombuffer(raw, dtype=">u4").reshape(-1, 8)[:, 0].astype(np.int64)
        return frame.filter(pl.Series(words % BASIS_POINTS < basis_points, dtype=pl.Boolean))

    return keep


def prove(ws: Workspace, digest: str, sample_id: str) -> MembershipProof:
    """An RFC 6962 inclusion proof, or a non-inclusion proof by adjacent neighbours."""
    manifest = load_manifest(ws, digest)
    stored = ws.membership.read(manifest.members_ref)
    schema = manifest.record_schema
    tuples = [MemberTuple(r[0], r[1], r[2], r[3], r[4], schema) for r in stored.iter_rows()]
    tree = MerkleTree([t.encode() for t in tuples])
    root = "sha256:" + tree.root.hex()
    if root != manifest.tuple_root:
        raise RejectedError(
            "membership table does not match the manifest's tuple root",
            object="snapshot",
            check="tuple-root",
            digest=digest,
        )
    pos = int(stored["sampleId"].search_sorted(sample_id, side="left"))

    def leaf(i: int) -> ProvenLeaf:
        return ProvenLeaf.parse(LeafProof(i, tuples[i], tree.audit_path(i)).to_json())

    included = pos < len(tuples) and tuples[pos].sample_id == sample_id
    leaves: tuple[ProvenLeaf, ...]
    if included:
        leaves = (leaf(pos),)
    else:
        leaves = tuple(leaf(i) for i in (pos - 1, pos) if 0 <= i < len(tuples))
    return MembershipProof(
        kind="inclusion" if included else "non-inclusion",
        sample_id=sample_id,
        snapshot=digest,
        root=root,
        size=len(tuples),
        schema_digest=schema,
        leaves=leaves,
    )
