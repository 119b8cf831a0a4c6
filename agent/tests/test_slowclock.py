"""Slowness evidence across a leader change: a new coordinator on the same store resumes the
slow clocks, demotions and held reference (real SQLite, real signed manifest)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from agent_harness import job_spec
from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import TrustedKeys

from relgate_agent.contracts import ProgressReport
from relgate_agent.coordinator import slowclock
from relgate_agent.coordinator.failover import takeover_grace_s
from relgate_agent.coordinator.handoff import HandoffService
from relgate_agent.coordinator.jobstate import HostProgress, JobState
from relgate_agent.coordinator.service import Coordinator, CoordinatorConfig
from relgate_agent.coordinator.topology import append_host

HOSTS = {f"h{i}": f"r{i % 2}" for i in range(6)}
FAST, SLOW = 12_000_000, 2_000_000
T0 = 1000.0


WALL = 1_764_000_000.25  # the wall clock at the dial's zero (a fraction of a second in it)


def _leader(tmp_path: Path, checkpoint, now: list[float], origin: float = 0.0) -> Coordinator:
    """A coordinator on the test's dial ``now[0]``: its own clock reads ``now[0] + origin``
    (each replica's monotonic clock starts elsewhere), the wall clock ``now[0] + WALL``."""
    return Coordinator(
        CoordinatorConfig(
            db=str(tmp_path / "c.sqlite"),
            trusted_keys=TrustedKeys.load(checkpoint["trusted"]),
            slow_after_s=10.0,
            slow_min_median_bps=1,
        ),
        clock=lambda: now[0] + origin,
        wall=lambda: now[0] + WALL,
    )


def _job(c: Coordinator, checkpoint) -> tuple[JobState, str, dict[int, set[str]]]:
    """A 4-stripe job over 6 hosts and the host with the most downstreams (the slow one)."""
    for h, r in HOSTS.items():
        c.enroll(h, r, {"cluster": "inf-a"})
        c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
    spec = JobSpec(**job_spec(checkpoint))
    job = c.create_job(spec)
    for h in job.topology.racks:
        c.register(job.job_id, h, job.targets[h], b"", 1 << 40, f"10.0.0.{h[1:]}:1")
    c.tick()  # a sweep before any rate: nothing to judge, no reference to write
    assert c.store.rate_reference(job.job_id) is None
    idx = c._index(job)
    up = max(
        job.topology.racks, key=lambda h: len({k for s in range(4) for k in idx.downstreams(s, h)})
    )
    return job, up, {s: set(idx.downstreams(s, up)) for s in range(4)}


def _rounds(
    now: list[float],
    c: Coordinator,
    job_id: str,
    up: str,
    kids,
    ts,
    mode: str = "slow",
    silent: str = "",
) -> None:
    """Report rounds at ``T0 + t``. ``slow``: ``up``'s downstreams fall behind it where it
    feeds them (and receive at speed elsewhere); ``fast``: nobody is slow. ``silent``
    sends nothing."""
    for t in ts:
        now[0] = T0 + t
        for h in c.jobs[job_id].topology.racks:
            if h == silent:
                continue
            rates = tuple(SLOW if mode != "fast" and h in kids[s] else FAST for s in range(4))
            c.report_progress(job_id, h, ProgressReport(rx_bps=sum(rates), stripe_rx_bps=rates))
        c.tick()


def every(a: float, b: float) -> list[float]:
    """A report round every second from ``a`` up to ``b``."""
    return [a + i for i in range(int(b - a) + 1)]


def _slow_start(
    tmp_path: Path, checkpoint, ts
) -> tuple[list[float], Coordinator, JobState, str, dict]:
    """A leader that has seen ``up`` slow at the rounds ``ts``."""
    now = [T0]
    first = _leader(tmp_path, checkpoint, now)
    job, up, kids = _job(first, checkpoint)
    _rounds(now, first, job.job_id, up, kids, ts)
    return now, first, job, up, kids


def test_a_new_leader_credits_only_the_slowness_the_old_one_watched(
    tmp_path: Path, checkpoint
) -> None:
    now, first, job, up, kids = _slow_start(tmp_path, checkpoint, (0, 1, 2, 3, 4, 5, 6))
    assert job.hosts[up].slow_since == T0 and not job.hosts[up].demoted
    reference = job.rate_reference
    # written every 2 s: at 0, 2, 4 and 6
    assert first.store.rate_reference(job.job_id).at_ms == int((T0 + 6 + WALL) * 1000)
    first.store.close()  # the leader dies 6 s into the host's 10 s

    now[0] = T0 + 8.0  # the lease passes to a second replica 2 s later
    second = _leader(tmp_path, checkpoint, now, origin=-500.0)
    try:
        resumed = second.jobs[job.job_id]
        hp = resumed.hosts[up]
        # the 6 s the old leader watched are credited; the 2 s nobody watched are not
        assert hp.slow_since is None and hp.slow_credit == pytest.approx(6.0, abs=1e-3)
        assert resumed.rate_reference == reference
        assert resumed.rate_reference_at == pytest.approx(T0 + 6 - 500.0, abs=1e-3)
        grace = takeover_grace_s(second.config)
        interval = second.config.report_interval_s
        # the takeover's grace: until every host of the chains has sent this leader rates
        # for a whole report interval, nobody is judged slow
        _rounds(now, second, job.job_id, up, kids, every(8, 8 + interval - 0.5))
        assert hp.slow_since is None and not hp.demoted
        # then judgement resumes, long before the grace would end, with the 6 s credited
        start = 8 + interval
        _rounds(now, second, job.job_id, up, kids, every(start, start + 3.5))
        assert hp.slow_since == pytest.approx(T0 + start - 6.0 - 500.0, abs=1e-3)
        assert not hp.demoted  # 6 s watched before + 3 s under this leader
        _rounds(now, second, job.job_id, up, kids, (start + 4.5,))
        assert hp.demoted and start + 4.5 < 8 + grace
        assert any(e.startswith("DEMOTED tx:") for e in hp.errors)
        assert all(not ch.children(up) for ch in resumed.topology.stripes)
        assert not any(resumed.hosts[k].demoted for k in set().union(*kids.values()))
    finally:
        second.store.close()

    third = _leader(tmp_path, checkpoint, now)  # and the demotion itself is durable
    try:
        assert third.jobs[job.job_id].hosts[up].demoted
        assert third.jobs[job.job_id].hosts[up].slow_since is None  # a leaf has no clock
        assert third.jobs[job.job_id].slow_hosts(0.5) >= {up}
    finally:
        third.store.close()


@pytest.mark.parametrize(
    ("ready", "registered"),
    [(False, False), (True, False), (False, True)],
    ids=["transferring", "ready", "registered"],
)
def test_a_host_that_never_reports_to_the_new_leader_is_no_evidence_and_dead_at_the_grace(
    tmp_path: Path, checkpoint, ready: bool, registered: bool
) -> None:
    now, first, job, up, kids = _slow_start(tmp_path, checkpoint, (0, 1, 2, 3, 4, 5, 6))
    first.store.close()
    now[0] = T0 + 8.0
    second = _leader(tmp_path, checkpoint, now)
    try:
        grace = takeover_grace_s(second.config)
        interval = second.config.report_interval_s
        silent = next(h for h in job.topology.racks if h != up and h not in kids[0])
        resumed = second.jobs[job.job_id]
        resumed.hosts[silent].ready = ready  # a placed copy may send no rates: not awaited
        if registered:  # heard (its watch moved over) but no rates yet: not "sending 0 B/s"
            sp = resumed.hosts[silent]
            second.register(job.job_id, silent, sp.rack, b"", 1 << 40, sp.address)
        hp = resumed.hosts[up]
        if ready:
            _rounds(now, second, job.job_id, up, kids, every(8, 8 + interval), silent=silent)
            assert hp.slow_since is not None
            return
        if registered:
            # it moved over (registered) and its rates are due: judgement waits for them,
            # and it is a witness of nobody; silent past dead_after_s it is dead (it was
            # heard), and judgement resumes without it
            _rounds(now, second, job.job_id, up, kids, every(8, 8 + 2 * interval), silent=silent)
            assert hp.slow_since is None
            assert not any(silent in h.slow_with for h in resumed.hosts.values())
            end = 9 + second.config.dead_after_s + 2 * interval
            _rounds(now, second, job.job_id, up, kids, every(9, end), silent=silent)
            assert resumed.hosts[silent].state == "DEAD" and hp.slow_since is not None
            return
        # every other host reports at once; the silent one may be dead or still on the
        # frozen leader: its hops are no evidence, and it does not hold the others'
        # judgement (hosts killed with the old leader held it for the whole grace)
        _rounds(now, second, job.job_id, up, kids, every(8, 8 + 2 * interval), silent=silent)
        assert hp.slow_since is not None and resumed.hosts[silent].state != "DEAD"
        assert not any(silent in h.slow_with for h in resumed.hosts.values())
        _rounds(
            now,
            second,
            job.job_id,
            up,
            kids,
            every(9 + 2 * interval, 8 + grace - 0.5),
            silent=silent,
        )
        assert hp.demoted and not resumed.hosts[silent].demoted
        assert resumed.hosts[silent].state != "DEAD"  # not heard: the whole grace to move over
        # at its end the silent host is dead, out of the chains
        _rounds(now, second, job.job_id, up, kids, every(8 + grace, 8 + grace + 1), silent=silent)
        assert resumed.hosts[silent].state == "DEAD"
    finally:
        second.store.close()


def test_a_long_gap_credits_only_what_was_watched(tmp_path: Path, checkpoint) -> None:
    now, first, job, up, _ = _slow_start(tmp_path, checkpoint, (0, 1, 2))
    first.store.close()
    now[0] = T0 + 3600.0  # nobody led for an hour
    second = _leader(tmp_path, checkpoint, now)
    try:
        hp = second.jobs[job.job_id].hosts[up]
        assert hp.slow_credit == pytest.approx(2.0, abs=1e-3) and not hp.demoted
    finally:
        second.store.close()


def test_the_credit_is_measured_on_the_old_leaders_clock(tmp_path: Path, checkpoint) -> None:
    now, first, job, up, _ = _slow_start(tmp_path, checkpoint, (0, 1, 2))
    first.store.close()
    now[0] = T0 - 30.0  # the new replica's wall clock is 32 s behind the old one's
    second = _leader(tmp_path, checkpoint, now)
    try:
        resumed = second.jobs[job.job_id]
        assert resumed.hosts[up].slow_credit == pytest.approx(2.0, abs=1e-3)
        assert resumed.rate_reference_at == pytest.approx(now[0], abs=1e-3)
    finally:
        second.store.close()


def test_a_host_the_new_leader_sees_fast_loses_its_old_clock(tmp_path: Path, checkpoint) -> None:
    now, first, job, up, kids = _slow_start(tmp_path, checkpoint, (0, 1, 2, 3, 4))
    first.store.close()
    now[0] = T0 + 5.0
    second = _leader(tmp_path, checkpoint, now)
    try:
        start = 5 + takeover_grace_s(second.config)
        _rounds(now, second, job.job_id, up, kids, (start,), mode="fast")
        assert second.jobs[job.job_id].hosts[up].slow_credit == 0.0
        assert second.store.slowness(job.job_id) == {}  # a third leader restores nothing
        # slow again: a clock of this leader's own, no credit
        _rounds(now, second, job.job_id, up, kids, (start + 1,))
        assert second.jobs[job.job_id].hosts[up].slow_since == pytest.approx(T0 + start + 1)
    finally:
        second.store.close()


def test_every_changed_host_is_written(tmp_path: Path, checkpoint) -> None:
    now, first, job, up, _ = _slow_start(tmp_path, checkpoint, (0,))
    try:
        others = [h for h in job.hosts if h != up]
        for h in others:  # demoted by an operator's hand, all at once
            job.hosts[h].demoted = True
        slowclock.save(first.store, job, now[0], now[0] + WALL)
        stored = first.store.slowness(job.job_id)
        assert set(stored) == {up, *others}
        assert all(stored[h].demoted and stored[h].slow_since_ms == 0 for h in others)
        assert stored[up].slow_since_ms == int((T0 + WALL) * 1000)
    finally:
        first.store.close()


def test_recovery_clears_the_stored_clock(tmp_path: Path, checkpoint) -> None:
    now, first, job, up, kids = _slow_start(tmp_path, checkpoint, (0, 1))
    assert set(first.store.slowness(job.job_id)) == {up}
    # fast again for longer than the grace: the clock stops, in memory and in the store
    _rounds(now, first, job.job_id, up, kids, (2, 3, 4, 5, 6), mode="fast")
    try:
        assert job.hosts[up].slow_since is None
        assert first.store.slowness(job.job_id) == {}
    finally:
        first.store.close()
    second = _leader(tmp_path, checkpoint, now)
    try:
        assert second.jobs[job.job_id].hosts[up].slow_since is None
    finally:
        second.store.close()


def test_a_demoted_host_is_no_evidence_against_its_new_upstreams(
    tmp_path: Path, checkpoint
) -> None:
    now = [T0]
    c = _leader(tmp_path, checkpoint, now)
    try:
        job, _, _ = _job(c, checkpoint)
        leaf = sorted(job.topology.racks)[-1]
        hp = job.hosts[leaf]
        hp.demoted = True  # judged slow before: a leaf at its rack tail, as _demote_slow does
        with c.lock:
            c._set_topology(job, append_host(c._splice(job, leaf), leaf, hp.rack, hp.dc))
        # it stays slow in a stripe behind whoever feeds it there (an upstream that reports
        # sending little: it feeds the slow leaf alone); everyone else is fast
        kids: dict[int, set[str]] = {s: set() for s in range(4)}
        kids[0] = {leaf}
        _rounds(now, c, job.job_id, "", kids, every(0, 15))
        assert [h for h, hp in job.hosts.items() if hp.demoted] == [leaf]
    finally:
        c.store.close()


def test_a_demoted_host_witnesses_only_for_the_child_whose_lag_alone_accused_it() -> None:
    """Demoted on evidence that explains its children's lag (two accusers, or one that
    receives well elsewhere), a host is nobody's witness any more: the fairness bench's
    victim h14 was demoted "behind h06, h10, h11" after h10 was. Demoted on one child's lag
    alone (a tie), it stays that child's witness: lagging the next upstream makes the
    child the suspect. A silent host witnesses for nobody."""
    hosts = {h: HostProgress(h, "r0") for h in ("u", "t", "k", "j", "s")}
    hosts["u"].demoted = True  # on evidence: accused_by stays empty
    hosts["t"].demoted, hosts["t"].accused_by = True, frozenset({"k"})  # on k's lag alone
    for h in ("k", "j"):
        hosts[h].slow_with = frozenset({"u", "t", "s", "free"})
    job = SimpleNamespace(hosts=hosts)
    moving = {"k": hosts["k"], "j": hosts["j"]}
    got = HandoffService._history(job, moving, {"s"})  # type: ignore[arg-type]
    assert got == {"k": {"t", "free"}, "j": {"free"}}
