"""Jobs end, and their figures are facts (coordinator logic on a real SQLite store).

A lost host no longer holds a job short of DONE (removed after a bound, or evicted by an
operator, each reported with its reason); a cancel after placement records what was placed;
a host quarantined for bad data is no target of the next job until an operator clears it;
byte counters only grow and survive a takeover; the ETA is the slowest remaining host's own;
stragglers stay listed, with their reasons, until READY or removed; one origin budget across
the jobs that read it.
"""

from __future__ import annotations

import calendar
import json
import time
from pathlib import Path
from typing import Any

import pytest
from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import TrustedKeys

from relgate_agent.contracts import ProgressReport, WatchCursor
from relgate_agent.coordinator.budget import JOIN_GRACE_REPORTS, origin_key
from relgate_agent.coordinator.jobstate import REMOVED, NotFound, Rejected
from relgate_agent.coordinator.ledger import HostBytes
from relgate_agent.coordinator.removal import remove_host
from relgate_agent.coordinator.service import Coordinator, CoordinatorConfig
from relgate_agent.dataplane.pacing import IDLE
from relgate_agent.staging.storage import bitmap_from_bits

HOSTS = {f"h{i}": f"r{i % 2}" for i in range(4)}
CAP = 4_000_000


class Clock:
    def __init__(self) -> None:
        self.t = 1000.0

    def __call__(self) -> float:
        return self.t


def _coordinator(db: Path, checkpoint: dict[str, Any], clock: Clock, **cfg: Any) -> Coordinator:
    c = Coordinator(
        CoordinatorConfig(db=str(db), trusted_keys=TrustedKeys.load(checkpoint["trusted"]), **cfg),
        post=lambda *a, **k: None,  # no webhook configured: never called
        clock=clock,
    )
    for h, r in HOSTS.items():
        c.enroll(h, r, {"cluster": "inf-a"})
        c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
    return c


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def coord(tmp_path: Path, checkpoint, clock: Clock):
    c = _coordinator(tmp_path / "c.sqlite", checkpoint, clock, remove_dead_after_s=30.0)
    yield c
    c.store.close()


def _spec(checkpoint: dict[str, Any], **kw: Any) -> JobSpec:
    fields: dict[str, Any] = {
        "model": "claude-x",
        "version": "2026-10-12.3",
        "manifest_uri": str(checkpoint["envelope"]),
        "target_selector": "cluster=inf-a",
        "stripes": 2,
        **kw,
    }
    return JobSpec(**fields)


def _register_all(coord: Coordinator, job_id: str) -> None:
    for h, r in HOSTS.items():
        coord.register(job_id, h, r, b"", 1 << 30, f"10.0.0.{h[1:]}:1")


def _ready(coord: Coordinator, job_id: str, host: str, **counters: int) -> None:
    job = coord.jobs[job_id]
    n = job.manifest.num_chunks
    coord.report_progress(
        job_id,
        host,
        ProgressReport(
            job.topology.version,
            bitmap_from_bits([True] * n),
            ready=True,
            placed_manifest_digest=job.manifest.digest,
            **counters,
        ),
    )


def _report(coord: Coordinator, job_id: str, host: str, chunks: int, **kw: Any) -> None:
    job = coord.jobs[job_id]
    n = job.manifest.num_chunks
    have = bitmap_from_bits([c < chunks for c in range(n)])
    coord.report_progress(job_id, host, ProgressReport(job.topology.version, have, **kw))


# ---------------------------------------------------------------------- item 6: jobs end
def test_a_dead_host_is_removed_after_the_bound_and_the_job_is_done(
    coord: Coordinator, checkpoint, clock: Clock
) -> None:
    job = coord.create_job(_spec(checkpoint, ready_threshold_ppm=500_000))
    _register_all(coord, job.job_id)
    for h in ("h0", "h1"):
        _ready(coord, job.job_id, h)
    clock.t += coord.config.dead_after_s + 1  # h2, h3 went silent (so did the READY ones)
    coord.tick()
    assert job.hosts["h3"].state == job.hosts["h2"].state == "DEAD"
    assert job.state == "COMPLETE"
    status = coord.job_status(job.job_id)
    assert status.stragglers == ("h2", "h3")
    assert status.straggler_reasons[0].reason.startswith("dead since ")
    # the ETA is the time until the dead hosts are removed (the job cannot end before)
    assert status.eta_s == coord.config.remove_dead_after_s
    clock.t += 10
    assert coord.job_status(job.job_id).eta_s == coord.config.remove_dead_after_s - 10
    clock.t += coord.config.remove_dead_after_s - 11
    coord.tick()
    assert job.job_id in coord.jobs  # one second short of the bound: still waited for
    clock.t += 1.5
    coord.tick()
    assert job.job_id not in coord.jobs  # DONE without them
    status = coord.job_status(job.job_id)
    assert status.state == "DONE" and status.hosts_ready == 2
    assert [r.host_id for r in status.removed_hosts] == ["h2", "h3"]
    for removed in status.removed_hosts:
        assert removed.reason.startswith("dead since ") and "removed after 30s" in removed.reason
        # "since" is the wall time it was found DEAD: the bound (30 s) before its removal
        since = calendar.timegm(
            time.strptime(removed.reason.split()[2].rstrip(","), "%Y-%m-%dT%H:%M:%SZ")
        )
        assert abs(since - (time.time() - 30)) <= 5


def test_an_operator_evicts_a_host_and_the_job_reports_why(
    coord: Coordinator, checkpoint, clock: Clock
) -> None:
    job = coord.create_job(_spec(checkpoint))
    _register_all(coord, job.job_id)
    for h in ("h0", "h1", "h2"):
        _ready(coord, job.job_id, h)
    with pytest.raises(Rejected) as refused:
        coord.evict_host(job.job_id, "h0", "rma", "operator:ops")
    assert refused.value.check == "evict-ready"
    with pytest.raises(Rejected) as refused:
        coord.evict_host(job.job_id, "h3", "  ", "operator:ops")
    assert refused.value.check == "evict-reason"
    with pytest.raises(NotFound):
        coord.evict_host(job.job_id, "h9", "rma", "operator:ops")
    v = job.topology.version
    assert coord.evict_host(job.job_id, "h3", "disk swap", "operator:ops") is True
    assert coord.evict_host(job.job_id, "h3", "again", "operator:ops") is False  # idempotent
    assert job.hosts["h3"].state == REMOVED and "h3" not in job.topology.racks
    assert job.topology.version > v
    # the evicted host is told the job ended for it, refused if it registers, told to stop
    (u,) = coord.watch_updates([WatchCursor("h3", versions={job.job_id: v})])
    assert u is not None and not u.jobs
    (plan,) = u.assignments
    assert plan.cancelled and plan.job_state == REMOVED
    with pytest.raises(NotFound, match="removed from job"):
        coord.register(job.job_id, "h3", "r1", b"", 1 << 30, "10.0.0.3:1")
    reply = coord.report_progress(job.job_id, "h3", ProgressReport(0, rx=7))
    assert reply.actions == ("STOP",)
    coord.tick()
    status = coord.job_status(job.job_id)
    assert status.state == "DONE"
    assert [(r.host_id, r.reason) for r in status.removed_hosts] == [
        ("h3", "evicted by operator:ops: disk swap")
    ]
    assert status.bytes_moved == 7  # its last counters still count


def test_a_removal_after_the_handoff_is_told_to_the_deployer_once(
    tmp_path: Path, checkpoint, clock: Clock
) -> None:
    """Threshold 50%: the DistributionComplete goes out with nobody removed; a host evicted
    after it is told in a HostsReady of its own (no READY host), once, also by a new leader;
    every later event names it too, with why and when, as GetJob does."""
    db = tmp_path / "c.sqlite"
    c = _coordinator(db, checkpoint, clock, remove_dead_after_s=30.0)
    job = c.create_job(_spec(checkpoint, ready_threshold_ppm=500_000))
    _register_all(c, job.job_id)
    for h in ("h0", "h1"):
        _ready(c, job.job_id, h)
    c.tick()
    c.evict_host(job.job_id, "h3", "disk swap", "operator:ops")
    c.tick()
    c.store.close()
    # a new leader on the same store: what was announced is restored, nothing told twice
    c = _coordinator(db, checkpoint, clock, remove_dead_after_s=30.0)
    try:
        job = c.jobs[job.job_id]
        c.register(job.job_id, "h2", "r0", b"", 1 << 30, "10.0.0.2:1")
        c.tick()
        _ready(c, job.job_id, "h2")
        c.tick()
        assert job.job_id not in c.jobs  # DONE
        events = [json.loads(e.body) for e in c.store.job_events(job.job_id)]
        status = c.job_status(job.job_id)
    finally:
        c.store.close()
    told = [(e["type"], e["readyHosts"], [r["hostId"] for r in e["removedHosts"]]) for e in events]
    assert told == [
        ("DistributionComplete", ["h0", "h1"], []),
        ("HostsReady", [], ["h3"]),
        ("HostsReady", ["h2"], ["h3"]),
    ]
    (gone,) = events[1]["removedHosts"]
    assert gone["reason"] == "evicted by operator:ops: disk swap"
    assert abs(gone["removedAt"] - time.time()) <= 5
    assert [r.to_json() for r in status.removed_hosts] == [gone] == events[2]["removedHosts"]


def test_a_job_whose_every_target_is_removed_fails_naming_them(
    coord: Coordinator, checkpoint
) -> None:
    job = coord.create_job(_spec(checkpoint))
    for h in HOSTS:
        coord.evict_host(job.job_id, h, "decommissioned", "operator:ops")
    coord.tick()
    assert job.state == "FAILED" and job.error.startswith("no target left: h0: evicted by")


@pytest.mark.parametrize("how", ["no-target-left", "chunk-failed"])
def test_a_failed_job_keeps_why_and_its_host_errors_for_the_next_leader(
    tmp_path: Path, checkpoint, clock: Clock, how: str
) -> None:
    """A FAILED job is never resumed into memory: its reason and every host's errors are
    frozen when it fails, so a new leader on the same store (a failover, a restart) still
    reports them, and the client's ``error`` says why."""
    from relgate_agent.client import job_from_pb
    from relgate_agent.coordinator.wire import status_to_pb

    db = tmp_path / "c.sqlite"
    c = _coordinator(db, checkpoint, clock, remove_dead_after_s=30.0)
    job = c.create_job(_spec(checkpoint))
    _register_all(c, job.job_id)
    if how == "no-target-left":
        for h in HOSTS:
            c.evict_host(job.job_id, h, "decommissioned", "operator:ops")
    else:
        failed = "CHUNK_FAILED: chunk 3 of file model.bin failed 4 times from the origin"
        c.report_progress(job.job_id, "h1", ProgressReport(0, rx=5, errors=(failed,)))
    c.tick()
    live = c.job_status(job.job_id)  # as it failed
    if how == "chunk-failed":  # another host's CHUNK_FAILED after the job ended
        later = "CHUNK_FAILED: chunk 0 of file model.bin failed 4 times from the origin"
        c.report_progress(job.job_id, "h0", ProgressReport(0, rx=5, errors=(later,)))
        after = c.job_status(job.job_id)
        assert dict((h.host_id, h.errors) for h in after.hosts)["h0"] == (later,)
        # the CHUNK_FAILED that ended the job, not the one after it (h0 sorts first)
        assert job_from_pb(status_to_pb(after)).error == f"h1: {failed}"
    c.store.close()
    c = _coordinator(db, checkpoint, clock, remove_dead_after_s=30.0)
    try:
        assert job.job_id not in c.jobs
        stored = c.job_status(job.job_id)
    finally:
        c.store.close()
    assert stored.state == live.state == "FAILED"
    assert stored.failure == live.failure != ""
    assert [h.errors for h in stored.hosts] == [h.errors for h in live.hosts]
    error = job_from_pb(status_to_pb(stored)).error
    if how == "no-target-left":
        assert stored.failure.startswith("no target left: h0: evicted by operator:ops")
        assert error == stored.failure
    else:
        assert stored.failure == f"h1: {failed}"
        assert error == f"h1: {failed}"
        assert dict((h.host_id, h.errors) for h in stored.hosts)["h1"] == (failed,)


def test_a_cancel_after_placement_records_what_was_placed(coord: Coordinator, checkpoint) -> None:
    job = coord.create_job(_spec(checkpoint))
    _register_all(coord, job.job_id)
    _ready(coord, job.job_id, "h1")
    _ready(coord, job.job_id, "h2")
    placed, total = coord.cancel_job(job.job_id)
    assert placed == ("h1", "h2") and total == len(HOSTS)
    status = coord.job_status(job.job_id)
    assert status.state == "CANCELLED" and status.ready_hosts == ("h1", "h2")
    assert coord.store.figures(job.job_id)["placed_hosts"] == ["h1", "h2"]  # type: ignore[index]
    # the placed copies are the coordinator's record: a next job does not send them again
    assert coord.store.hosts_holding("claude-x", "2026-10-12.3", checkpoint["manifest"].digest) == {
        "h1",
        "h2",
    }


def test_a_quarantined_host_is_no_target_until_an_operator_clears_it(
    coord: Coordinator, checkpoint
) -> None:
    job = coord.create_job(_spec(checkpoint))
    _register_all(coord, job.job_id)
    bad = "h1"
    # what two downstreams' BAD_DATA reports lead to (the judgement has its own tests)
    job.hosts[bad].bad_data_reporters = {"h0", "h3"}
    with coord.lock:
        coord._quarantine(job, job.hosts[bad])
    assert job.hosts[bad].state == "QUARANTINED"
    coord.cancel_job(job.job_id)
    inventory = {h.host_id: h for h in coord.inventory()}
    assert inventory[bad].hold.startswith("QUARANTINED: BAD_DATA from ")
    second = coord.create_job(_spec(checkpoint, job_id="dj_second"))
    assert bad not in second.targets and len(second.targets) == len(HOSTS) - 1
    # nor does it join as a late joiner
    coord.heartbeat(bad, HOSTS[bad], "10.0.0.9:1", [])
    assert bad not in second.targets
    assert coord.clear_host(bad, "scrubbed").startswith("QUARANTINED: ")
    assert coord.clear_host(bad, "again") == ""
    coord.heartbeat(bad, HOSTS[bad], "10.0.0.9:1", [])
    assert bad in second.targets  # cleared: a late joiner of the running job


# ---------------------------------------------------------------------- item 5: figures
def test_counters_only_grow_and_survive_a_takeover(
    tmp_path: Path, checkpoint, clock: Clock
) -> None:
    db = tmp_path / "c.sqlite"
    c = _coordinator(db, checkpoint, clock)
    job = c.create_job(_spec(checkpoint))
    _register_all(c, job.job_id)
    _report(c, job.job_id, "h1", 1, rx=1000, origin=300, tx=50)
    _report(c, job.job_id, "h1", 1, rx=400, origin=100, tx=60)  # lost its journal: no drop
    hp = job.hosts["h1"]
    assert (hp.rx, hp.origin, hp.tx) == (1000, 300, 60)
    _report(c, job.job_id, "h1", 1, rx=-5, origin=-1, tx=-1)  # hostile: changes nothing
    assert (hp.rx, hp.origin, hp.tx) == (1000, 300, 60)
    _ready(c, job.job_id, "h2", rx=5000, origin=2000)  # READY: written at once
    assert c.ledger.bytes(job.job_id)["h2"] == HostBytes(5000, 0, 2000)
    c.ledger.put_bytes(job.job_id, {"h2": HostBytes(1, 1, 1)})  # a deposed leader's late write
    assert c.ledger.bytes(job.job_id)["h2"] == HostBytes(5000, 1, 2000)  # lowers nothing
    clock.t += 6  # the sweep writes the others' at its interval
    c.tick()
    c.store.close()
    # a new coordinator (a takeover, a restart) on the same store: the figures are back
    c2 = _coordinator(db, checkpoint, clock)
    try:
        s = c2.job_status(job.job_id)
        assert (s.bytes_moved, s.origin_bytes) == (6000, 2300)
    finally:
        c2.store.close()


def test_eta_is_the_slowest_remaining_hosts_own_and_stragglers_stay_listed(
    coord: Coordinator, checkpoint, clock: Clock
) -> None:
    job = coord.create_job(_spec(checkpoint))
    _register_all(coord, job.job_id)
    m = job.manifest
    n, size = m.num_chunks, m.total_size
    half = n // 2
    left = size * (n - half) // n
    for h in ("h0", "h1", "h2"):
        _report(coord, job.job_id, h, half, rx_bps=left)  # a second to go each
    _report(coord, job.job_id, "h3", 1, rx_bps=size // 100)  # ~99 s to go
    status = coord.job_status(job.job_id)
    slow_eta = (size * (n - 1) // n) / (size // 100)
    assert status.eta_s == int(slow_eta + 0.999)  # not the fleet mean's few seconds
    (slow,) = status.straggler_reasons
    assert slow.host_id == "h3" and slow.reason.startswith("behind: 1/")
    assert f"rx {size // 100} B/s" in slow.reason
    # h3 catches up with the median (no longer "behind"), not READY: still listed
    _report(coord, job.job_id, "h3", half, rx_bps=left)
    status = coord.job_status(job.job_id)
    assert status.stragglers == ("h3",)
    assert f"now {half}/{n} chunks" in status.straggler_reasons[0].reason
    assert status.eta_s == 1
    _ready(coord, job.job_id, "h3")
    assert coord.job_status(job.job_id).stragglers == ()
    # a live host with no rate yet: the ETA is unknown, not a guess; at 1 B/s, long
    _report(coord, job.job_id, "h0", half, rx_bps=0)
    assert coord.job_status(job.job_id).eta_s == -1
    _report(coord, job.job_id, "h0", half, rx_bps=1)
    assert coord.job_status(job.job_id).eta_s == left
    # every chunk verified, READY not yet reported: nothing left, whatever the rate
    for h in ("h0", "h1", "h2"):
        _report(coord, job.job_id, h, n, rx_bps=0)
    assert coord.job_status(job.job_id).eta_s == 0


# ---------------------------------------------------------------------- item 7: budget
def test_one_origin_budget_across_jobs(coord: Coordinator, checkpoint, clock: Clock) -> None:
    origin = str(checkpoint["origin"])
    a = coord.create_job(_spec(checkpoint, origin_cap_bytes_per_s=CAP, origin_uri=origin))
    _register_all(coord, a.job_id)
    coord.tick()
    assert CAP - 2 <= sum(a.origin_shares) <= CAP
    # a second job on the same origin (another version, say): it waits for the first
    # job's roots to be told their smaller shares, then both share the one cap
    b = coord.create_job(
        _spec(checkpoint, job_id="dj_b", origin_cap_bytes_per_s=CAP, origin_uri=origin)
    )
    assert b.origin_shares == (IDLE, IDLE)
    assert sum(a.origin_shares) + sum(b.origin_shares) <= CAP
    (u,) = coord.watch_updates([WatchCursor(next(iter(b.targets)))])
    assert u is not None  # an assignment made in the grace carries the idle share
    rates = {
        s.origin_rate_bytes_per_s for p in u.assignments if p.job_id == b.job_id for s in p.stripes
    }
    assert rates <= {0, IDLE}
    clock.t += JOIN_GRACE_REPORTS * coord.config.report_interval_s
    coord.tick()
    assert all(s > IDLE for s in b.origin_shares)
    assert CAP - 4 <= sum(a.origin_shares) + sum(b.origin_shares) <= CAP
    # the smallest cap of the origin's jobs is its cap; another origin has its own budget
    other = coord.create_job(
        _spec(checkpoint, job_id="dj_c", origin_cap_bytes_per_s=CAP, origin_uri="s3://bkt/x")
    )
    coord.tick()
    assert CAP - 2 <= sum(other.origin_shares) <= CAP
    assert origin_key("s3://bkt/x") == origin_key("s3://BKT/y/z") == "s3://bkt"
    assert origin_key("http://o:80/a") == "http://o:80"


def test_remove_host_never_removes_a_placed_copy_nor_a_host_outside_the_job(
    coord: Coordinator, checkpoint
) -> None:
    """The one removal path (NO_SPACE, complaints, certificates, eviction, the dead bound)
    keeps a READY host counted and ignores a host that is no target of the job."""
    job = coord.create_job(_spec(checkpoint))
    _register_all(coord, job.job_id)
    _ready(coord, job.job_id, "h1")
    with coord.lock:
        v = job.topology.version
        assert not remove_host(coord, job, "h1", "NO_SPACE late")  # placed: stays counted
        assert not remove_host(coord, job, "h99", "not a target")
        assert job.topology.version == v and job.removed == {}
        assert remove_host(coord, job, "h2", "NO_SPACE need 1 bytes")
        assert not remove_host(coord, job, "h2", "again")  # the first reason stays
    assert job.hosts["h1"].state == "READY" and job.removed == {"h2": "NO_SPACE need 1 bytes"}
    assert job.hosts["h2"].state == REMOVED and "h2" not in job.topology.racks
