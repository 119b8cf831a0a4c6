"""A new topology version is pushed only to the hosts whose assignment changed (push keys).

Real SQLite coordinator and signed manifest on a turned clock; each host's watch is a
cursor, and what a host holds is what its cursor was last pushed.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
from relgate_trust.datacenter import DC_LABEL
from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import TrustedKeys

from relgate_agent.contracts import AssignmentPlan, ProgressReport, WatchCursor
from relgate_agent.coordinator.jobstate import JobState
from relgate_agent.coordinator.service import Coordinator, CoordinatorConfig
from relgate_agent.coordinator.topology import members_changed

HOSTS = {f"h{i:02d}": f"r{i % 4}" for i in range(24)}


def _coordinator(tmp_path: Path, checkpoint, now: list[float]) -> Coordinator:
    c = Coordinator(
        CoordinatorConfig(
            db=str(tmp_path / "c.sqlite"),
            trusted_keys=TrustedKeys.load(checkpoint["trusted"]),
            dead_after_s=6.0,
            mass_silence_fraction=0.5,
        ),
        clock=lambda: now[0],
    )
    for h, r in HOSTS.items():
        c.enroll(h, r, {"pool": "x"})
        c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
    return c


def _job(c: Coordinator, checkpoint, hosts: dict[str, str]) -> JobState:
    job = c.create_job(
        JobSpec(
            model="claude-x",
            version="2026-10-12.3",
            manifest_uri=str(checkpoint["envelope"]),
            target_selector="pool=x",
            stripes=4,
        )
    )
    for h in hosts:
        c.register(job.job_id, h, job.targets[h], b"", 1 << 40, f"10.0.0.{h[1:]}:2")
    return job


def _shape(a: AssignmentPlan) -> tuple[object, ...]:
    """What a host acts on, without the version, resume blocks and member list."""
    return tuple(
        (
            s.upstream.host_id,
            s.upstream.address,
            tuple((d.host_id, d.address) for d in s.downstreams),
            s.origin_rate_bytes_per_s,
            s.bypass.host_id if s.bypass else None,
            tuple(g.host_id for g in s.standby),
        )
        for s in a.stripes
    )


class Fleet:
    """Every host's watch cursor and the assignment it holds (the last one pushed)."""

    def __init__(self, c: Coordinator, job: JobState) -> None:
        self.c, self.job = c, job
        self.cursors = {h: WatchCursor(h) for h in job.topology.racks}
        self.held: dict[str, AssignmentPlan] = {}
        self.pass_()

    def pass_(self) -> set[str]:
        """One watch pass; the hosts pushed an assignment of the job."""
        pushed = set()
        hosts = list(self.cursors)
        for h, u in zip(hosts, self.c.watch_updates([self.cursors[h] for h in hosts]), strict=True):
            for a in u.assignments if u is not None else ():
                if a.job_id == self.job.job_id:
                    self.held[h] = a
                    pushed.add(h)
        return pushed

    def assert_current(self) -> None:
        """Every host acts on what the coordinator would assign it now."""
        for h in self.job.topology.racks:
            now = self.c._assignment(self.job, h)
            assert _shape(self.held[h]) == _shape(now), h
            assert self.held[h].topology_version <= self.job.topology.version


def test_a_death_is_pushed_to_its_neighbours_only(tmp_path: Path, checkpoint) -> None:
    now = [1000.0]
    c = _coordinator(tmp_path, checkpoint, now)
    try:
        job = _job(c, checkpoint, HOSTS)
        fleet = Fleet(c, job)
        assert set(fleet.held) == set(HOSTS)
        fleet.assert_current()
        assert fleet.pass_() == set()  # nothing new
        # one host dies (silent past --dead-after while the others report)
        chain = job.topology.stripes[0]
        victim = next(h for h in chain.order if chain.children(h) and chain.parent.get(h))
        v = job.topology.version
        now[0] += 6.5
        for h in HOSTS:
            if h != victim:
                c.report_progress(job.job_id, h, ProgressReport())
        c.tick()
        assert job.hosts[victim].state == "DEAD" and job.topology.version > v
        del fleet.cursors[victim]
        pushed = fleet.pass_()
        # its upstreams and downstreams (and hosts that bypass to or through it) per
        # stripe: some, never all (a splice at 4,096 hosts was 4,096 pushes)
        held = fleet.held[victim]
        around = {s.upstream.host_id for s in held.stripes} | {
            d.host_id for s in held.stripes for d in s.downstreams
        }
        assert around - {"ORIGIN"} <= pushed <= set(HOSTS) - {victim}
        assert len(pushed) < len(HOSTS) - 1
        fleet.assert_current()  # the ones not pushed hold what they would be pushed
        # the dead host stays a member for the hosts not pushed: harmless, and it rejoins
        # by registering, which grows the member set: then everyone hears
        assert fleet.pass_() == set()
        c.register(job.job_id, victim, job.targets[victim], b"", 1 << 40, "10.0.0.99:2")
        fleet.cursors[victim] = WatchCursor(victim)
        assert fleet.pass_() == set(HOSTS)
        fleet.assert_current()
        assert all(victim in a.members for a in fleet.held.values())
    finally:
        c.store.close()


def test_a_register_is_pushed_to_its_host_even_when_nothing_moved(
    tmp_path: Path, checkpoint
) -> None:
    """An agent acts on nothing older than the version Register answered: a Register of a
    host that holds an older version (not pushed since: nothing of it changed) reaches its
    watch with the current version even when it moved nobody; no other host hears."""
    now = [1000.0]
    c = _coordinator(tmp_path, checkpoint, now)
    try:
        job = _job(c, checkpoint, HOSTS)
        fleet = Fleet(c, job)
        victim = sorted(HOSTS)[0]
        now[0] += 6.5
        for h in HOSTS:
            if h != victim:
                c.report_progress(job.job_id, h, ProgressReport())
        c.tick()
        del fleet.cursors[victim]
        pushed = fleet.pass_()
        h = next(h for h in sorted(HOSTS) if h not in pushed and h != victim)
        assert fleet.held[h].topology_version < job.topology.version
        reg = c.register(job.job_id, h, job.targets[h], b"", 1 << 40, f"10.0.0.{h[1:]}:2")
        assert reg.topology_version == job.topology.version
        assert fleet.pass_() == {h}
        assert fleet.held[h].topology_version == reg.topology_version
        # a restarted agent on a new address: its neighbours are told the address
        c.register(job.job_id, h, job.targets[h], b"", 1 << 40, "10.9.9.9:2")
        pushed = fleet.pass_()
        assert h in pushed and len(pushed) < len(HOSTS)
        fleet.assert_current()
    finally:
        c.store.close()


def test_member_changes_that_every_host_must_hear() -> None:
    dead = {"d"}.__contains__
    assert not members_changed(("a", "b", "d"), ("a", "b"), dead)  # a death: no
    assert members_changed(("a", "b"), ("a", "b", "c"), dead)  # a join: yes
    assert members_changed(("a", "b", "q"), ("a", "b"), dead)  # quarantined, evicted: yes
    assert members_changed(("a", "d"), ("a", "c"), dead)  # one in, one dead out: yes
    assert not members_changed(("a", "b"), ("b", "a"), dead)


def test_a_quarantine_reaches_every_host(tmp_path: Path, checkpoint) -> None:
    """A member no one may serve any more (quarantined: bad data from two receivers) is
    news for every host, unlike a death: every host is pushed a member list without it."""
    now = [1000.0]
    c = _coordinator(tmp_path, checkpoint, now)
    try:
        job = _job(c, checkpoint, HOSTS)
        fleet = Fleet(c, job)
        chain = job.topology.stripes[0]
        victim = next(h for h in chain.order if chain.children(h))
        kid = chain.children(victim)[0]
        other = next(h for h in sorted(HOSTS) if h not in (victim, kid))
        c.report_suspect(job.job_id, kid, victim, "BAD_DATA", 0)
        c.report_suspect(job.job_id, other, victim, "BAD_DATA", 1)
        assert job.hosts[victim].state == "QUARANTINED"
        del fleet.cursors[victim]
        assert fleet.pass_() == set(HOSTS) - {victim}
        assert all(victim not in a.members for h, a in fleet.held.items() if h != victim)
        fleet.assert_current()
    finally:
        c.store.close()


def test_a_change_in_a_hosts_second_job_is_pushed(tmp_path: Path, checkpoint) -> None:
    """A host in two jobs: the first unchanged, the second spliced around it. The first
    job's quiet does not hide the second's change."""
    now = [1000.0]
    c = _coordinator(tmp_path, checkpoint, now)
    try:
        first = _job(c, checkpoint, HOSTS)
        second = _job(c, checkpoint, HOSTS)
        assert first.job_id != second.job_id and list(c.jobs)[-1] == second.job_id
        cursors = {h: WatchCursor(h) for h in HOSTS}
        c.watch_updates(list(cursors.values()))
        chain = second.topology.stripes[0]
        victim = next(h for h in chain.order if chain.children(h) and chain.parent.get(h))
        kid = chain.children(victim)[0]
        now[0] += 6.5
        for h in HOSTS:
            c.report_progress(first.job_id, h, ProgressReport())
            if h != victim:
                c.report_progress(second.job_id, h, ProgressReport())
        c.tick()
        assert second.hosts[victim].state == "DEAD" and first.hosts[victim].state != "DEAD"
        (u,) = c.watch_updates([cursors[kid]])
        assert u is not None and [a.job_id for a in u.assignments] == [second.job_id]
    finally:
        c.store.close()


def _random_walk(tmp_path: Path, checkpoint, seed: int, dcs: bool) -> tuple[int, int]:
    """Deaths, rejoins (some on new addresses), address changes (some moved and back before
    the next version), quarantines, and passes left out (cursors several versions behind),
    at random: after every pass each host acts on what the coordinator would assign it
    now, though only the hosts a change moved had their keys computed (keydiff.py).
    Returns (keys computed, keys skipped) over the walk."""
    rng = random.Random(seed)
    now = [1000.0]
    hosts = {f"h{i:02d}": f"r{i % 5}" for i in range(40)}
    c = Coordinator(
        CoordinatorConfig(
            db=str(tmp_path / f"w{seed}.sqlite"),
            trusted_keys=TrustedKeys.load(checkpoint["trusted"]),
            dead_after_s=6.0,
            mass_silence_fraction=0.5,
        ),
        clock=lambda: now[0],
    )
    try:
        for i, (h, r) in enumerate(hosts.items()):
            c.enroll(h, r, {"pool": "x", **({DC_LABEL: f"dc{i % 2}"} if dcs else {})})
            c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
        job = _job(c, checkpoint, hosts)
        fleet = Fleet(c, job)
        readdressed_at: int | None = None  # the version when an address last changed
        for _ in range(30):
            if _step(c, job, fleet, rng, now) and readdressed_at is None:
                readdressed_at = job.topology.version
            for h in set(fleet.cursors) - set(job.topology.racks):  # spliced out: its
                del fleet.cursors[h]  # watch ended with its process
            if rng.random() < 0.3:
                continue  # no pass: the next one finds cursors several versions behind
            fleet.pass_()
            # an address alone is not news (its peers hear it with the next version)
            if readdressed_at is None or job.topology.version > readdressed_at:
                fleet.assert_current()
                readdressed_at = None
        return c.keys_computed, c.keys_skipped
    finally:
        c.store.close()


def _step(
    c: Coordinator, job: JobState, fleet: Fleet, rng: random.Random, now: list[float]
) -> None:
    """One random change to the fleet (see _random_walk)."""
    gone = {h for h, hp in job.hosts.items() if hp.state in ("DEAD", "QUARANTINED")}
    alive = sorted(h for h in job.topology.racks if h not in gone)
    op = rng.choice(["die", "die", "rejoin", "readdress", "flap", "quarantine"])
    if op == "die" and len(alive) > 20:
        victim = rng.choice(alive)
        now[0] += 6.5
        for h in alive:
            if h != victim:
                c.report_progress(job.job_id, h, ProgressReport())
        c.tick()
    elif op == "rejoin" and any(job.hosts[h].state == "DEAD" for h in gone):
        back = rng.choice(sorted(h for h in gone if job.hosts[h].state == "DEAD"))
        port = rng.choice([2, 3])  # the same address as before, or a new one
        c.register(job.job_id, back, job.targets[back], b"", 1 << 40, f"10.0.1.{back[1:]}:{port}")
        fleet.cursors[back] = WatchCursor(back)
    elif op in ("readdress", "flap") and alive:
        h = rng.choice(alive)
        was = job.hosts[h].address
        moved = f"10.7.7.{rng.randrange(99)}:9"
        c.report_progress(job.job_id, h, ProgressReport(data_address=moved))
        if op == "flap":  # a pass now computes keys naming the moved address; then back
            fleet.pass_()
            c.report_progress(job.job_id, h, ProgressReport(data_address=was))
        return True
    elif op == "quarantine" and len(alive) > 20:
        chain = job.topology.stripes[0]
        victim = next((h for h in alive if any(k in alive for k in chain.children(h))), None)
        if victim is not None:
            kid = next(k for k in chain.children(victim) if k in alive)
            other = next(h for h in alive if h not in (victim, kid))
            c.report_suspect(job.job_id, kid, victim, "BAD_DATA", 0)
            c.report_suspect(job.job_id, other, victim, "BAD_DATA", 1)
    return False


@pytest.mark.parametrize(("seed", "dcs"), [(1, False), (2, True), (3, False), (4, True)])
def test_a_random_walk_of_changes_keeps_every_host_current(
    tmp_path: Path, checkpoint, seed: int, dcs: bool
) -> None:
    computed, skipped = _random_walk(tmp_path, checkpoint, seed, dcs)
    assert computed > 0 and skipped > 0  # both ways taken (40 hosts: a splice moves many)


def test_a_death_in_a_large_fleet_computes_only_the_keys_it_moved(
    tmp_path: Path, checkpoint
) -> None:
    """400 hosts, 4 stripes: one death moves its neighbourhood in each stripe; the pass
    computes those hosts' keys and skips the rest, and every host still holds what it
    would be assigned now."""
    now = [1000.0]
    hosts = {f"h{i:03d}": f"r{i % 20}" for i in range(400)}
    c = Coordinator(
        CoordinatorConfig(
            db=str(tmp_path / "big.sqlite"),
            trusted_keys=TrustedKeys.load(checkpoint["trusted"]),
            dead_after_s=6.0,
        ),
        clock=lambda: now[0],
    )
    try:
        for h, r in hosts.items():
            c.enroll(h, r, {"pool": "x"})
            c.heartbeat(h, r, f"10.0.{h[1]}.{h[2:]}:1", [])
        job = _job(c, checkpoint, hosts)
        fleet = Fleet(c, job)
        chain = job.topology.stripes[0]
        victim = next(h for h in chain.order if chain.children(h) and chain.parent.get(h))
        now[0] += 6.5
        for h in hosts:
            if h != victim:
                c.report_progress(job.job_id, h, ProgressReport())
        c.tick()
        assert job.hosts[victim].state == "DEAD"
        del fleet.cursors[victim]
        before = c.keys_computed, c.keys_skipped
        pushed = fleet.pass_()
        computed, skipped = c.keys_computed - before[0], c.keys_skipped - before[1]
        assert computed + skipped == len(hosts) - 1
        assert pushed and computed < 60 and skipped > 300
        fleet.assert_current()
    finally:
        c.store.close()
