"""A leader that takes over judges nobody on the takeover's silence (real SQLite, a real
signed manifest, the coordinator on a test clock): hosts it never heard from get the
agents' reply timeout plus their reconnect time; one that reported and then went silent
is judged as usual; one killed before it re-reported ends DEAD, never PENDING."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from agent_harness import job_spec
from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import TrustedKeys

from relgate_agent.agent.job import Assignments
from relgate_agent.contracts import ProgressReport
from relgate_agent.coordinator.failover import takeover_grace_s
from relgate_agent.coordinator.jobstate import NotLeader
from relgate_agent.coordinator.leader import LEASE_SELF_FRACTION
from relgate_agent.coordinator.service import Coordinator, CoordinatorConfig
from relgate_agent.coordinator.wire import assignment_to_pb
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.rpc import RECONNECT_S, REPORT_REPLY_TIMEOUT_S

HOSTS = {f"h{i}": f"r{i % 2}" for i in range(6)}
T0 = 1000.0


def _leader(tmp_path: Path, checkpoint, now: list[float]) -> Coordinator:
    return Coordinator(
        CoordinatorConfig(
            db=str(tmp_path / "c.sqlite"),
            trusted_keys=TrustedKeys.load(checkpoint["trusted"]),
            dead_after_s=6.0,
        ),
        clock=lambda: now[0],
        wall=lambda: now[0] + 1_764_000_000,
    )


def _job_on_first_leader(tmp_path: Path, checkpoint, now: list[float]):
    """A leader with every host enrolled and a job every host registered with."""
    first = _leader(tmp_path, checkpoint, now)
    for h, r in HOSTS.items():
        first.enroll(h, r, {"cluster": "inf-a"})
        first.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
    job = first.create_job(JobSpec(**job_spec(checkpoint)))
    for h in job.topology.racks:
        first.register(job.job_id, h, job.targets[h], b"", 1 << 40, f"10.0.0.{h[1:]}:1")
    return first, job


def _report(c: Coordinator, job_id: str, hosts) -> None:
    for h in hosts:
        c.report_progress(job_id, h, ProgressReport(rx_bps=1, stripe_rx_bps=(1,) * 4))


def test_the_grace_is_the_agents_reply_timeout_plus_reconnect(tmp_path: Path, checkpoint) -> None:
    c = _leader(tmp_path, checkpoint, [T0])
    try:
        grace = takeover_grace_s(c.config)
        assert grace >= REPORT_REPLY_TIMEOUT_S + RECONNECT_S > c.config.dead_after_s
        # the sum exactly, whatever the report interval
        slower = dataclasses.replace(c.config, report_interval_s=2.5)
        assert takeover_grace_s(slower) == REPORT_REPLY_TIMEOUT_S + RECONNECT_S + 2.5
    finally:
        c.store.close()


def test_a_new_leader_splices_only_hosts_it_had_a_chance_to_hear(
    tmp_path: Path, checkpoint
) -> None:
    now = [T0]
    first, job = _job_on_first_leader(tmp_path, checkpoint, now)
    _report(first, job.job_id, HOSTS)
    first.tick()
    first.store.close()  # the leader froze (or died) mid-job

    now[0] = T0 + 5.0  # the lease passes on
    second = _leader(tmp_path, checkpoint, now)
    try:
        grace = takeover_grace_s(second.config)
        resumed = second.jobs[job.job_id]
        silent, early_dead = "h5", "h4"  # h4 reports once, then dies; h5 never reports
        streaming = [h for h in HOSTS if h not in (silent, early_dead)]
        _report(second, job.job_id, HOSTS.keys() - {silent})
        t = 0.0
        while t < grace - 1:  # the others' reports reach the new leader every second
            t += 1
            now[0] = T0 + 5 + t
            _report(second, job.job_id, streaming)
            second.tick()
            if t > second.config.dead_after_s + 1:  # it had its chance: judged as usual
                assert resumed.hosts[early_dead].state == "DEAD"
            assert resumed.hosts[silent].state == "PENDING"  # never judged on the takeover
            assert all(resumed.hosts[h].state == "TRANSFERRING" for h in streaming)
        now[0] = T0 + 5 + grace + 1
        _report(second, job.job_id, streaming)
        second.tick()
        assert resumed.hosts[silent].state == "DEAD"  # killed before it re-reported: DEAD
        assert any("no report since the takeover" in e for e in resumed.hosts[silent].errors)
        assert all(resumed.hosts[h].state == "TRANSFERRING" for h in streaming)
        assert not any("spliced out" in e for h in streaming for e in resumed.hosts[h].errors)
    finally:
        second.store.close()


def test_a_host_spliced_before_a_takeover_stays_dead_and_is_removed(
    tmp_path: Path, checkpoint
) -> None:
    """bench chaos: h02 and h09 were killed and spliced out by the first leader; the leader
    that took over after the next one froze restored them as PENDING (the default state of
    a rebuilt cache), outside the chains, so no sweep judged them again: PENDING to the
    end, and the job waited on them. A target missing from the restored topology, not
    READY and not removed or quarantined, was spliced: DEAD, and removed in due course."""
    now = [T0]
    first, job = _job_on_first_leader(tmp_path, checkpoint, now)
    alive = [h for h in HOSTS if h != "h3"]
    _report(first, job.job_id, HOSTS)
    for t in range(1, 9):  # h3 dies: spliced out after dead_after_s
        now[0] = T0 + t
        _report(first, job.job_id, alive)
        first.tick()
    assert first.jobs[job.job_id].hosts["h3"].state == "DEAD"
    assert "h3" not in first.jobs[job.job_id].topology.racks
    first.store.close()

    now[0] = T0 + 20.0
    second = _leader(tmp_path, checkpoint, now)
    try:
        resumed = second.jobs[job.job_id]
        gone = resumed.hosts["h3"]
        assert gone.state == "DEAD" and "h3" not in resumed.topology.racks
        assert any("before the takeover" in e for e in gone.errors)
        bound = second.config.remove_dead_after_s
        t = 0.0
        while "h3" not in resumed.removed:
            assert t <= bound + 2, "a host spliced before the takeover was never removed"
            t += 1
            now[0] = T0 + 20 + t
            _report(second, job.job_id, alive)
            second.tick()
        assert all(resumed.hosts[h].state == "TRANSFERRING" for h in alive)
    finally:
        second.store.close()


def _plan(epoch: int, version: int) -> pb.Assignment:
    return pb.Assignment(
        job_id="j",
        topology_version=version,
        leader_epoch=epoch,
        job_state="DISTRIBUTING",
        stripes=[pb.StripeAssignment(stripe=0, upstream=pb.Peer(host_id=f"e{epoch}v{version}"))],
    )


def test_agents_refuse_an_assignment_from_an_older_lease_epoch() -> None:
    """A deposed (frozen, then thawed) leader pushes what it holds: refused by its epoch,
    whatever its topology version; a new leader's plan is applied even at the version the
    agent already holds (it loaded that version from the store)."""
    a = Assignments()
    a.apply(_plan(3, 10))
    a.apply(_plan(4, 10))  # the new leader, same stored version
    assert (a.epoch, a.topology_version) == (4, 10)
    a.apply(_plan(3, 12))  # the deposed leader, a higher version
    assert (a.epoch, a.topology_version) == (4, 10)
    assert a.by_stripe[0].upstream.host_id == "e4v10"
    a.apply(_plan(4, 9))  # the same leader never rewires backwards
    a.apply(_plan(5, 9))  # nor does a later epoch behind the stored version
    assert (a.epoch, a.topology_version) == (4, 10)
    a.apply(_plan(4, 11))
    assert a.by_stripe[0].upstream.host_id == "e4v11"


def test_the_leader_stamps_its_epoch_on_every_assignment(tmp_path: Path, checkpoint) -> None:
    c = _leader(tmp_path, checkpoint, [T0])
    try:
        for h, r in HOSTS.items():
            c.enroll(h, r, {"cluster": "inf-a"})
            c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
        job = c.create_job(JobSpec(**job_spec(checkpoint)))
        c.epoch = 7  # as maintain_lease sets it on taking the lease
        plan = c._assignment(job, "h0")
        assert plan.leader_epoch == 7
        assert assignment_to_pb(plan).leader_epoch == 7
    finally:
        c.store.close()


def test_a_leader_whose_renewal_hangs_stops_serving_before_the_lease_can_pass(
    tmp_path: Path, checkpoint
) -> None:
    """The lease is good for the TTL after a renewal began; a leader whose next renewal
    hangs (its store cut off with the network) stops answering and judging at
    LEASE_SELF_FRACTION of it, by its own clock, before another replica may take it, and
    leads on when a renewal comes back."""
    now = [T0]
    c = Coordinator(
        CoordinatorConfig(
            db=str(tmp_path / "c.sqlite"),
            trusted_keys=TrustedKeys.load(checkpoint["trusted"]),
            ha=True,
            lease_ttl_s=5.0,
        ),
        clock=lambda: now[0],
    )
    try:
        c.maintain_lease()
        assert c.leader and c.epoch == 1
        good = 5.0 * LEASE_SELF_FRACTION
        assert 0 < good < 5.0
        now[0] = T0 + good - 0.01  # no renewal since (it hangs): still inside its lease
        c.require_leader()
        now[0] = T0 + good
        assert not c.leader
        with pytest.raises(NotLeader):
            c.require_leader()
        c.tick()  # judges nobody either (nothing to judge here; it returns at once)
        c.maintain_lease()  # the renewal came back: the same epoch, it leads on
        assert c.leader and c.epoch == 1
    finally:
        c.store.close()
