"""The streaming build/validate path against the in-memory reference, byte for byte.

The reference is computed here with the simple functions (``recompute`` into memory,
``membership_parquet``, ``tuple_root`` over the whole table, one ``multiset_diff`` and
the validator's former in-memory checks); the streaming pieces are forced to spill,
merge and split row groups by small run, chunk and row-group sizes.
"""

from __future__ import annotations

import os
import random
from pathlib import Path

import polars as pl
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from relgate_trust.digests import sha256_digest
from support.snapshots import build

from relgate.documents import membership
from relgate.documents.membership import MembershipWriter, Tally, membership_parquet, tuple_root
from relgate.documents.policy import SplitPolicy
from relgate.gate.fences import Fences
from relgate.integrity import merkle
from relgate.integrity.hashing import digests_to_strings
from relgate.snapshot import external_sort, selection
from relgate.snapshot.build import fenced_at
from relgate.snapshot.diff import load_manifest
from relgate.snapshot.external_sort import SortedRuns, aligned
from relgate.snapshot.selection import MEMBER_FRAME_SCHEMA
from relgate.snapshot.validate import (
    ZERO_CHECKS,
    ValidationFacts,
    multiset_diff,
    recompute,
    validate_snapshot,
)
from relgate.sources import source
from relgate.transforms.builtin import normalize_v1, normalize_v1_fast
from tests.snapshot.test_faults import _forge as forge

SCHEMA_DIGEST = "sha256:" + "ab" * 32


def _members(n: int, seed: int = 0, dup_every: int = 0) -> pl.DataFrame:
    rng = random.Random(seed)
    ids = [f"s/{rng.randrange(10**9):09d}" for _ in range(n)]
    if dup_every:
        ids += ids[::dup_every]
    split = SplitPolicy()
    frame = pl.DataFrame(
        {
            "sampleId": ids,
            "sourceId": [rng.choice(["a", "b"]) for _ in ids],
            "sourceVersion": ["iceberg:1"] * len(ids),
            "logicalContentDigest": digests_to_strings(os.urandom(32 * len(ids))).to_pylist(),
        }
    )
    return frame.with_columns(pl.Series("split", split.assign(frame["sampleId"].to_arrow())))


def _streamed(frame: pl.DataFrame, batch: int, run_rows: int) -> list[pl.DataFrame]:
    with SortedRuns(MEMBER_FRAME_SCHEMA, run_rows=run_rows) as sorter:
        for start in range(0, frame.height, batch):
            sorter.add(frame.slice(start, batch))
        return list(sorter.merged(chunk_rows=97))


@pytest.mark.parametrize(("n", "batch", "run_rows"), [(0, 10, 5), (1, 10, 5), (3000, 170, 400)])
def test_sorted_runs_equal_a_stable_sort(n: int, batch: int, run_rows: int) -> None:
    frame = _members(n, seed=n, dup_every=7)
    chunks = _streamed(frame, batch, run_rows)
    got = pl.concat(chunks) if chunks else frame.clear()
    assert got.equals(frame.sort("sampleId", maintain_order=True))


def test_writer_and_tally_match_the_reference(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(membership, "ROW_GROUP_ROWS", 256)
    frame = _members(2500, seed=3)
    reference = frame.sort("sampleId")
    writer = MembershipWriter(tmp_path / "m.parquet")
    tally = Tally(SCHEMA_DIGEST)
    for chunk in _streamed(frame, 300, 700):
        writer.write(chunk)
        tally.add(chunk)
    writer.close()
    assert (tmp_path / "m.parquet").read_bytes() == membership_parquet(reference.to_arrow())
    assert tally.tuple_root == tuple_root(reference, SCHEMA_DIGEST)
    assert tally.rows == reference.height
    want = reference.group_by("split").len().sort("split")
    assert tally.splits == dict(want.iter_rows())


def test_aligned_diff_sums_to_the_whole_diff() -> None:
    stored = _members(1200, seed=5, dup_every=11).sort("sampleId", maintain_order=True)
    expected = _members(1000, seed=5).sort("sampleId", maintain_order=True)
    expected = expected.with_columns(
        pl.when(pl.int_range(pl.len()) % 13 == 0)
        .then(pl.lit("validation"))
        .otherwise(pl.col("split"))
        .alias("split")
    )
    whole = multiset_diff(stored, expected)
    total = dict.fromkeys(whole, 0)
    empty = pl.DataFrame(schema=MEMBER_FRAME_SCHEMA)
    streams = [
        (stored.slice(s, 53) for s in range(0, stored.height, 53)),
        (expected.slice(s, 71) for s in range(0, expected.height, 71)),
    ]
    for got, want in aligned(streams, [empty, empty]):
        for name, count in multiset_diff(got, want).items():
            total[name] += count
    assert total == whole
    assert whole["duplicateIds"] and whole["extraMembers"] and whole["splitMismatches"]


texts = st.text(
    alphabet=st.sampled_from(list("ab Z\t\n\r\x0b\x0c\x85\xa0\u2028\u3000e\u0301\u00e9#  ")),
    max_size=30,
)


@settings(max_examples=200, deadline=None)
@given(st.lists(texts, max_size=20))
def test_fast_normalize_is_normalize(values: list[str]) -> None:
    frame = pl.DataFrame(
        {"text": values, "lang": [" EN "] * len(values)},
        schema={"text": pl.String, "lang": pl.String},
    )
    assert normalize_v1_fast(frame.lazy()).collect().equals(normalize_v1(frame.lazy()).collect())


def _reference_checks(ws, manifest):
    """The validator's checks and facts as the in-memory implementation computed them."""
    checks = dict.fromkeys(ZERO_CHECKS, 0)
    stored = ws.membership.read(manifest.members_ref)
    facts = {"members": stored.height, "manifestMembers": manifest.member_count}
    split_names = [n for n, _ in manifest.policies.split.buckets]
    per_id_splits = stored.group_by("sampleId").agg(pl.col("split").n_unique().alias("n"))
    checks["idsInSeveralSplits"] = per_id_splits.filter(pl.col("n") > 1).height
    checks["unknownSplits"] = stored.filter(~pl.col("split").is_in(split_names)).height
    source_ids = [e.id for e in manifest.sources]
    checks["unknownOrigins"] = stored.filter(~pl.col("sourceId").is_in(source_ids)).height
    fenced = fenced_at(ws, Fences(manifest.tombstone_watermark, manifest.benchmark_fence))
    checks["tombstoneHits"] = stored.filter(
        pl.col("sampleId").is_in(list(fenced.sample_ids))
    ).height
    checks["benchmarkHits"] = stored.filter(
        pl.col("logicalContentDigest").is_in(list(fenced.content_digests))
    ).height
    recomputed = recompute(ws, manifest)
    checks.update(multiset_diff(stored, recomputed))
    # Orphans: stored ids the recompute does not produce, or not under a (source, version)
    # the recompute read; unexplained rows: per-source member counts that differ.
    produced = recomputed.select("sampleId", "sourceId", "sourceVersion")
    traced = stored.join(produced, on=["sampleId", "sourceId", "sourceVersion"], how="semi")
    checks["orphanIds"] = stored["sampleId"].n_unique() - traced["sampleId"].n_unique()
    per_source = (
        stored.group_by("sourceId")
        .len()
        .join(recomputed.group_by("sourceId").len(), on="sourceId", how="full", coalesce=True)
    )
    checks["unexplainedRows"] = int(
        (per_source["len"].fill_null(0) - per_source["len_right"].fill_null(0)).abs().sum()
    )
    root = tuple_root(stored, manifest.record_schema)
    facts["tupleRoot"] = root
    checks["tupleRootMismatch"] = int(root != manifest.tuple_root)
    checks["memberCountMismatch"] = int(stored.height != manifest.member_count)
    splits = {r["split"]: r["len"] for r in stored.group_by("split").len().iter_rows(named=True)}
    checks["splitCountMismatch"] = int(splits != manifest.splits)
    facts["splits"] = splits
    return checks, facts


@pytest.fixture
def small_sizes(monkeypatch):
    """Sizes small enough that the seeded corpus spills runs, merges and splits groups."""
    monkeypatch.setattr(external_sort, "RUN_ROWS", 5)
    monkeypatch.setattr(external_sort, "READ_ROWS", 3)
    monkeypatch.setattr(external_sort, "MIN_READ_ROWS", 2)
    monkeypatch.setattr(membership, "ROW_GROUP_ROWS", 4)
    monkeypatch.setattr(merkle, "ACCUMULATOR_CHUNK", 4)
    monkeypatch.setattr(selection, "BATCH_ROWS", 7)
    monkeypatch.setattr(source, "BATCH_ROWS", 6)


def test_streamed_build_and_validation_equal_the_reference(ws, small_sizes):
    result = build(ws)
    manifest = load_manifest(ws, result.digest)
    reference = recompute(ws, manifest)
    assert reference.height == manifest.member_count > 10
    assert manifest.members_ref.digest == sha256_digest(membership_parquet(reference.to_arrow()))
    assert manifest.tuple_root == tuple_root(reference, manifest.record_schema)
    splits = reference.group_by("split").len().sort("split")
    assert manifest.splits == dict(splits.iter_rows())
    report = validate_snapshot(ws, result.digest, actor="test")
    checks, facts = _reference_checks(ws, manifest)
    assert report.outcome == "VALIDATED"
    assert report.checks == checks
    assert report.facts.to_json() == ValidationFacts.model_validate(facts).to_json()


def test_unsorted_table_with_duplicates_reports_as_the_reference(ws, small_sizes):
    base = build(ws)
    members = ws.membership.read(base.manifest.members_ref)
    forged = pl.concat([members.reverse(), members.head(3)])
    forged = forged.with_columns(
        pl.when(pl.int_range(pl.len()) == 1).then(pl.lit("test")).otherwise("split").alias("split")
    )
    digest = forge(ws, base, forged)
    report = validate_snapshot(ws, digest, actor="test")
    checks, facts = _reference_checks(ws, load_manifest(ws, digest))
    assert report.outcome == "REJECTED"
    assert report.checks == checks
    assert checks["duplicateIds"] == 3 and checks["tupleRootMismatch"] == 0
    assert checks["unexplainedRows"] == 3 and checks["orphanIds"] == 0  # duplicates, no orphan
    assert report.facts.to_json() == ValidationFacts.model_validate(facts).to_json()
