"""Signed validation and replay reports: comparators, coverage, lineage, orphans, tamper."""

import io
import json
import math
import os
import subprocess
import sys
from decimal import Decimal

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given
from hypothesis import strategies as st
from support.snapshots import build, build_validated, state_of
from support.workspaces import make_workspace

from relgate.catalog.snapshot_table import snapshot_reports
from relgate.documents.policy import PredicatePolicy
from relgate.errors import IntegrityError, RejectedError, UsageError
from relgate.gate.transitions import open_gate
from relgate.lifecycle.collector import plan_gc
from relgate.objects.layout import report_key
from relgate.records.record_schema import FieldSpec, RecordSchema, TokenRule
from relgate.snapshot import reports
from relgate.snapshot.comparator import (
    EXACT,
    NUMERIC,
    Comparator,
    ContentHasher,
    compare,
    content_hash,
    fingerprint,
    fingerprint_parquet,
    read_fingerprint,
    tolerance_text,
)
from relgate.snapshot.coverage import PPM
from relgate.snapshot.replay import (
    REFERENCE_CHECK,
    REPLAY_CHECK,
    ReplayReport,
    fingerprint_reference,
    replay,
)
from relgate.snapshot.validate import (
    ORPHAN_IDS,
    UNEXPLAINED_ROWS,
    ValidationReport,
    validate_snapshot,
)
from relgate.sources.cdc import append_segment

from .test_faults import _forge

RELGATE = [sys.executable, "-m", "relgate.cli"]


def _cli(ws, *args, expect=0):
    proc = subprocess.run(
        [*RELGATE, "--home", str(ws.home), *args, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "RELGATE_HASH_WORKERS": "1"},
        check=False,
    )
    assert proc.returncode == expect, (args, proc.returncode, proc.stdout, proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _flip_byte(ws, row):
    path = ws.store.local_path(report_key(row.report_digest), row.report_version)
    os.chmod(path, 0o644)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


# -- replay reports ------------------------------------------------------------------------
def test_replay_report_carries_the_comparator_and_verifies_then_tamper_is_refused(ws):
    result = build_validated(ws)
    out = _cli(ws, "snapshot", "replay", result.digest, "--canary-bp", "4000")
    assert out["comparator"] == {"name": EXACT, "version": 1, "tolerance": "0"}
    assert out["canary"]["basisPoints"] == 4000 and out["result"] == "REPRODUCED"
    assert out["replayHashes"]["expected"] == out["replayHashes"]["replayed"]
    assert out["expectedIds"] == out["replayedIds"] > 0 and out["mismatchingIds"] == 0
    (row,) = snapshot_reports(ws.db, result.digest, "replay")
    assert (row.report_digest, row.comparator, row.canary_bp) == (out["report"], f"{EXACT}@1", 4000)
    opened = reports.open_report(ws, row, ReplayReport)  # signature by the workspace key
    assert opened.to_json() == {k: v for k, v in out.items() if k != "report"}
    shown = _cli(ws, "snapshot", "show", result.digest)
    assert [r["kind"] for r in shown["reports"]] == ["validation", "replay"]
    assert _cli(ws, "snapshot", "replay", result.digest, "--show")["report"] == row.report_digest
    _flip_byte(ws, row)
    refused = _cli(ws, "snapshot", "replay", result.digest, "--show", expect=3)
    assert refused["check"] == "storage-digest" and refused["digest"] == row.report_digest
    listed = _cli(ws, "snapshot", "reports", result.digest, "--verify", expect=3)
    assert listed["check"] == "storage-digest"


def test_numeric_replay_of_a_text_schema_compares_digests_and_names_its_tolerance(ws):
    result = build_validated(ws)
    report = replay(ws, result.digest, comparator=Comparator.of(NUMERIC, "0.0010"))
    assert report.to_json()["comparator"] == {"name": NUMERIC, "version": 1, "tolerance": "0.001"}
    assert report.numeric_columns == () and report.reference == "membership"
    assert report.identical and report.stored_fingerprint is None


def test_a_diverging_replay_is_stored_signed_and_refused_with_exit_3(ws):
    base = build_validated(ws)
    members = ws.membership.read(base.manifest.members_ref)
    swapped = members.with_columns(
        pl.when(pl.col("sampleId") == members["sampleId"][0])
        .then(pl.lit("sha256:" + "0" * 64))
        .otherwise(pl.col("logicalContentDigest"))
        .alias("logicalContentDigest")
    )
    digest = _forge(ws, base, swapped)
    out = _cli(ws, "snapshot", "replay", digest, expect=3)
    assert out["check"] == REPLAY_CHECK and out["result"] == "DIVERGED"
    assert out["mismatchingIds"] == 1 and out["examples"] == [members["sampleId"][0]]
    (row,) = snapshot_reports(ws.db, digest, "replay")
    assert (
        row.outcome == "DIVERGED"
        and reports.open_report(ws, row, ReplayReport).mismatching_ids == 1
    )


def test_numeric_replay_without_a_fingerprint_is_refused(ws):
    result = build_validated(ws)
    replay(ws, result.digest, canary_bp=2000)  # text schema: reproduces, stores no fingerprint
    with pytest.raises(RejectedError) as err:
        fingerprint_reference(ws, result.digest, 1000)
    assert err.value.check == REFERENCE_CHECK and err.value.digest == result.digest


# -- comparators on Arrow tables (a float content column) ----------------------------------
SCORED = RecordSchema(
    name="test.scored.v1",
    fields=(
        FieldSpec(name="sampleId", type="string"),
        FieldSpec(name="score", type="float64"),
        FieldSpec(name="text", type="string"),
    ),
    content=("score", "text"),
    tokens=TokenRule(kind="none"),
)


def _scored(scores, ids=None, texts=None):
    ids = ids or [f"s{i}" for i in range(len(scores))]  # sorted below 10 rows
    texts = texts or [f"text {i}" for i in range(len(scores))]
    return pa.table(
        {"sampleId": ids, "score": pa.array(scores, pa.float64()), "text": texts},
    )


def test_numeric_comparator_within_and_beyond_tolerance():
    reference = fingerprint(_scored([0.5, 1.25, float("nan"), 3.0]), SCORED)
    assert reference.column_names == ["sampleId", "score", "otherContentDigest"]
    close = fingerprint(_scored([0.5004, 1.2496, float("nan"), 3.0]), SCORED)
    far = fingerprint(_scored([0.5, 1.2, float("nan"), 3.0]), SCORED)
    numeric = Comparator.of(NUMERIC, "0.001")
    within = compare(numeric, reference, close)
    assert within.identical and within.numeric_columns == ("score",)
    beyond = compare(numeric, reference, far)
    assert (beyond.mismatching, beyond.examples) == (1, ("s1",))
    exact = compare(Comparator.of(EXACT), reference, close)
    assert (exact.mismatching, exact.examples) == (2, ("s0", "s1"))
    text_changed = fingerprint(
        _scored([0.5, 1.25, float("nan"), 3.0], texts=["text 0", "x", "text 2", "text 3"]),
        SCORED,
    )
    assert compare(numeric, reference, text_changed).examples == ("s1",)  # other content exact
    other_ids = fingerprint(_scored([0.5, 1.25, 0.0, 3.0], ids=["s0", "s1", "s9", "s3"]), SCORED)
    moved = compare(numeric, reference, other_ids)
    assert (moved.missing, moved.extra, moved.examples) == (1, 1, ("s2", "s9"))


def test_bad_tolerances_and_names_are_usage_errors():
    for bad in ("-1", "1e-3", "nan", "inf", "", "0x1", "1.", ".5"):
        with pytest.raises(UsageError) as err:
            Comparator.of(NUMERIC, bad)
        assert err.value.check == "replay-tolerance"
    with pytest.raises(UsageError):
        Comparator.of(EXACT, "0.1")
    with pytest.raises(UsageError):
        Comparator.of("relgate.replay.fuzzy")


@given(st.decimals(min_value=0, max_value=10**6, allow_nan=False, allow_infinity=False, places=6))
def test_tolerance_text_is_canonical_and_keeps_the_value(value):
    text = tolerance_text(format(value, "f"))
    assert Decimal(text) == value and tolerance_text(text) == text
    assert text == ("0" if value == 0 else format(value.normalize(), "f"))


scores = st.lists(st.floats(allow_nan=True, allow_infinity=True, width=64), min_size=0, max_size=20)


@given(scores)
def test_fingerprint_parquet_round_trips_and_holds_no_text(values):
    ids = [f"s{i:03d}" for i in range(len(values))]
    table = fingerprint(_scored(values, ids=ids), SCORED)
    back = read_fingerprint(fingerprint_parquet(table), subject="t")
    assert back.schema.equals(table.schema) and compare(Comparator.of(EXACT), table, back).identical
    assert "text" not in back.column_names
    got = back["score"].to_pylist()
    assert all(
        (math.isnan(a) and math.isnan(b)) or a == b for a, b in zip(got, values, strict=True)
    )


@given(st.lists(st.lists(st.text(max_size=8), max_size=4), max_size=5))
def test_content_hash_does_not_depend_on_chunking(chunks):
    hasher, by_series = ContentHasher(), ContentHasher()
    for chunk in chunks:
        hasher.add(chunk)
        by_series.add_series(pl.Series(chunk, dtype=pl.String))
    whole = content_hash([d for chunk in chunks for d in chunk])
    assert hasher.hexdigest == by_series.hexdigest == whole


def test_unreadable_fingerprint_is_refused():
    with pytest.raises(RejectedError) as err:
        read_fingerprint(b"not parquet", subject="fp")
    assert err.value.check == "fingerprint"
    sink = io.BytesIO()
    pq.write_table(pa.table({"x": [1]}), sink)
    with pytest.raises(RejectedError):
        read_fingerprint(sink.getvalue(), subject="fp")


# -- validation reports --------------------------------------------------------------------
def test_validation_report_sections_on_the_demo_corpus(ws):
    result = build(ws)
    out = _cli(ws, "snapshot", "validate", result.digest)
    report = ValidationReport.parse({k: v for k, v in out.items() if k != "report"})
    manifest = result.manifest
    assert report.outcome == "VALIDATED" and report.checks[ORPHAN_IDS] == 0
    assert [c.source for c in report.coverage] == [e.id for e in manifest.sources]
    assert all(
        c.covered and c.events_after_pin == 0 and c.current == c.pinned for c in report.coverage
    )
    assert {c.source: c.unversioned_objects for c in report.coverage} == {
        "tickets-eu": None,
        "forum": 0,
        "chat-cdc": None,
    }
    members = manifest.member_count
    assert report.lineage.to_json() == {
        "members": members,
        "traced": members,
        "untraced": 0,
        "completenessPpm": PPM,
    }
    rows = {r.source: r for r in report.row_accounting}
    assert {s: r.members for s, r in rows.items()} == manifest.member_counts_by_source
    assert all(r.unexplained == 0 for r in rows.values())
    assert sum(r.source_rows - r.dropped_by_selection for r in rows.values()) == members
    assert report.replay_hashes.expected == report.replay_hashes.replayed
    assert report.set_differences.missing == report.set_differences.extra == 0
    generated = manifest.provenance.was_generated_by
    assert report.build_latency.started_at == generated.started_at_time
    assert report.build_latency.seconds >= 0
    assert report.tombstones.matches_in_members == 0
    (row,) = snapshot_reports(ws.db, result.digest, "validation")
    assert row.report_digest == out["report"]
    assert reports.open_report(ws, row, ValidationReport) == report


def test_tombstoned_rows_are_counted_as_excluded_and_explained(ws):
    victim = ws.membership.read(build_validated(ws).manifest.members_ref)["sampleId"][3]
    open_gate(ws).add_tombstones([victim], reason="erasure", actor="t")
    report = validate_snapshot(ws, build(ws).digest, actor="t")
    assert report.ok, report.failing
    assert report.tombstones.excluded_at_selection == 1
    assert sum(r.excluded_tombstoned for r in report.row_accounting) == 1
    assert report.checks[UNEXPLAINED_ROWS] == 0


def test_a_member_traced_to_no_pinned_version_is_an_orphan_and_invalid(ws):
    base = build_validated(ws)
    members = ws.membership.read(base.manifest.members_ref)
    chat = members.filter(pl.col("sourceId") == "chat-cdc")["sampleId"][0]
    forged = members.with_columns(
        pl.when(pl.col("sampleId") == chat)
        .then(pl.lit("offset:99999"))
        .otherwise(pl.col("sourceVersion"))
        .alias("sourceVersion")
    )
    digest = _forge(ws, base, forged)
    out = _cli(ws, "snapshot", "validate", digest, expect=3)
    assert out["check"] == ORPHAN_IDS and out["digest"] == digest
    assert out["checks"][ORPHAN_IDS] == 1 and out["lineage"]["untraced"] == 1
    assert out["lineage"]["completenessPpm"] == (members.height - 1) * PPM // members.height
    assert state_of(ws, digest) == "REJECTED"


def test_an_injected_extra_member_is_an_orphan_and_unexplained(ws):
    base = build_validated(ws)
    members = ws.membership.read(base.manifest.members_ref)
    extra = members.head(1).with_columns(pl.lit("forum/zz-injected").alias("sampleId"))
    digest = _forge(ws, base, pl.concat([members, extra]).sort("sampleId"))
    report = validate_snapshot(ws, digest, actor="t")
    assert report.outcome == "REJECTED" and report.primary_check == ORPHAN_IDS
    assert report.checks[ORPHAN_IDS] == 1 and report.checks[UNEXPLAINED_ROWS] == 1
    assert report.set_differences.examples.extra == ("forum/zz-injected",)
    source = extra["sourceId"][0]
    (row,) = [r for r in report.row_accounting if r.source == source]
    assert row.unexplained == -1


def test_a_dropped_member_is_unexplained_rows(ws):
    base = build_validated(ws)
    members = ws.membership.read(base.manifest.members_ref)
    digest = _forge(ws, base, members.slice(1))
    out = _cli(ws, "snapshot", "validate", digest, expect=3)
    assert out["check"] == UNEXPLAINED_ROWS and out["checks"][UNEXPLAINED_ROWS] == 1
    assert out["setDifferences"]["examples"]["missing"] == [members["sampleId"][0]]


def test_a_late_cdc_event_shows_in_coverage(ws):
    result = build(ws)
    pin = result.manifest.source("chat-cdc").to_json()
    append_segment(
        ws.store,
        "cdc/chat/",
        [
            {
                "offset": 60,
                "commit": pin["commitWatermark"] - 1,
                "op": "upsert",
                "id": "chat/late-coverage",
                "lang": "en",
                "text": "committed before the watermark, arrived after the pin",
            }
        ],
    )
    report = validate_snapshot(ws, result.digest, actor="t")
    assert report.outcome == "INCOMPLETE"
    (chat,) = [c for c in report.coverage if c.source == "chat-cdc"]
    assert chat.to_json() == {
        "source": "chat-cdc",
        "kind": "cdc",
        "pinned": "offset:59",
        "current": "offset:60",
        "eventsAfterPin": 1,
        "lateEvents": 1,
        "covered": False,
    }
    assert all(c.covered for c in report.coverage if c.source != "chat-cdc")


def test_a_tampered_validation_report_is_refused(ws):
    result = build_validated(ws)
    (row,) = snapshot_reports(ws.db, result.digest, "validation")
    _flip_byte(ws, row)
    with pytest.raises(IntegrityError) as err:
        reports.open_report(ws, row, ValidationReport)
    assert err.value.check == "storage-digest" and err.value.digest == row.report_digest


# -- a float content column end to end -----------------------------------------------------
@pytest.fixture
def scored(tmp_path):
    """A workspace whose only source is an object prefix of records with a float score."""
    workspace = make_workspace(tmp_path / "scored", seed=False)
    lines = [
        json.dumps({"id": f"scores/{i:04d}", "score": i / 7, "text": f"record {i}"})
        for i in range(40)
    ]
    workspace.store.put("raw/scores/part-0.jsonl", "\n".join(lines).encode())
    workspace.config["sources"] = [
        {"id": "scores", "kind": "object-prefix", "prefix": "raw/scores/"}
    ]
    snapshot = workspace.config.setdefault("snapshot", {})
    snapshot["recordSchema"] = SCORED.to_json()
    snapshot["selection"] = PredicatePolicy().to_json()
    snapshot["transform"] = "registry.local/identity:v1"
    workspace.save()
    yield workspace
    workspace.close()


def test_numeric_replay_compares_floats_against_the_exact_replays_fingerprint(scored):
    ws = scored
    result = build_validated(ws)
    assert result.manifest.record_schema_document == SCORED
    with pytest.raises(RejectedError) as err:
        replay(ws, result.digest, comparator=Comparator.of(NUMERIC, "0.0001"))
    assert err.value.check == REFERENCE_CHECK  # no exact replay has stored values yet
    exact = replay(ws, result.digest, canary_bp=6000)
    stored = exact.stored_fingerprint
    assert exact.identical and exact.numeric_columns == ("score",)
    assert stored is not None and stored.canary_basis_points == 6000
    assert stored.rows == exact.expected_ids and stored.numeric_columns == ("score",)
    fp = read_fingerprint(ws.cas.get(stored.content_digest, stored.version), subject="fp")
    assert fp.column_names == ["sampleId", "score", "otherContentDigest"]  # no text
    numeric = replay(ws, result.digest, canary_bp=3000, comparator=Comparator.of(NUMERIC, "0.0001"))
    assert numeric.identical and numeric.reference == "fingerprint"
    assert numeric.reference_fingerprint == stored
    assert numeric.to_json()["comparator"]["tolerance"] == "0.0001"
    with pytest.raises(RejectedError) as wider:  # the fingerprint's canary is smaller
        replay(ws, result.digest, comparator=Comparator.of(NUMERIC, "0.0001"))
    assert wider.value.check == REFERENCE_CHECK
    rows = snapshot_reports(ws.db, result.digest, "replay")
    assert [(r.comparator, r.fingerprint_digest) for r in rows] == [
        (f"{EXACT}@1", stored.content_digest),
        (f"{NUMERIC}@1", None),
    ]


def test_the_collector_keeps_reports_and_fingerprints_of_a_retained_snapshot(scored):
    ws = scored
    result = build_validated(ws)
    stored = replay(ws, result.digest, canary_bp=5000).stored_fingerprint
    kept = {
        (report_key(r.report_digest), r.report_version)
        for r in snapshot_reports(ws.db, result.digest)
    }
    kept.add((report_key(stored.content_digest), stored.version))
    plan = plan_gc(ws, grace_seconds=0)
    assert not {(c.key, c.version_id) for c in plan.candidates} & kept
