"""Coordinator logic driven directly (real SQLite, real signed manifest; no network)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import TrustedKeys

from relgate_agent.client import job_from_pb
from relgate_agent.contracts import (
    ORIGIN,
    STRIPE_DONE,
    AssignmentPlan,
    JobRef,
    ProgressReport,
    WatchCursor,
    WatchUpdate,
)
from relgate_agent.coordinator import handoff
from relgate_agent.coordinator.handoff import _rates_due
from relgate_agent.coordinator.jobstate import JobState
from relgate_agent.coordinator.service import (
    Coordinator,
    CoordinatorConfig,
    NotEnrolled,
    NotFound,
    Rejected,
)
from relgate_agent.coordinator.wire import status_to_pb
from relgate_agent.errors import KIND_CHUNK_FAILED
from relgate_agent.staging.storage import bitmap_from_bits, pack_indexes, stripe_resume_blocks

HOSTS = {f"h{i}": f"r{i % 2}" for i in range(6)}


@pytest.fixture
def coord(tmp_path: Path, checkpoint):
    c = Coordinator(
        CoordinatorConfig(
            db=str(tmp_path / "c.sqlite"),
            trusted_keys=TrustedKeys.load(checkpoint["trusted"]),
            slow_after_s=0.0,
            slow_min_median_bps=1,
        )
    )
    for h, r in HOSTS.items():
        c.enroll(h, r, {"cluster": "inf-a", "pool": "x" if h != "h5" else "y"})
        c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
    yield c
    c.store.close()


def _clocked(tmp_path: Path, checkpoint, now: list[float], **cfg) -> Coordinator:
    """A coordinator on a clock the test turns (``now[0]``)."""
    return Coordinator(
        CoordinatorConfig(
            db=str(tmp_path / "c.sqlite"),
            trusted_keys=TrustedKeys.load(checkpoint["trusted"]),
            **cfg,
        ),
        clock=lambda: now[0],
    )


def _fleet_job(c: Coordinator, checkpoint) -> JobState:
    """Every host of HOSTS enrolled and heard from, and a job over them."""
    for h, r in HOSTS.items():
        c.enroll(h, r, {"cluster": "inf-a", "pool": "x"})
        c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
    return c.create_job(_spec(checkpoint))


def _spec(checkpoint, **kw) -> JobSpec:
    return JobSpec(
        **{
            "model": "claude-x",
            "version": "2026-10-12.3",
            "manifest_uri": str(checkpoint["envelope"]),
            "target_selector": "cluster=inf-a,pool=x",
            "stripes": 4,
            **kw,
        }
    )


def test_selector_skip_holders_and_late_join(coord: Coordinator, checkpoint) -> None:
    # h4 proved the version in an earlier job (a verified READY the coordinator accepted) and
    # still holds it; h3 merely claims to hold it: a claim alone never counts as ready
    coord.store.mark_host_version("h4", "claude-x", "2026-10-12.3", checkpoint["manifest"].digest)
    coord.heartbeat("h3", "r1", "10.0.0.3:1", ["claude-x/2026-10-12.3"])
    coord.heartbeat("h4", "r0", "10.0.0.4:1", ["claude-x/2026-10-12.3"])
    job = coord.create_job(_spec(checkpoint))
    assert set(job.targets) == {"h0", "h1", "h2", "h3", "h4"}  # h5 is pool=y
    assert "h4" not in job.topology.racks and "h4" in job.ready  # already holds the version
    assert "h3" in job.topology.racks and "h3" not in job.ready
    # default origin is the manifest's directory
    assert job.spec.origin_uri == str(Path(checkpoint["envelope"]).parent)
    v = job.topology.version
    with pytest.raises(NotEnrolled, match="host h9 is not enrolled"):
        coord.heartbeat("h9", "r1", "10.0.0.9:1", [])
    assert "h9" not in job.targets and job.topology.version == v
    coord.enroll("h9", "r1", {"cluster": "inf-a", "pool": "x"})
    coord.heartbeat("h9", "r1", "10.0.0.9:1", [])
    assert "h9" in job.targets and "h9" in job.topology.racks and job.topology.version > v
    assert all(not c.children("h9") for c in job.topology.stripes)


def test_names_and_manifest_mismatch_refused(coord: Coordinator, checkpoint) -> None:
    with pytest.raises(Exception, match=r"\.\."):
        coord.create_job(_spec(checkpoint, version=".."))
    with pytest.raises(Rejected, match="not claude-x/other"):
        coord.create_job(_spec(checkpoint, version="other"))


def test_slow_host_demoted_to_rack_tail(coord: Coordinator, checkpoint) -> None:
    job = coord.create_job(_spec(checkpoint))
    n = checkpoint["manifest"].num_chunks
    slow = max(
        job.topology.racks, key=lambda h: sum(len(c.children(h)) for c in job.topology.stripes)
    )
    assert any(c.children(slow) for c in job.topology.stripes)
    for _ in range(2):  # first tick notes the slowness, the next acts on it
        for h in job.topology.racks:
            coord.report_progress(
                job.job_id,
                h,
                ProgressReport(
                    have=bitmap_from_bits(bytearray(n)),
                    rx_bps=1000 if h == slow else 10_000_000,
                ),
            )
        coord.tick()
    assert all(not c.children(slow) for c in job.topology.stripes)
    assert slow in job.topology.racks  # still a member, just a leaf
    assert any(e.startswith("DEMOTED") for e in job.hosts[slow].errors)
    # everyone still reachable from a single root per stripe
    for chain in job.topology.stripes:
        assert sum(1 for h in chain.order if chain.parent[h] is None) == 1


def test_two_bad_data_reporters_quarantine(coord: Coordinator, checkpoint) -> None:
    job = coord.create_job(_spec(checkpoint))
    chain = job.topology.stripes[0]
    bad = next(h for h in chain.order if chain.children(h))
    kid = chain.children(bad)[0]
    coord.report_suspect(job.job_id, kid, bad, "BAD_DATA", 0)
    assert bad in job.topology.racks  # one report could be the reporter's own fault
    other = next(h for h in job.topology.racks if h not in (bad, kid))
    coord.report_suspect(job.job_id, other, bad, "BAD_DATA", 1)
    assert bad not in job.topology.racks and job.hosts[bad].state == "QUARANTINED"
    assert job.topology.stripes[0].parent[kid] == chain.parent[bad]


def test_deadline_handoff_below_threshold(coord: Coordinator, checkpoint) -> None:
    from agent_harness import Webhook

    hook = Webhook()
    try:
        job = coord.create_job(_spec(checkpoint, deadline_s=60, webhook_url=hook.url))
        coord.tick()
        assert not job.completion_emitted and job.completion is None
        job.created_at -= 61  # the deadline has passed
        coord.tick()
        assert job.completion is not None and job.completion.reason == "deadline"
        import time

        end = time.monotonic() + 30
        while not hook.events and time.monotonic() < end:
            time.sleep(0.05)
        assert hook.events[0]["readyHosts"] == [] and hook.events[0]["hostsTotal"] == 5
        assert job.state == "COMPLETE"
    finally:
        hook.close()


def test_progress_delta_merged_and_full_bitmap_asked_for(coord: Coordinator, checkpoint) -> None:
    job = coord.create_job(_spec(checkpoint))
    n = checkpoint["manifest"].num_chunks
    h = next(iter(job.topology.racks))
    full = bitmap_from_bits(bytearray([1]) + bytearray(n - 1))
    assert (
        "FULL_PROGRESS"
        not in coord.report_progress(job.job_id, h, ProgressReport(have=full)).actions
    )
    # a delta on top of the cached bitmap: merged, counts agree
    ok = ProgressReport(verified_delta=pack_indexes([n - 1]), verified_count=2)
    assert "FULL_PROGRESS" not in coord.report_progress(job.job_id, h, ok).actions
    assert job.hosts[h].verified == 2 and job.hosts[h].holds(n - 1)
    # the agent counts more than the cache holds (a lost delta, a new leader): ask for all
    gap = ProgressReport(verified_delta=pack_indexes([1]), verified_count=5)
    assert "FULL_PROGRESS" in coord.report_progress(job.job_id, h, gap).actions
    # hostile: an index past the manifest's chunks refuses the whole delta, cache unchanged
    before = job.hosts[h].have
    bad = ProgressReport(verified_delta=pack_indexes([2, n]), verified_count=4)
    assert "FULL_PROGRESS" in coord.report_progress(job.job_id, h, bad).actions
    assert job.hosts[h].have == before
    # the cache holds more than the agent counts (it lost chunks): its bitmap, not the merge
    lost = ProgressReport(verified_delta=pack_indexes([3]), verified_count=1)
    assert "FULL_PROGRESS" in coord.report_progress(job.job_id, h, lost).actions
    # a whole bitmap replaces the cache, cut to the manifest's chunks (a hostile long one)
    longer = bitmap_from_bits(bytearray([1]) + bytearray(n - 1)) + b"\xff" * 4096
    coord.report_progress(job.job_id, h, ProgressReport(have=longer))
    assert len(job.hosts[h].have) == (n + 7) // 8 and job.hosts[h].verified == 1
    # an empty report from an agent that lost its staging: nothing verified any more
    assert "FULL_PROGRESS" not in coord.report_progress(job.job_id, h, ProgressReport()).actions
    assert job.hosts[h].verified == 0


# ---------------------------------------------------------------------------- watch


def test_watch_updates_push_each_version_once_and_the_end(coord: Coordinator, checkpoint) -> None:
    # before any job: the first update is the (empty) job list, then nothing
    cur = WatchCursor("h0")
    (u,) = coord.watch_updates([cur])
    assert u is not None and u.jobs == () and u.assignments == ()
    assert coord.watch_updates([cur]) == [None]
    job = coord.create_job(_spec(checkpoint))
    # the new job and h0's assignment at its topology version; h5 (pool=y) hears nothing
    other = WatchCursor("h5")
    coord.watch_updates([other])
    u, o = coord.watch_updates([cur, other])
    assert o is None
    assert u is not None and [j.job_id for j in u.jobs] == [job.job_id]
    (a,) = u.assignments
    assert (a.job_id, a.topology_version, a.cancelled) == (job.job_id, job.topology.version, False)
    assert len(a.stripes) == 4 and set(a.members) == set(job.topology.racks)
    assert cur.versions == {job.job_id: job.topology.version}
    assert coord.watch_updates([cur]) == [None]  # told already
    # a splice: one new version, pushed once, to every member
    chain = job.topology.stripes[0]
    victim = next(h for h in chain.order if chain.children(h))
    kid = chain.children(victim)[0]
    other = next(h for h in job.topology.racks if h not in (victim, kid))
    v = job.topology.version
    coord.report_suspect(job.job_id, kid, victim, "BAD_DATA", 0)
    coord.report_suspect(job.job_id, other, victim, "BAD_DATA", 1)
    assert job.topology.version > v
    (u,) = coord.watch_updates([cur])
    assert u is not None and [a.topology_version for a in u.assignments] == [job.topology.version]
    assert victim not in u.assignments[0].members
    assert coord.watch_updates([cur]) == [None]
    # an agent reconnecting with the version it applied is not re-sent it
    again = WatchCursor("h0", versions={job.job_id: job.topology.version})
    (u,) = coord.watch_updates([again])
    assert u is not None and u.assignments == () and [j.job_id for j in u.jobs] == [job.job_id]
    # nor an older one than it applied (it heard from a replica further on): never downgraded
    ahead = WatchCursor("h0", versions={job.job_id: job.topology.version + 5})
    (u,) = coord.watch_updates([ahead])
    assert u is not None and u.assignments == ()
    # cancelled: the end is pushed once (cancelled, its state), then the job is forgotten
    coord.cancel_job(job.job_id)
    (u,) = coord.watch_updates([cur])
    assert u is not None and u.jobs == ()
    (end,) = u.assignments
    assert (end.job_id, end.cancelled, end.job_state) == (job.job_id, True, "CANCELLED")
    assert cur.versions == {} and coord.watch_updates([cur]) == [None]


def test_watch_update_merge_keeps_the_newest(checkpoint) -> None:
    def plan(v: int, cancelled: bool = False) -> AssignmentPlan:
        return AssignmentPlan("j", v, (), "CANCELLED" if cancelled else "DISTRIBUTING", cancelled)

    ref = JobRef("j", "m", "v", "DISTRIBUTING")
    old = WatchUpdate((ref,), (plan(3), AssignmentPlan("k", 1, (), "DISTRIBUTING", False)))
    new = WatchUpdate((), (plan(2),))
    merged = old.merged(new)
    assert merged.jobs == ()  # the newer job list
    assert {a.job_id: a.topology_version for a in merged.assignments} == {"j": 3, "k": 1}
    assert old.merged(WatchUpdate((), (plan(4),))).assignments[0].topology_version == 4
    ended = old.merged(WatchUpdate((), (plan(0, cancelled=True),))).assignments[0]
    assert ended.cancelled and ended.job_state == "CANCELLED"  # the end overrides any version
    # a job the unsent update did not carry is taken as it comes
    fresh = AssignmentPlan("n", 1, (), "DISTRIBUTING", False)
    assert old.merged(WatchUpdate((), (fresh,))).assignments[-1] == fresh
    # the same version twice (recomputed later, e.g. a new job state): the newer one wins
    tie = AssignmentPlan("j", 3, (), "COMPLETE", False)
    assert old.merged(WatchUpdate((), (tie,))).assignments[0] == tie


def test_heartbeat_checks_the_enrolled_rack_and_answers_the_active_jobs(
    coord: Coordinator, checkpoint
) -> None:
    # the rack is the enrollment's: a claim on either side of it is refused, naming both
    for claim in ("r1", "q9"):
        with pytest.raises(NotEnrolled, match=f"host h0 is enrolled in rack r0, not '{claim}'"):
            coord.heartbeat("h0", claim, "10.0.0.0:1", [])
    assert coord.heartbeat("h0", "r0", "10.0.0.0:1", []) == []
    assert coord.health["h0"] == ("", 0)
    job = coord.create_job(_spec(checkpoint))
    ref = JobRef(job.job_id, "claude-x", "2026-10-12.3", job.state)
    got = coord.heartbeat("h0", "r0", "10.0.0.0:1", [], health="x" * 600, data_refusals=3)
    assert got == [ref]
    assert coord.health["h0"] == ("x" * 500, 3)  # a peer's text, bounded
    assert coord.heartbeat("h5", "r1", "10.0.0.5:1", []) == []  # pool=y: not a target
    coord.cancel_job(job.job_id)
    assert coord.heartbeat("h0", "r0", "10.0.0.0:1", []) == []  # ended: not its job any more


def _pushed(coord: Coordinator, host: str, job_id: str, known: int = 0) -> AssignmentPlan:
    """The assignment a fresh watch of ``host`` is pushed for ``job_id`` (having ``known``)."""
    (u,) = coord.watch_updates([WatchCursor(host, versions={job_id: known} if known else {})])
    assert u is not None
    (a,) = [a for a in u.assignments if a.job_id == job_id]
    return a


def test_pushed_assignments_follow_the_chains(coord: Coordinator, checkpoint) -> None:
    job = coord.create_job(_spec(checkpoint, origin_cap_bytes_per_s=4_000_000))
    (u,) = coord.watch_updates([WatchCursor("h5")])  # pool=y: not a target, nothing pushed
    assert u is not None and u.assignments == () and u.jobs == ()
    for h in job.topology.racks:
        a = _pushed(coord, h, job.job_id)
        assert len(a.stripes) == len(job.topology.stripes) == 4
        for s, (plan, chain) in enumerate(zip(a.stripes, job.topology.stripes, strict=True)):
            assert plan.stripe == s
            assert plan.upstream.host_id == (chain.parent[h] or ORIGIN)
            # the children in chain order (the index built once per version)
            assert [d.host_id for d in plan.downstreams] == chain.children(h)
            # each stripe root gets its share of the origin cap (by the bytes its stripe has
            # left, from the job's creation: about equal), nobody else any
            share = job.origin_shares[s] if chain.parent[h] is None else 0
            assert plan.origin_rate_bytes_per_s == share
            assert share == 0 or abs(share - 1_000_000) < 1_000
    coord.cancel_job(job.job_id)
    end = _pushed(coord, "h0", job.job_id, known=job.topology.version)
    assert (end.job_id, end.cancelled, end.job_state, end.stripes) == (
        job.job_id,
        True,
        "CANCELLED",
        (),
    )
    gone = _pushed(coord, "h0", "dj_never", known=1)
    assert (gone.cancelled, gone.job_state) == (True, "GONE")


def test_a_failed_job_ends_on_the_watch_once(coord: Coordinator, checkpoint) -> None:
    job = coord.create_job(_spec(checkpoint))
    cur = WatchCursor("h0")
    coord.watch_updates([cur])
    assert cur.versions == {job.job_id: job.topology.version}
    h = sorted(job.topology.racks)[1]
    failed = ProgressReport(errors=(f"{KIND_CHUNK_FAILED}: chunk 3 failed 5 times",))
    coord.report_progress(job.job_id, h, failed)
    assert job.state == "FAILED"
    (u,) = coord.watch_updates([cur])
    assert u is not None and u.jobs == ()
    (end,) = u.assignments
    assert (end.job_id, end.cancelled, end.job_state, end.stripes) == (
        job.job_id,
        True,
        "FAILED",
        (),
    )
    assert cur.versions == {} and coord.watch_updates([cur]) == [None]


@settings(max_examples=200, deadline=None)
@given(
    bits=st.lists(st.booleans(), min_size=0, max_size=90),
    stripes=st.integers(1, 9),
    bpc=st.integers(1, 5),
    last=st.integers(1, 5),
)
def test_stripe_resume_blocks_match_a_chunk_walk(
    bits: list[bool], stripes: int, bpc: int, last: int
) -> None:
    last = min(last, bpc)
    n = len(bits)
    blocks = [bpc] * n
    if n:
        blocks[-1] = last
    expected = []
    for s in range(stripes):
        pos = 0
        for c in range(s, n, stripes):
            if not bits[c]:
                break
            pos += blocks[c]
        expected.append(pos)
    bitmap = bitmap_from_bits(bytearray(bits))
    assert stripe_resume_blocks(bitmap, n, stripes, bpc, last) == expected


def _mass_silence_coordinator(
    tmp_path: Path, checkpoint, now: list[float], monkeypatch: pytest.MonkeyPatch
) -> Coordinator:
    """A coordinator for HOSTS on a turned clock whose mass silence is 3 hosts of 6."""
    monkeypatch.setattr(handoff, "MASS_SILENCE_MIN", 1)
    return _clocked(tmp_path, checkpoint, now, dead_after_s=6.0, mass_silence_fraction=0.5)


def test_a_mass_silence_holds_the_splices_until_it_clears(
    tmp_path: Path, checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """More than mass_silence_fraction of the chain silent in one sweep is the coordinator's
    backlog or a partition, not that many deaths: nobody is spliced (and the held hosts are
    counted); once the others report again, the one that really died is spliced."""
    now = [1000.0]
    c = _mass_silence_coordinator(tmp_path, checkpoint, now, monkeypatch)
    try:
        job = _fleet_job(c, checkpoint)
        hosts = sorted(job.topology.racks)
        assert len(hosts) == 6  # a limit of 3 silent hosts at once

        def report(some: list[str]) -> None:
            for h in some:
                c.report_progress(job.job_id, h, ProgressReport())

        for h in hosts:
            c.register(job.job_id, h, job.targets[h], b"", 1 << 40, f"10.0.0.{h[1:]}:2")
        report(hosts)
        now[0] += 6.5
        report(hosts[:2])  # four silent at once: more than half
        c.tick()
        assert all(job.hosts[h].state != "DEAD" for h in hosts) and job.mass_silence == 4
        assert sorted(job.topology.racks) == hosts
        held = c.metrics.registry.get_sample_value("relgate_coordinator_splices_held_total")
        assert held == 4
        c.tick()  # still four: still held, counted again
        assert c.metrics.registry.get_sample_value("relgate_coordinator_splices_held_total") == 8
        now[0] += 1.0
        report(hosts[:5])  # the others are back: the one still silent is dead
        c.tick()
        assert job.hosts[hosts[5]].state == "DEAD" and hosts[5] not in job.topology.racks
        assert all(job.hosts[h].state != "DEAD" for h in hosts[:5]) and job.mass_silence == 0
    finally:
        c.store.close()


def test_a_cascade_in_waves_is_one_mass_silence_and_the_long_silent_still_go(
    tmp_path: Path, checkpoint, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Splices of the last 2 x --dead-after count with the hosts silent now (an overload
    cascade comes in waves, each under the limit); held, a host silent 5 x --dead-after
    is spliced all the same (it died, and the silence did not clear)."""
    now = [1000.0]
    c = _mass_silence_coordinator(tmp_path, checkpoint, now, monkeypatch)
    try:
        job = _fleet_job(c, checkpoint)
        hosts = sorted(job.topology.racks)
        for h in hosts:
            c.register(job.job_id, h, job.targets[h], b"", 1 << 40, f"10.0.0.{h[1:]}:2")
            c.report_progress(job.job_id, h, ProgressReport())
        now[0] += 6.5
        for h in hosts[2:]:
            c.report_progress(job.job_id, h, ProgressReport())
        c.tick()  # the first wave, two hosts: under the limit of 3, spliced
        assert [h for h in hosts if job.hosts[h].state == "DEAD"] == hosts[:2]
        now[0] += 3.0
        for h in hosts[4:]:
            c.report_progress(job.job_id, h, ProgressReport())
        now[0] += 4.0
        for h in hosts[4:]:
            c.report_progress(job.job_id, h, ProgressReport())
        c.tick()  # the second wave, two more 7 s after the first: four together, held
        assert [h for h in hosts if job.hosts[h].state == "DEAD"] == hosts[:2]
        assert job.mass_silence == 4
        for h in hosts[2:]:  # the wave was the coordinator's: they are back
            c.report_progress(job.job_id, h, ProgressReport())
        c.tick()
        assert job.mass_silence == 0
        # four silent for good, more than the limit on their own: held while silent up to
        # 5 x 6 s, spliced after
        for _ in range(5):
            now[0] += 6.0
            c.tick()
            assert [h for h in hosts if job.hosts[h].state == "DEAD"] == hosts[:2]
        now[0] += 0.5
        c.tick()
        assert [h for h in hosts if job.hosts[h].state == "DEAD"] == hosts
        assert not job.topology.racks
    finally:
        c.store.close()


def test_a_host_holding_its_watch_is_alive_whatever_its_reports(tmp_path: Path, checkpoint) -> None:
    now = [1000.0]
    c = _clocked(tmp_path, checkpoint, now, dead_after_s=6.0)
    try:
        job = _fleet_job(c, checkpoint)
        hosts = sorted(job.topology.racks)
        booting, registered, silent = hosts[0], hosts[1], hosts[2]
        c.watching[booting] = 1  # its watch is open: still fetching the manifest, say
        c.register(job.job_id, registered, job.targets[registered], b"", 1 << 40, "10.0.0.1:2")
        c.watching[registered] = 2  # its reports queue behind a busy coordinator
        now[0] += 6.5
        c.tick()
        assert job.hosts[booting].state == "PENDING" and booting in job.topology.racks
        assert job.hosts[registered].state == "TRANSFERRING"
        assert registered in job.topology.racks
        assert job.hosts[silent].state == "DEAD"  # no watch, no report: spliced out
        assert silent not in job.topology.racks
        # between two streams (one ended, the next not yet open): still alive for a while
        del c.watching[booting], c.watching[registered]
        c.watch_ended[booting] = c.watch_ended[registered] = now[0]
        c.tick()
        assert job.hosts[booting].state == "PENDING"
        assert job.hosts[registered].state == "TRANSFERRING"
        now[0] += 6.5  # no stream, no report since: killed
        c.tick()
        assert job.hosts[booting].state == "DEAD" and job.hosts[registered].state == "DEAD"
    finally:
        c.store.close()


def test_quarantine_is_durable_tells_the_host_and_the_job_ends_without_it(
    coord: Coordinator, checkpoint, tmp_path: Path
) -> None:
    from relgate_agent.contracts import ACTION_QUARANTINE

    m = checkpoint["manifest"]
    job = coord.create_job(_spec(checkpoint))
    chain = job.topology.stripes[0]
    bad = next(h for h in chain.order if chain.children(h))
    kid = chain.children(bad)[0]
    other = next(h for h in job.topology.racks if h not in (bad, kid))
    coord.report_suspect(job.job_id, kid, bad, "BAD_DATA", 0)
    coord.report_suspect(job.job_id, other, bad, "BAD_DATA", 1)
    full = bitmap_from_bits(bytearray([1]) * m.num_chunks)
    ready = ProgressReport(have=full, ready=True, placed_manifest_digest=m.digest)
    # the quarantined host is told, never accepted READY, and cannot rejoin
    assert coord.report_progress(job.job_id, bad, ready).actions == (ACTION_QUARANTINE,)
    assert bad not in job.ready
    with pytest.raises(NotFound, match="quarantined"):
        coord.register(job.job_id, bad, HOSTS[bad], b"", 1 << 30, "10.0.0.99:1")
    # a restarted coordinator on the same store still knows
    coord.store.close()
    again = Coordinator(coord.config)
    try:
        live = again.jobs[job.job_id]
        assert live.hosts[bad].state == "QUARANTINED" and bad not in live.topology.racks
        for h in sorted(live.targets):
            if h != bad:
                again.report_progress(job.job_id, h, ready)
        again.tick()
        report = again.job_status(job.job_id)
        assert report.state == "DONE" and report.quarantined_hosts == (bad,)
        assert report.hosts_ready == len(live.targets) - 1 and bad not in report.stragglers
        assert bad not in again.store.hosts_holding(m.model, m.version, m.digest)
    finally:
        again.close()


def test_a_declared_serving_host_is_a_leaf_from_the_start(coord: Coordinator, checkpoint) -> None:
    job = coord.create_job(_spec(checkpoint))
    idx = coord._index(job)
    server = next(h for h in job.topology.racks if any(idx.downstreams(s, h) for s in range(4)))
    v = job.topology.version
    coord.register(
        job.job_id, server, job.targets[server], b"", 1 << 40, "10.0.0.9:1", serving_rate=5_000_000
    )
    assert job.topology.version > v and server in job.topology.racks
    v = job.topology.version
    assert all(not c.children(server) for c in job.topology.stripes)
    assert any(e.startswith("LEAF declared serving rate 5000000") for e in job.hosts[server].errors)
    # registering again (a restart) moves nothing more
    coord.register(
        job.job_id, server, job.targets[server], b"", 1 << 40, "10.0.0.9:1", serving_rate=5_000_000
    )
    assert job.topology.version == v


def _job_and_its_busiest_uploader(
    coord: Coordinator, checkpoint
) -> tuple[JobState, str, dict[int, set[str]]]:
    """A job every host registered for, the host feeding the most downstreams, and its
    downstreams per stripe."""
    job = coord.create_job(_spec(checkpoint))
    for h in job.topology.racks:
        coord.register(job.job_id, h, job.targets[h], b"", 1 << 40, f"10.0.0.{h[1:]}:1")
    idx = coord._index(job)
    up = max(
        job.topology.racks,
        key=lambda h: len({c for s in range(4) for c in idx.downstreams(s, h)}),
    )
    return job, up, {s: set(idx.downstreams(s, up)) for s in range(4)}


def test_a_slow_uploader_is_demoted_by_its_downstreams_per_stripe_rates(
    coord: Coordinator, checkpoint
) -> None:
    job, up, slow_kids = _job_and_its_busiest_uploader(coord, checkpoint)
    fast, slow = 12_000_000, 2_000_000

    def report_all() -> None:
        for h in job.topology.racks:
            rates = tuple(slow if h in slow_kids[s] else fast for s in range(4))
            coord.report_progress(job.job_id, h, ProgressReport(stripe_rx_bps=rates))

    report_all()
    coord.tick()  # first sight of the slowness: the clock starts (slow_after_s = 0 here)
    assert up not in {h for h, hp in job.hosts.items() if hp.demoted}
    report_all()
    coord.tick()
    assert job.hosts[up].demoted and up in job.topology.racks
    assert all(not c.children(up) for c in job.topology.stripes)  # a leaf everywhere
    assert any(e.startswith("DEMOTED tx:") for e in job.hosts[up].errors)
    # nobody else was blamed: its children were slow only behind it
    assert [h for h, hp in job.hosts.items() if hp.demoted] == [up]


def test_slowness_is_judged_once_half_the_senders_sent_new_rates(
    coord: Coordinator, checkpoint
) -> None:
    """A sweep judges on a round of rates, not on the same rates again: under half the
    hosts that send rates reported since the last judgment, the sweep leaves slowness
    alone; half of them, and it judges (and the round starts anew)."""
    job, up, slow_kids = _job_and_its_busiest_uploader(coord, checkpoint)
    hosts = sorted(job.topology.racks)
    fast, slow = 12_000_000, 2_000_000

    def report(some: list[str]) -> None:
        for h in some:
            rates = tuple(slow if h in slow_kids[s] else fast for s in range(4))
            coord.report_progress(job.job_id, h, ProgressReport(stripe_rx_bps=rates))

    report(hosts)
    coord.tick()  # a whole round: judged, the slow uploader's clock starts
    assert job.hosts[up].slow_since is not None and not job.fresh_rates
    job.hosts[up].slow_since = None  # forget it: the next judgment starts it again
    half = (len(hosts) + 1) // 2
    report(hosts[: half - 1])
    coord.tick()  # under half: the same rates are not judged again
    assert job.hosts[up].slow_since is None and len(job.fresh_rates) == half - 1
    report(hosts[half - 1 : half])
    coord.tick()
    assert job.hosts[up].slow_since is not None and not job.fresh_rates
    # the dead and the removed send no rates and do not count: half the rest is a round
    dead, removed = hosts[-2], hosts[-1]
    job.hosts[dead].state, job.hosts[removed].removed = "DEAD", "test"
    rest = hosts[:-2]
    job.fresh_rates = set(rest[: (len(rest) + 1) // 2])
    assert _rates_due(job) and not job.fresh_rates
    job.fresh_rates = set(rest[: (len(rest) + 1) // 2 - 1])
    assert not _rates_due(job)


def test_a_bypassed_hop_is_no_evidence_against_the_upstream_it_names(
    coord: Coordinator, checkpoint
) -> None:
    """Children that pull a stripe from their bypass peer (agent/bypass.py) report it: their
    rate on it says nothing of the upstream the topology names, which is not demoted on it;
    a stripe number out of range is ignored."""
    job, up, slow_kids = _job_and_its_busiest_uploader(coord, checkpoint)
    fast, slow = 12_000_000, 2_000_000
    for _ in range(3):
        for h in job.topology.racks:
            rates = tuple(slow if h in slow_kids[s] else fast for s in range(4))
            mine = tuple(s for s in range(4) if h in slow_kids[s])
            report = ProgressReport(stripe_rx_bps=rates, bypassed_stripes=(*mine, 99))
            coord.report_progress(job.job_id, h, report)
            assert job.hosts[h].bypassed == mine
            assert [r == STRIPE_DONE for r in job.hosts[h].stripe_rx_bps] == [
                s in mine for s in range(4)
            ]
        coord.tick()
    assert not job.hosts[up].demoted  # the upstream its children bypassed
    assert not any(hp.demoted for hp in job.hosts.values())
    # what GetJob shows per host: the stripes in range, through the wire and back
    h = next(iter(job.topology.racks))
    coord.report_progress(job.job_id, h, ProgressReport(bypassed_stripes=(-1, 0, 3, 4)))
    assert job.hosts[h].bypassed == (0, 3)
    row = next(r for r in coord.job_status(job.job_id).hosts if r.host_id == h)
    assert row.bypassed_stripes == (0, 3)
    back = job_from_pb(status_to_pb(coord.job_status(job.job_id)))
    assert next(r for r in back.hosts if r.host_id == h).to_json()["bypassedStripes"] == [0, 3]


def test_each_assignment_names_the_bypass_peer_and_the_standby_hosts(
    coord: Coordinator, checkpoint
) -> None:
    job = coord.create_job(_spec(checkpoint))
    for h in job.topology.racks:
        coord.register(job.job_id, h, job.targets[h], b"", 1 << 40, f"10.0.0.{h[1:]}:1")
    plans = {h: coord._assignment(job, h) for h in job.topology.racks}
    for h, plan in plans.items():
        for sp in plan.stripes:
            chain = job.topology.stripes[sp.stripe]
            up = chain.parent[h]
            grand = chain.parent.get(up) if up is not None else None
            assert (sp.bypass.host_id if sp.bypass else None) == grand
            if sp.bypass is not None:
                assert sp.bypass.address == f"10.0.0.{grand[1:]}:1"  # dialable
                assert h in {p.host_id for p in plans[grand].stripes[sp.stripe].standby}
            for g in sp.standby:  # a standby host's bypass peer is this host
                assert plans[g.host_id].stripes[sp.stripe].bypass.host_id == h


def test_heartbeats_rewrite_the_inventory_only_when_it_changes_or_ages(
    tmp_path: Path, checkpoint
) -> None:
    now = [1000.0]
    c = _clocked(tmp_path, checkpoint, now, host_ttl_s=60.0)
    writes: list[str] = []
    upsert = c.store.upsert_host
    c.store.upsert_host = lambda h, *a: (writes.append(h), upsert(h, *a))[1]  # type: ignore[method-assign]
    try:
        c.enroll("h0", "r0", {"pool": "x"})
        c.heartbeat("h0", "r0", "10.0.0.1:1", [])
        now[0] += 5
        c.heartbeat("h0", "r0", "10.0.0.1:1", [])  # unchanged and fresh: no write
        assert writes == ["h0"]
        c.heartbeat("h0", "r0", "10.0.0.1:2", [])  # a new data address: written
        c.heartbeat("h0", "r0", "10.0.0.1:2", ["m/v1"])  # a placed version: written
        assert writes == ["h0"] * 3
        now[0] += 20.0  # a third of the TTL: refreshed, so it never looks dead, batched
        c.heartbeat("h0", "r0", "10.0.0.1:2", ["m/v1"])  # for the next tick's one write
        assert writes == ["h0"] * 3 and c.flush_last_seen() == 1
        c.enroll("h0", "r0", {"pool": "y"})  # re-enrolled: the next heartbeat writes
        c.heartbeat("h0", "r0", "10.0.0.1:2", ["m/v1"])
        assert len(writes) == 4
        assert c.store.enrolled()["h0"][1] == {"pool": "y"}
    finally:
        c.store.close()


def _a_chain_job(
    c: Coordinator, checkpoint, corroborated: bool = True
) -> tuple[JobState, str, str]:
    """A job on HOSTS with every host registered; (job, an upstream, one of its children).
    ``corroborated``: the rates back the child's complaints (complaints.py): the upstream
    receives and sends nothing, the child receives from others."""
    for h, r in HOSTS.items():
        c.enroll(h, r, {"cluster": "inf-a", "pool": "x"})
        c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
    job = c.create_job(_spec(checkpoint))
    for h in job.targets:
        c.register(job.job_id, h, job.targets[h], b"", 1 << 40, f"10.0.0.{h[1:]}:1")
    chain = job.topology.stripes[0]
    up = next(h for h in chain.order if chain.children(h))
    child = chain.children(up)[0]
    if corroborated:
        job.hosts[up].rx_bps, job.hosts[up].tx_bps = 5_000_000, 0
        job.hosts[child].rx_bps = 5_000_000
    return job, up, child


def test_a_live_host_that_serves_nobody_is_a_leaf_once_complaints_last(
    tmp_path: Path, checkpoint
) -> None:
    now = [1000.0]
    c = _clocked(tmp_path, checkpoint, now, report_interval_s=0.5)
    try:
        job, up, child = _a_chain_job(c, checkpoint)
        stranger = next(
            h
            for h in job.targets
            if h not in (up, child)
            and not any(ch.parent.get(h) == up for ch in job.topology.stripes)
        )
        v = job.topology.version

        def complain(who: str, dt: float, reason: str = "CONN_RESET") -> None:
            now[0] += dt
            job.hosts[up].last_seen = now[0]  # it keeps reporting: alive to the sweep
            c.report_suspect(job.job_id, who, up, reason, 0)

        complain(child, 0.0)
        assert not job.hosts[up].demoted, job.hosts[up].errors
        complain(stranger, 5.0)  # not its downstream: never counts
        assert not job.hosts[up].demoted, job.hosts[up].errors
        complain(child, 2.9)  # 7.9 s after the first, but that one expired (> 2 windows)
        complain(child, 2.9)  # 2.9 s of complaints: under the 3 s window
        assert not job.hosts[up].demoted and job.topology.version == v
        complain(child, 0.1, "STALLED")  # 3.0 s
        assert job.hosts[up].demoted
        assert job.hosts[up].state != "DEAD"  # a leaf, not spliced out: it still receives
        assert all(not ch.children(up) for ch in job.topology.stripes)
        assert job.topology.version > v  # one change (splice + append: two numbers)
        assert any(
            e == f"DEMOTED not serving: STALLED from {child} (it sends 0 B/s while {child} "
            "receives 5000000 B/s from others)"
            for e in job.hosts[up].errors
        )
        assert c.metrics.splices.labels("demoted")._value.get() == 1
    finally:
        c.store.close()


def test_the_unserved_window_follows_the_report_interval(tmp_path: Path, checkpoint) -> None:
    now = [1000.0]
    c = _clocked(tmp_path, checkpoint, now, report_interval_s=2.0)  # window 6 s
    try:
        job, up, child = _a_chain_job(c, checkpoint)
        for dt in (0.0, 4.0, 1.9):
            now[0] += dt
            job.hosts[up].last_seen = now[0]
            c.report_suspect(job.job_id, child, up, "CONN_RESET", 0)
        assert not job.hosts[up].demoted  # 5.9 s
        now[0] += 0.5
        job.hosts[up].last_seen = now[0]
        c.report_suspect(job.job_id, child, up, "CONN_RESET", 0)
        assert job.hosts[up].demoted
    finally:
        c.store.close()


def test_a_complaint_repeated_within_two_windows_still_counts(tmp_path: Path, checkpoint) -> None:
    now = [1000.0]
    c = _clocked(tmp_path, checkpoint, now, report_interval_s=0.5)  # window 3 s, expiry 6 s
    try:
        job, up, child = _a_chain_job(c, checkpoint)
        for dt in (0.0, 5.5):  # not expired: the complaint has lasted 5.5 s
            now[0] += dt
            job.hosts[up].last_seen = now[0]
            c.report_suspect(job.job_id, child, up, "STALLED", 0)
        assert job.hosts[up].demoted
    finally:
        c.store.close()


def test_no_splice_on_suspect_means_no_demotion_either(tmp_path: Path, checkpoint) -> None:
    now = [1000.0]
    c = _clocked(tmp_path, checkpoint, now, report_interval_s=0.5, splice_on_suspect=False)
    try:
        job, up, child = _a_chain_job(c, checkpoint)
        for _ in range(10):
            now[0] += 1.0
            job.hosts[up].last_seen = now[0]
            c.report_suspect(job.job_id, child, up, "CONN_RESET", 0)
        assert not job.hosts[up].demoted
    finally:
        c.store.close()


def test_envelope_sent_once_per_rack_then_named(tmp_path: Path, checkpoint) -> None:
    now = [1000.0]
    c = _clocked(tmp_path, checkpoint, now)
    try:
        job = _fleet_job(c, checkpoint)
        regs = {
            h: c.register(
                job.job_id,
                h,
                job.targets[h],
                b"",
                1 << 40,
                f"10.0.0.{h[1:]}:1",
                envelope_from_peers=True,
            )
            for h in sorted(job.targets)
        }
        shipped = {h for h, r in regs.items() if r.manifest_envelope}
        # h0..h4 in racks r0 (h0 h2 h4) and r1 (h1 h3): the first of each rack gets it
        assert shipped == {"h0", "h1"}
        for h, r in regs.items():
            if h in shipped:
                assert r.manifest_envelope == job.envelope and not r.manifest_sources
                continue
            assert r.manifest_envelope == b"" and r.manifest_digest == job.manifest.digest
            names = [p.host_id for p in r.manifest_sources]
            assert h not in names and len(names) == len(set(names)) <= 3
            assert names[0] == ("h0" if HOSTS[h] == "r0" else "h1")  # same rack first
            assert all(p.address for p in r.manifest_sources)
        # a source from the other rack fills the list behind the same-rack one
        assert [p.host_id for p in regs["h2"].manifest_sources] == ["h0", "h1"]
        # hosts that report holding it become sources too, ahead of hosts merely sent it,
        # whatever their ids; never more than three
        for h in ("h2", "h3", "h4"):
            c.report_progress(job.job_id, h, ProgressReport(manifest_digest=job.manifest.digest))
        h0 = c.register(
            job.job_id, "h0", "r0", b"", 1 << 40, "10.0.0.0:1", envelope_from_peers=True
        )
        names = [p.host_id for p in h0.manifest_sources]
        assert names[:2] in (["h2", "h4"], ["h4", "h2"]) and len(names) == 3
        assert names[2] == "h3"  # the other rack's holder before h1, which was only sent it
        # an agent that cannot take it from peers always gets it
        again = c.register(job.job_id, "h2", "r0", b"", 1 << 40, "10.0.0.2:1")
        assert again.manifest_envelope == job.envelope
        # a source spliced out is never named again
        with c.lock:
            c._mark_dead(job, "h0", "test")
        later = c.register(
            job.job_id, "h4", "r0", b"", 1 << 40, "10.0.0.4:1", envelope_from_peers=True
        )
        assert "h0" not in [p.host_id for p in later.manifest_sources]
    finally:
        c.store.close()


def test_data_centers_come_from_enrollment_and_only_wan_edges_compress(
    tmp_path: Path, checkpoint
) -> None:
    c = Coordinator(
        CoordinatorConfig(
            db=str(tmp_path / "c.sqlite"), trusted_keys=TrustedKeys.load(checkpoint["trusted"])
        )
    )
    try:
        for h, r in HOSTS.items():  # h0-h2 east, h3-h5 west; whatever the host claims
            c.enroll(h, r, {"cluster": "inf-a", "pool": "x", "dc": "east" if h < "h3" else "west"})
            c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
        with pytest.raises(Rejected, match="origin data center 'north' has no target host") as r:
            c.create_job(_spec(checkpoint, origin_dc="north"))
        assert r.value.check == "origin-dc"
        job = c.create_job(_spec(checkpoint, origin_dc="west"))
        topo = job.topology
        assert {h: topo.dc(h) for h in topo.racks} == {
            h: "east" if h < "h3" else "west" for h in HOSTS
        }
        assert {topo.dc(ch.root() or "") for ch in topo.stripes} == {"west"}  # the origin's DC
        assert {job.hosts[h].dc for h in ("h0", "h4")} == {"east", "west"}
        wan_edges = 0
        for h in topo.racks:
            for plan, chain in zip(_pushed(c, h, job.job_id).stripes, topo.stripes, strict=True):
                up = chain.parent[h]
                assert plan.compress == (up is not None and topo.dc(up) != topo.dc(h))
                wan_edges += plan.compress
        assert wan_edges == len(topo.stripes)  # one per stripe into the one remote DC
        # a late host of the east DC joins behind east hosts, never under a west one
        c.enroll("h9", "r1", {"cluster": "inf-a", "pool": "x", "dc": "east"})
        c.heartbeat("h9", "r1", "10.0.0.9:1", [])
        assert all(topo.dc(ch.parent["h9"] or "") == "east" for ch in job.topology.stripes)
        assert job.topology.dc("h9") == "east"
    finally:
        c.store.close()


def test_find_peers_names_at_most_the_limit_and_counts_every_holder(
    coord: Coordinator, checkpoint
) -> None:
    job = coord.create_job(_spec(checkpoint))
    n = job.manifest.num_chunks
    full = bitmap_from_bits([1] * n)
    for h in sorted(job.targets):
        coord.register(
            job.job_id, h, job.targets[h], full if h != "h0" else b"", 1 << 40, f"10.0.0.{h[1:]}:1"
        )
    found = coord.find_peers(job.job_id, "h0", 0, set(), 1)
    assert len(found.peers) == 1 and found.holders == 4  # h1-h4 hold it; h0 asks
    assert found.peers[0].host_id == "h2"  # same rack (r0) first
    fewer = coord.find_peers(job.job_id, "h0", 0, {"h2", "h4"}, 3)
    assert [p.host_id for p in fewer.peers] == ["h1", "h3"] and fewer.holders == 2


def test_a_quarantine_splice_promotes_the_fast_downstream_not_the_slow(
    coord: Coordinator, checkpoint
) -> None:
    job = coord.create_job(_spec(checkpoint))
    racks = job.topology.racks
    s, bad, kids = next(
        (s, h, c.children(h))
        for s, c in enumerate(job.topology.stripes)
        for h in c.order
        if len(c.children(h)) > 1 and any(racks[k] == racks[h] for k in c.children(h))
    )
    up = job.topology.stripes[s].parent[bad]
    unsteered = next(k for k in kids if racks[k] == racks[bad])  # the rule without evidence
    fast = next(k for k in kids if k != unsteered)
    # the same-rack downstream receives at a fifth of the reference rate: it is not promoted
    job.rate_reference = (1_000_000, 5_000_000)
    job.hosts[unsteered].rx_bps = 1_000_000
    job.hosts[fast].rx_bps = 5_000_000
    for n, w in enumerate((unsteered, fast)):  # two downstreams saw bad data from it
        coord.report_suspect(job.job_id, w, bad, "BAD_DATA", n)
    assert job.hosts[bad].state == "QUARANTINED"
    chain = job.topology.stripes[s]
    assert chain.parent[fast] == up and chain.parent[unsteered] == fast
    assert job.slow_hosts(0.5) == {unsteered}
    job.hosts[unsteered].ready = True  # READY: nothing left to receive, a fine upstream
    assert job.slow_hosts(0.5) == frozenset()


def test_slowness_survives_a_noisy_round_and_victims_that_drag_the_median(
    tmp_path: Path, checkpoint
) -> None:
    """The seed's "under 50 % for 10 s" on 1 s rates: one fast round inside the window does
    not restart the clock, and once the slow host's victims are most of the fleet their
    median is no reference (the held peak is)."""
    now = [1000.0]
    c = _clocked(tmp_path, checkpoint, now, slow_after_s=10.0, slow_min_median_bps=1)
    try:
        job = _fleet_job(c, checkpoint)
        for h in job.topology.racks:
            c.register(job.job_id, h, job.targets[h], b"", 1 << 40, f"10.0.0.{h[1:]}:1")
        idx = c._index(job)
        up = max(
            job.topology.racks,
            key=lambda h: len({k for s in range(4) for k in idx.downstreams(s, h)}),
        )
        kids = {s: set(idx.downstreams(s, up)) for s in range(4)}
        fast, slow = 12_000_000, 2_000_000

        def round_at(t: float, *, noisy: bool = False, victims: bool = False) -> None:
            now[0] = 1000.0 + t
            for h in job.topology.racks:
                if victims and h != up:  # the fleet slowed under it: the median falls
                    rates = tuple(slow if h in kids[s] else 7_000_000 for s in range(4))
                else:
                    rates = tuple(fast if noisy or h not in kids[s] else slow for s in range(4))
                report = ProgressReport(rx_bps=sum(rates), stripe_rx_bps=rates)
                c.report_progress(job.job_id, h, report)
            c.tick()

        for t in (0, 1, 2, 3):
            round_at(t)
        round_at(4, noisy=True)  # one round in which its downstreams caught up
        for t in (5, 6, 7, 8, 9):
            round_at(t, victims=True)
        assert not job.hosts[up].demoted  # 9 s of slowness so far
        round_at(10.5, victims=True)
        assert job.hosts[up].demoted and all(not ch.children(up) for ch in job.topology.stripes)
    finally:
        c.store.close()


def test_a_removal_without_a_splice_is_news_for_the_removed_hosts_watch(
    coord: Coordinator, checkpoint
) -> None:
    """A pass skips cursors already up to date under the same job signature; a host removed
    after it was spliced (no topology change) still hears that the job ended for it."""
    from relgate_agent.coordinator import removal

    job = coord.create_job(_spec(checkpoint))
    host = next(iter(job.topology.racks))
    cur, bystander = WatchCursor(host), WatchCursor(next(h for h in job.targets if h != host))
    coord.watch_updates([cur, bystander])
    assert coord.watch_updates([cur, bystander]) == [None, None]
    with coord.lock:
        coord._mark_dead(job, host, "silent")  # spliced: a new topology version
    coord.watch_updates([cur, bystander])
    version = job.topology.version
    with coord.lock:
        assert removal.remove_host(coord, job, host, "lost: gone past the bound")
    assert job.topology.version == version  # nothing left to splice
    u, b = coord.watch_updates([cur, bystander])
    assert u is not None and [a.job_state for a in u.assignments] == ["REMOVED"]
    assert u.jobs == () and b is None  # nothing changed for the others
    assert coord.watch_updates([cur, bystander]) == [None, None]


def test_heartbeats_batch_their_last_seen_and_the_tick_writes_it(
    tmp_path: Path, checkpoint
) -> None:
    """A heartbeat that only refreshes last_seen is written by the next tick, in one
    transaction for every host, not one transaction per watch reopened."""
    now = [1000.0]
    c = _clocked(tmp_path, checkpoint, now, host_ttl_s=60.0)
    try:
        for h, r in HOSTS.items():
            c.enroll(h, r, {"cluster": "inf-a"})
            c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])

        def stored() -> dict[str, int]:
            with c.store.tx() as conn:
                rows = conn.exec_driver_sql("SELECT host_id, last_seen FROM dist_hosts")
                return {r[0]: int(r[1]) for r in rows}

        first = stored()
        now[0] += 25.0  # past a third of the TTL: due
        c.wall = lambda: max(first.values()) + 25.0
        for h, r in HOSTS.items():
            c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
        assert stored() == first  # not one transaction per heartbeat
        c.tick()
        after = stored()
        assert all(after[h] == max(first.values()) + 25 for h in HOSTS)
        assert c.flush_last_seen() == 0  # nothing left
        c.heartbeat("h1", HOSTS["h1"], "10.0.0.1:2", [])  # a new address: written at once
        with c.store.tx() as conn:
            addr = conn.exec_driver_sql("SELECT address FROM dist_hosts WHERE host_id='h1'")
            assert addr.scalar() == "10.0.0.1:2"
    finally:
        c.store.close()


def test_a_host_holding_its_watch_open_stays_live_past_the_heartbeat_interval(
    tmp_path: Path, checkpoint
) -> None:
    """Opening a watch is a heartbeat; holding it open keeps the host's last_seen fresh
    (batched by the sweep), so a watch may live longer than a third of the host TTL; a
    host whose watch ended is left to age out."""
    now = [1000.0]
    born = time.time()  # the inventory's first rows carry the real wall clock
    c = Coordinator(
        CoordinatorConfig(
            db=str(tmp_path / "c.sqlite"), trusted_keys=TrustedKeys.load(checkpoint["trusted"])
        ),
        clock=lambda: now[0],
        wall=lambda: born + now[0] - 1000.0,
    )
    for h, r in HOSTS.items():
        c.enroll(h, r, {"cluster": "inf-a"})
        c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
    start = c.store.last_seen()
    c.watching["h0"] = 1  # h0's stream is open; the others' ended
    now[0] += c.config.host_ttl_s / 3 - 1
    c.tick()
    assert c.store.last_seen() == start  # not due yet
    now[0] += 2
    c.tick()
    seen = c.store.last_seen()
    assert seen["h0"] == int(born + now[0] - 1000.0) > start["h0"]
    assert all(seen[h] == start[h] for h in HOSTS if h != "h0")
    assert c.refresh_watching() == 0  # written: due again a third of the TTL later
