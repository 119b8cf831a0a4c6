"""Complaints need corroboration (coordinator/complaints.py): one host's word never demotes
or quarantines another; a host whose complaints are against everyone, or whose handshakes
fail both ways, is itself removed with its reason (real SQLite, a real signed manifest,
the coordinator on a test clock)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from test_coordinator import _a_chain_job, _clocked

from relgate_agent.contracts import ProgressReport
from relgate_agent.coordinator.jobstate import REMOVED, JobState, NotFound
from relgate_agent.coordinator.service import Coordinator


@pytest.fixture
def chain(
    tmp_path: Path, checkpoint
) -> Iterator[tuple[Coordinator, list[float], JobState, str, str]]:
    """A coordinator on a test clock and a job on it (rates that corroborate nothing):
    (coordinator, clock, job, an upstream, one of its children)."""
    now = [1000.0]
    c = _clocked(tmp_path, checkpoint, now, report_interval_s=0.5)
    try:
        job, up, child = _a_chain_job(c, checkpoint, corroborated=False)
        yield c, now, job, up, child
    finally:
        c.store.close()


def _complain(c: Coordinator, now: list[float], job: JobState, who: str, on: str, reason: str):
    for h in job.hosts.values():
        h.last_seen = now[0]  # everyone keeps reporting: alive to the sweep
    c.report_suspect(job.job_id, who, on, reason, 0)


def _kids(job: JobState, up: str) -> set[str]:
    return {k for ch in job.topology.stripes for k in ch.children(up)}


def test_one_reporters_word_never_demotes(chain) -> None:
    c, now, job, up, child = chain
    # the child receives from nobody: its handshakes may be what fails
    for _ in range(20):
        now[0] += 1.0
        _complain(c, now, job, child, up, "CONN_RESET")
    assert not job.hosts[up].demoted and job.hosts[up].state != REMOVED
    # the accused serves others at speed: a dispute, not evidence against it
    job.hosts[child].rx_bps, job.hosts[up].tx_bps = 5_000_000, 9_000_000
    for _ in range(10):
        now[0] += 1.0
        _complain(c, now, job, child, up, "CONN_RESET")
    assert not job.hosts[up].demoted
    # a STALLED upstream that receives nothing itself: its own upstream's stall
    job.hosts[up].tx_bps, job.hosts[up].rx_bps = 0, 0
    for _ in range(10):
        now[0] += 1.0
        _complain(c, now, job, child, up, "STALLED")
    assert not job.hosts[up].demoted


def test_a_second_reporter_corroborates(chain) -> None:
    c, now, job, up, child = chain
    second = next(iter(_kids(job, up) - {child}))
    job.hosts[up].tx_bps = 9_000_000  # its own rates say nothing against it
    for _ in range(4):
        now[0] += 1.0
        _complain(c, now, job, child, up, "STALLED")
        _complain(c, now, job, second, up, "STALLED")
    assert job.hosts[up].demoted
    assert any("(also from " in e for e in job.hosts[up].errors)


def test_a_host_complaining_against_everyone_is_removed_not_them(chain) -> None:
    """A host whose outbound TLS fails (an expired certificate, a wrong CA bundle) reports
    CONN_RESET against each upstream it meets: it is removed, they are not demoted."""
    c, now, job, _, child = chain
    ups = {s: ch.parent[child] for s, ch in enumerate(job.topology.stripes)}
    assert len(set(ups.values()) - {None}) >= 2  # rack chains rotate: two upstreams
    v = job.topology.version
    first, *_ = (s for s, u in ups.items() if u is not None)
    _complain(c, now, job, child, ups[first], "CONN_RESET")
    assert job.hosts[child].state != REMOVED  # one host's word so far: a dispute
    for s, u in ups.items():
        if u is not None:
            c.report_suspect(job.job_id, child, u, "CONN_RESET", s)
    hp = job.hosts[child]
    ups = {u for u in ups.values() if u is not None}
    assert hp.state == REMOVED
    assert any(e.startswith("REMOVED: complains against everyone it meets") for e in hp.errors)
    assert not any(job.hosts[u].demoted for u in ups)
    assert all(not job.hosts[u].unserved for u in ups)  # its complaints are withdrawn
    assert child not in job.topology.racks and job.topology.version > v
    assert child not in job.eligible  # the job no longer waits for it
    reply = c.report_progress(job.job_id, child, ProgressReport())
    assert reply.actions == ("STOP",)
    with pytest.raises(NotFound, match="removed"):
        c.register(job.job_id, child, job.targets[child], b"", 1 << 40, "10.0.0.9:1")


def test_handshakes_failing_both_ways_remove_the_host_in_the_middle(chain) -> None:
    """An expired certificate: the host cannot reach its upstream, and its downstream
    cannot reach it; both sides CONN_RESET, corroborated by nobody: it is removed."""
    c, now, job, up, child = chain
    chain = job.topology.stripes[0]
    mid = child
    below = chain.children(mid)[0]
    _complain(c, now, job, mid, up, "CONN_RESET")
    assert job.hosts[mid].state != REMOVED
    _complain(c, now, job, below, mid, "CONN_RESET")
    assert job.hosts[mid].state == REMOVED
    assert any(e.startswith("REMOVED: handshakes fail both ways") for e in job.hosts[mid].errors)
    assert not job.hosts[up].demoted and job.hosts[up].state != REMOVED
    assert job.hosts[below].state != REMOVED
    # STALLED both ways is no handshake failure: an empty upstream explains it
    other = next(h for h in chain.order if h not in (up, mid, below) and chain.children(h))
    _complain(c, now, job, other, chain.parent[other], "STALLED")
    _complain(c, now, job, chain.children(other)[0], other, "STALLED")
    assert job.hosts[other].state != REMOVED


def test_bad_data_from_the_suspect_does_not_count(chain) -> None:
    c, now, job, up, child = chain
    below = job.topology.stripes[0].children(child)[0]
    _complain(c, now, job, below, child, "CONN_RESET")  # it cannot reach the child
    _complain(c, now, job, child, up, "BAD_DATA")  # and the child blames its upstream
    assert job.hosts[child].state == REMOVED  # both ways, corroborated by nobody
    assert child not in job.hosts[up].bad_data_reporters
    assert job.hosts[up].state != "QUARANTINED" and not job.hosts[up].demoted


def test_a_stall_counts_when_the_accused_receives_and_sends_nothing(chain) -> None:
    """The accused's own rates: it receives (so it has something to pass on) and sends
    0 B/s while the reporter receives from others: corroborated, demoted, the evidence
    named. A second reporter that is itself gone corroborates nothing."""
    c, now, job, up, child = chain
    second = next(iter(_kids(job, up) - {child}))
    job.hosts[second].state = "DEAD"  # spliced out: its word counts for nothing
    job.hosts[up].tx_bps, job.hosts[up].rx_bps = 9_000_000, 5_000_000
    for _ in range(4):
        now[0] += 1.0
        _complain(c, now, job, second, up, "STALLED")
        _complain(c, now, job, child, up, "STALLED")
    assert not job.hosts[up].demoted  # it sends: a dead host's word is no second reporter
    job.hosts[up].tx_bps, job.hosts[child].rx_bps = 0, 4_000_000
    now[0] += 1.0
    _complain(c, now, job, child, up, "STALLED")
    assert job.hosts[up].demoted
    assert job.hosts[up].errors[-1] == (
        f"DEMOTED not serving: STALLED from {', '.join(sorted((child, second)))} (it sends "
        f"0 B/s while {child} receives 4000000 B/s from others)"
    )


def test_a_handshake_failure_counts_even_against_a_host_that_receives_nothing(chain) -> None:
    """CONN_RESET is no stall an empty upstream explains: sending 0 B/s while the reporter
    receives from others corroborates it whatever the accused receives."""
    c, now, job, up, child = chain
    job.hosts[up].tx_bps, job.hosts[up].rx_bps = 0, 0
    job.hosts[child].rx_bps = 4_000_000
    for _ in range(4):
        now[0] += 1.0
        _complain(c, now, job, child, up, "CONN_RESET")
    assert job.hosts[up].demoted


def test_a_removed_host_is_judged_once(chain) -> None:
    c, now, job, up, child = chain
    below = job.topology.stripes[0].children(child)[0]
    _complain(c, now, job, child, up, "CONN_RESET")
    _complain(c, now, job, below, child, "CONN_RESET")
    assert job.hosts[child].state == REMOVED
    version = job.topology.version
    job.hosts[below].unserved[child] = (now[0], now[0])  # a complaint still in flight
    job.hosts[below].unserved_reason[child] = "CONN_RESET"
    _complain(c, now, job, child, below, "CONN_RESET")
    assert sum(e.startswith(REMOVED) for e in job.hosts[child].errors) == 1
    assert job.topology.version == version
