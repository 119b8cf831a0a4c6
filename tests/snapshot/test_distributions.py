"""Shadow diff with distributions: build-time statistics of real demo snapshots, checked
against an independent reference computed here from the members' content, and the
old-vs-new distributions of ``relgate snapshot diff --json``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from collections import Counter
from fractions import Fraction

import numpy as np
import polars as pl
from hypothesis import given
from hypothesis import strategies as st
from support import corpora
from support.releases import overwrite_in_place
from support.snapshots import build_validated
from tokenizers import Tokenizer

from relgate.holds.refs import version_refs
from relgate.snapshot import statistics
from relgate.snapshot.diff import diff, divergence_ppm, load_manifest
from relgate.snapshot.validate import recompute

RELGATE = [sys.executable, "-m", "relgate"]
_RUN = re.compile(rb"[\x21-\xff]+")


def reference(ws, digest):
    """Histograms, counts and labels from the members' content, by hand (no relgate code
    beyond re-running selection to get the content)."""
    manifest = load_manifest(ws, digest)
    members = recompute(ws, manifest, keep_content=True)
    count = _token_counter(ws, manifest)
    overall = [0] * (statistics.MAX_BUCKET + 1)
    per_split: dict[str, list[int]] = {}
    splits, sources, labels = Counter(), Counter(), Counter()
    for row in members.iter_rows(named=True):
        tokens = count(row["text"])
        bucket = min(tokens.bit_length(), statistics.MAX_BUCKET)
        overall[bucket] += 1
        per_split.setdefault(row["split"], [0] * (statistics.MAX_BUCKET + 1))[bucket] += 1
        splits[row["split"]] += 1
        sources[row["sourceId"]] += 1
        labels[row["lang"]] += 1
    return overall, per_split, splits, sources, labels


def _token_counter(ws, manifest):
    """The manifest's token rule applied with the ``tokenizers`` package directly (the
    demo text corpus pins a trained tokenizer), or whitespace runs by regex."""
    rule = manifest.record_schema_document.tokens
    if rule.kind == "whitespace-runs":
        return lambda text: len(_RUN.findall(text.encode()))
    ref = manifest.artifact("tokenizer", rule.tokenizer)
    data = ws.store.get(ref.content_ref.key, ref.object_version)
    tokenizer = Tokenizer.from_str(data.decode())
    return lambda text: len(tokenizer.encode(text, add_special_tokens=False).ids)


def _tvd_ppm(a, b):
    """Total variation distance in ppm, with fractions (another route than the code's)."""
    ta, tb = sum(a), sum(b)
    tvd = sum(abs(Fraction(x, ta) - Fraction(y, tb)) for x, y in zip(a, b, strict=True)) / 2
    return int(tvd * 1_000_000 + Fraction(1, 2))


def _change_a_source(ws):
    long_text = " ".join(f"word{i}" for i in range(300))
    rows = [{"id": f"forum/long-{i}", "lang": "fr", "text": f"{long_text} {i}"} for i in range(25)]
    ws.store.put(
        "raw/forum/thread-long.jsonl", b"".join(json.dumps(r).encode() + b"\n" for r in rows)
    )


def test_statistics_match_an_independent_reference_and_the_diff_carries_them(ws):
    first = build_validated(ws)
    _change_a_source(ws)
    second = build_validated(ws)
    for snap in (first, second):
        stats = statistics.load(ws, load_manifest(ws, snap.digest))
        overall, per_split, splits, sources, labels = reference(ws, snap.digest)
        assert list(stats.token_lengths.counts) == overall
        assert {h.name: list(h.counts) for h in stats.token_lengths_by_split} == per_split
        assert {g.name: g.members for g in stats.by_split} == dict(splits)
        assert {g.name: g.members for g in stats.by_source} == dict(sources)
        assert {c.value: c.count for c in stats.label.top} == dict(labels)
        assert stats.label.other == 0 and stats.members == snap.manifest.member_count
        some_text = recompute(ws, load_manifest(ws, snap.digest), keep_content=True)["text"][0]
        assert some_text not in json.dumps(stats.to_json())  # no sample text in it

    d = diff(ws, first.digest, second.digest)
    dist = d.distributions
    old_ref, new_ref = reference(ws, first.digest), reference(ws, second.digest)
    assert old_ref[0] != new_ref[0]  # the long posts moved the histogram
    assert [b.old for b in dist.token_lengths.buckets] == old_ref[0]
    assert [b.new for b in dist.token_lengths.buckets] == new_ref[0]
    assert dist.token_lengths.divergence_ppm == _tvd_ppm(old_ref[0], new_ref[0]) > 0
    label = {r.value: (r.old, r.new) for r in dist.label.values}
    assert label == {k: (old_ref[4][k], new_ref[4][k]) for k in set(old_ref[4]) | set(new_ref[4])}
    assert label["fr"][1] - label["fr"][0] == 25
    keys = sorted(old_ref[4])
    assert dist.label.divergence_ppm == _tvd_ppm(
        [old_ref[4][k] for k in keys], [new_ref[4][k] for k in keys]
    )
    forum = next(r for r in dist.by_source if r.name == "forum")
    assert forum.delta == 25

    proc = subprocess.run(
        [
            *RELGATE,
            "--home",
            str(ws.home),
            "snapshot",
            "diff",
            first.digest,
            second.digest,
            "--json",
        ],
        capture_output=True,
        text=True,
        env={**os.environ, "RELGATE_HASH_WORKERS": "1"},
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    out = json.loads(proc.stdout)
    assert (
        out["distributions"]["tokenLengths"]["divergencePpm"] == dist.token_lengths.divergence_ppm
    )
    assert [b["new"] for b in out["distributions"]["tokenLengths"]["buckets"]] == new_ref[0]
    assert out["distributions"]["label"]["column"] == "lang"
    human = subprocess.run(
        [*RELGATE, "--home", str(ws.home), "snapshot", "diff", first.digest, second.digest],
        capture_output=True,
        text=True,
        check=False,
    )
    assert human.returncode == 0 and "token length" in human.stdout and "#" in human.stdout


def test_statistics_are_referenced_for_garbage_collection(ws):
    snap = build_validated(ws)
    manifest = load_manifest(ws, snap.digest)
    assert manifest.statistics is not None
    with ws.db.tx() as conn:
        refs = version_refs(ws, conn, "snapshot", snap.digest)
    held = {(r.key, r.version_id) for r in refs if r.role == "statistics"}
    ref = manifest.statistics.content_ref
    assert held == {(ref.key, ref.version_id)}


counts = st.lists(st.integers(0, 10**6), min_size=1, max_size=8)


@given(counts, counts)
def test_divergence_is_total_variation_in_ppm(a, b):
    n = min(len(a), len(b))
    a, b = a[:n], b[:n]
    got = divergence_ppm(a, b)
    assert 0 <= got <= 1_000_000
    assert got == divergence_ppm(b, a)
    if sum(a) and sum(b):
        assert got == _tvd_ppm(a, b)
        assert divergence_ppm(a, a) == 0


@given(st.integers(0, 2**40))
def test_buckets_are_bit_lengths(tokens):
    bucket = int(statistics.buckets_of(np.array([tokens]))[0])
    assert bucket == min(tokens.bit_length(), statistics.MAX_BUCKET)
    assert statistics.BUCKET_EDGES[bucket] <= tokens
    if bucket < statistics.MAX_BUCKET:
        assert tokens < (1 << bucket)


def test_label_distribution_lists_the_top_values_and_pools_the_rest():
    langs = [f"l{i:02d}" for i in range(25) for _ in range(i + 1)]  # l24 most frequent
    frame = pl.DataFrame(
        {
            "sampleId": [f"s{i}" for i in range(len(langs))],
            "lang": langs,
            "text": ["a b c"] * len(langs),
            "sourceId": ["src"] * len(langs),
            "split": ["train"] * len(langs),
        }
    )
    observer = statistics.StatisticsObserver(corpora.TEXT, None)
    observer(frame.head(100))
    observer(frame.slice(100))  # two batches accumulate
    doc = observer.document()
    assert doc.label.distinct == 25
    assert [c.value for c in doc.label.top] == [f"l{i:02d}" for i in range(24, 4, -1)]
    assert doc.label.other == sum(range(1, 6))
    assert doc.token_lengths.counts[2] == len(langs)  # 3 tokens: bucket 2 ([2, 4))
    none = statistics.StatisticsObserver(corpora.BINARY, None)
    assert none.records.tokens.kind == "none"


def test_a_rewritten_statistics_object_is_refused_by_the_diff(ws):
    first = build_validated(ws)
    second = build_validated(ws)
    ref = load_manifest(ws, second.digest).statistics.content_ref
    path = ws.store.local_path(ref.key, ref.version_id)
    overwrite_in_place(path, path.read_bytes().replace(b'"members":', b'"members": 1, "x":', 1))
    proc = subprocess.run(
        [
            *RELGATE,
            "--home",
            str(ws.home),
            "snapshot",
            "diff",
            first.digest,
            second.digest,
            "--json",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 3, proc.stderr
    assert json.loads(proc.stdout)["digest"] == ref.digest
