"""The gate's linearizability checker: a small concurrent load (threads, each with its
own catalog connection) on SQLite and PostgreSQL has no violations, and every kind of
broken history is detected."""

import pytest

from bench import gate as load
from relgate.gate.history import GateEvent, GateHistory, violations

ROOT, OTHER = "sha256:" + "1" * 64, "sha256:" + "2" * 64


def test_concurrent_admissions_are_linearizable(tmp_path, db_url):
    home = tmp_path / "home"
    built = load.world(home, db_url, load.CAS_ROUNDS * 4)
    result = load.run_load(home, built, clients=4, per_client=25, spawn=False)
    assert result["violationSample"] == []
    assert result["violations"] == 0
    assert result["admissions"] == 100
    assert result["casWinners"] == load.CAS_ROUNDS
    assert result["refusedAfterRevoke"] >= 1


def _admit(permit, started, finished, generation=1, tomb=0):
    return GateEvent(op="admit", ok=True, started=started, finished=finished, alias="train",
                     root=ROOT, permit_id=permit, run_id="run-" + permit, generation=generation,
                     tombstone_watermark=tomb, benchmark_fence=0)  # fmt: skip


def _permit(permit, generation=1, tomb=0, state="OPEN", root=ROOT):
    return {"permit_id": permit, "root_digest": root, "alias": "train", "generation": generation,
            "tombstone_watermark": tomb, "benchmark_fence": 0, "state": state}  # fmt: skip


def _history(**changes):
    base = {
        "permits": [_permit("p1"), _permit("p2")],
        "runs": [
            {"run_id": "run-p1", "permit_id": "p1", "root_digest": ROOT, "state": "ADMITTED"},
            {"run_id": "run-p2", "permit_id": "p2", "root_digest": ROOT, "state": "ADMITTED"},
        ],
        "alias_history": [{"name": "train", "generation": 1, "digest": ROOT, "at": "t1"}],
        "fence_hits": [],
        "tombstone_seqs": [],
        "benchmark_seqs": [],
        "watermarks": (0, 0),
    }
    return GateHistory(**{**base, **changes})


def test_a_consistent_history_has_no_violations():
    events = [_admit("p1", 0, 1), _admit("p2", 2, 3)]
    assert violations(events, _history()) == []


def test_overlapping_operations_may_see_older_state():
    """Only an operation that began after another ended must see its state: p2 overlaps p1."""
    events = [_admit("p1", 0, 3, generation=2), _admit("p2", 1, 4, generation=1)]
    history = _history(permits=[_permit("p1", generation=2), _permit("p2", generation=1)])
    assert violations(events, history) == []


BROKEN = {
    "duplicate permit": ([_admit("p1", 0, 1), _admit("p1", 2, 3)], {}, "given to 2 clients"),
    "phantom permit": ([_admit("p1", 0, 1)], {}, "no client got it"),
    "lost permit": ([_admit("p1", 0, 1), _admit("p2", 2, 3), _admit("p3", 4, 5)], {}, "not stored"),
    "run without permit": (
        [_admit("p1", 0, 1), _admit("p2", 2, 3)],
        {"runs": [{"run_id": "r9", "permit_id": "p9", "root_digest": ROOT, "state": "ADMITTED"}]},
        "never issued",
    ),
    "admitted past the revoke fence": (
        [_admit("p1", 0, 1), _admit("p2", 2, 3, tomb=1)],
        {
            "permits": [_permit("p1", state="CLOSED"), _permit("p2", tomb=1)],
            "fence_hits": [{"subject_digest": ROOT, "fence_kind": "tombstone", "fence_seq": 1}],
            "tombstone_seqs": [1],
            "watermarks": (1, 0),
        },
        "issued after tombstone entry 1",
    ),
    "left open past the revoke fence": (
        [_admit("p1", 0, 1), _admit("p2", 2, 3)],
        {
            "fence_hits": [{"subject_digest": ROOT, "fence_kind": "tombstone", "fence_seq": 1}],
            "tombstone_seqs": [1],
            "watermarks": (1, 0),
        },
        "still open after tombstone entry 1",
    ),
    "permit stored twice": (
        [_admit("p1", 0, 1), _admit("p2", 2, 3)],
        {"permits": [_permit("p1"), _permit("p1"), _permit("p2")]},
        "permit p1 stored 2 times",
    ),
    "two runs on one permit": (
        [_admit("p1", 0, 1), _admit("p2", 2, 3)],
        {
            "runs": [
                {"run_id": "run-p1", "permit_id": "p1", "root_digest": ROOT, "state": "ADMITTED"},
                {"run_id": "run-x", "permit_id": "p1", "root_digest": ROOT, "state": "ADMITTED"},
                {"run_id": "run-p2", "permit_id": "p2", "root_digest": ROOT, "state": "ADMITTED"},
            ]
        },
        "permit p1 has 2 runs",
    ),
    "admitted past an older revoke fence entry": (
        [_admit("p1", 0, 1), _admit("p2", 2, 3, tomb=2)],
        {
            "permits": [_permit("p1", state="CLOSED"), _permit("p2", tomb=2)],
            "fence_hits": [{"subject_digest": ROOT, "fence_kind": "tombstone", "fence_seq": 1}],
            "tombstone_seqs": [1, 2],
            "watermarks": (2, 0),
        },
        "issued after tombstone entry 1",
    ),
    "fence sequence gap": (
        [_admit("p1", 0, 1), _admit("p2", 2, 3)],
        {"tombstone_seqs": [1, 3], "watermarks": (3, 0)},
        "without gaps",
    ),
    "alias generation gap": (
        [_admit("p1", 0, 1), _admit("p2", 2, 3)],
        {
            "alias_history": [
                {"name": "train", "generation": 1, "digest": ROOT, "at": "t1"},
                {"name": "train", "generation": 3, "digest": OTHER, "at": "t2"},
            ]
        },
        "generations are not",
    ),
    "stale read after a newer commit": (
        [_admit("p1", 0, 1, generation=2), _admit("p2", 2, 3, generation=1)],
        {"permits": [_permit("p1", generation=2), _permit("p2", generation=1)]},
        "saw generation 1 after 2 committed",
    ),
}


@pytest.mark.parametrize("case", sorted(BROKEN))
def test_the_checker_detects_a_broken_history(case):
    events, changes, expected = BROKEN[case]
    found = violations(events, _history(**changes))
    assert any(expected in v for v in found), found


def test_two_cas_winners_for_one_generation_are_detected():
    def cas(root, ok):
        return GateEvent(op="activate", ok=ok, started=0, finished=1, alias="train", root=root,
                         expected_generation=1, generation=2 if ok else None)  # fmt: skip

    history = _history(
        permits=[],
        runs=[],
        alias_history=[
            {"name": "train", "generation": 1, "digest": ROOT, "at": "t1"},
            {"name": "train", "generation": 2, "digest": OTHER, "at": "t2"},
        ],
    )
    assert violations([cas(OTHER, ok=True), cas(ROOT, ok=False)], history) == []
    found = violations([cas(OTHER, ok=True), cas(ROOT, ok=True)], history)
    assert any("2 winners" in v for v in found), found
