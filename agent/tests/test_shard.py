"""Coordinators sharded by job (``--shard-by-job``): real replicas on loopback sharing one
SQLite store; each job has its own lease (``job:<id>``, its own epoch), the jobs spread
``ceil(jobs / live replicas)`` per replica, a replica's death (SIGKILL) or freeze (SIGSTOP
past its lease) moves only its jobs, a frozen one that resumes serves and writes none of
them, and a client that asks the wrong replica is sent to the job's leader.

No agent runs: the jobs' targets are enrolled hosts whose heartbeat the store holds (as an
agent's watch writes it), and ``--dead-after`` is longer than the test, so a job's topology
changes only if a replica that should not writes it."""

from __future__ import annotations

import os
import signal
import sqlite3
import time
from collections import Counter
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_harness import Cluster, job_spec, scrape

from relgate_agent.client import CoordinatorClient
from relgate_agent.coordinator.replicas import JobLease, Replicas
from relgate_agent.coordinator.shard import Shard, candidates, free, share
from relgate_agent.coordinator.store import Fenced, JobStore, LeaseFence
from relgate_agent.errors import LEADER_METADATA_KEY
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.rpc import leader_hint

HOSTS = {"h00": "r0", "h01": "r1", "h02": "r0"}
REPLICAS = ("a", "b", "c")
JOBS = [f"job{i}" for i in range(6)]
TTL = "3"


# ---------------------------------------------------------------- the share (no process)
def test_the_share_is_the_ceiling_of_jobs_over_live_replicas() -> None:
    assert [share(6, 3), share(7, 3), share(6, 2), share(1, 3), share(0, 3)] == [2, 3, 3, 1, 0]
    assert share(5, 0) == 5  # alone (no live row yet): all of them


def test_candidates_are_the_free_jobs_up_to_the_room_left() -> None:
    now = 10_000
    leases = {
        "j1": JobLease("j1", "b", 1, now + 1),  # held by b: not free
        "j2": JobLease("j2", "c", 4, now - 1),  # expired: free
        "j3": JobLease("j3", "a", 2, now + 1),  # held by a (mine)
        "j5": JobLease("j5", "b", 1, now),  # expires this very ms: still held
    }
    assert free("j0", leases, now) and free("j2", leases, now)
    assert not free("j1", leases, now) and not free("j5", leases, now)
    loose, room = candidates("a", ["j0", "j1", "j2", "j3", "j4", "j5"], ["j3"], leases, 3, now)
    assert sorted(loose) == ["j0", "j2", "j4"] and room == 1  # share 2, a holds 1
    # a held job no longer active frees no room, and room is never negative
    assert candidates("a", ["j0"], ["j3", "gone"], {}, 1, now) == (["j0"], 1)
    assert candidates("a", ["j0", "j1"], ["j0", "j1"], {}, 3, now)[1] == 0
    # each replica tries the free jobs in its own order (racing replicas mostly differ)
    orders = {r: candidates(r, JOBS, [], {}, 3, now)[0] for r in REPLICAS}
    assert (
        all(sorted(o) == JOBS for o in orders.values())
        and len(set(map(tuple, orders.values()))) > 1
    )


# ---------------------------------------------------------------- two shards, one store
def _job_row(store: JobStore, job_id: str, state: str = "DISTRIBUTING") -> None:
    """A job row as CreateJob writes it (only its id, state and age matter here)."""
    store._execute(
        "INSERT INTO dist_jobs (job_id, spec, state, manifest_digest, targets, topology_version, "
        "topology, ready_hosts, completion_emitted, created_at, updated_at) VALUES "
        "(:j, '{}', :s, 'd', '{}', 1, '{}', '[]', 0, 0, 0)",
        {"j": job_id, "s": state},
    )


def test_two_shards_split_the_jobs_and_redirect_to_each_other(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "s.sqlite"))
    try:
        a, b = Shard(store, "a", 30.0), Shard(store, "b", 30.0)
        a.address, b.address = "10.0.0.1:7470", "10.0.0.2:7470"
        for job in JOBS[:4]:
            _job_row(store, job)
        _job_row(store, "old", "DONE")  # finished: nobody leads it
        assert a.renew() == {} and b.renew() == {}
        assert [r.replica_id for r in a.replicas.live()] == ["a", "b"]
        took_a = a.take_share({})
        assert len(took_a) == 2 and set(took_a.values()) == {1}  # share: ceil(4 / 2)
        assert a.take_share(took_a) == {}  # at its share: no more
        took_b = b.take_share({})
        assert set(took_b) == set(JOBS[:4]) - set(took_a)
        assert a.renew() == took_a and b.renew() == took_b  # renewal keeps the epochs
        assert a.leaders() == {j: ("a", "10.0.0.1:7470", 1) for j in took_a} | {
            j: ("b", "10.0.0.2:7470", 1) for j in took_b
        }
        theirs = next(iter(took_b))
        refusal = a.redirect(theirs)
        assert refusal is not None and refusal.leader == "10.0.0.2:7470"
        assert refusal.check == "job-leader" and "replica b (epoch 1)" in str(refusal)
        back = b.redirect(next(iter(took_a)))  # and the other way round
        assert back is not None and back.leader == "10.0.0.1:7470"
        # a lease that expired 5 s ago: free (no leader shown, no redirect), and taken
        lapsed = next(iter(took_a))
        store._execute(
            "UPDATE dist_lease SET expires_at_ms = :e WHERE name = :n",
            {"e": int(time.time() * 1000) - 5000, "n": f"job:{lapsed}"},
        )
        assert lapsed not in a.leaders()
        assert b.redirect(lapsed) is not None and b.redirect(lapsed).leader == ""
        assert b.take_share(took_b) == {}  # b is at its share: it leaves it to a
        assert a.take_share({j: 1 for j in took_a if j != lapsed}) == {lapsed: 1}  # a's own
        assert a.redirect("old") is None and a.redirect("nosuch") is None
        mine = a.redirect(next(iter(took_a)))  # held here, not loaded yet
        assert mine is not None and mine.leader == ""
        _job_row(store, JOBS[4])  # share ceil(5 / 2) = 3: a (2) may take a new one
        assert a.redirect(JOBS[4]) is not None and a.redirect(JOBS[4]).leader == ""  # no leader
        assert a.claim_new(JOBS[4], 2) == 1
        _job_row(store, JOBS[5])  # share 3: a at 3 leaves it to b
        assert a.claim_new(JOBS[5], 3) is None and b.claim_new(JOBS[5], 2) == 1
        b.leave()  # b shuts down: its leases and membership expire now
        assert [r.replica_id for r in a.replicas.live()] == ["a"]
        held = a.renew()
        assert a.take_share(held) == {j: 2 for j in (*took_b, JOBS[5])}  # the next epoch
        assert a.leaders()[JOBS[5]] == ("a", "10.0.0.1:7470", 2)
        a.release(JOBS[5])
        assert JOBS[5] not in a.leaders() and JOBS[5] not in a.epochs
    finally:
        store.close()


# ---------------------------------------------------------------- the fence (real stores)
def _fence_refuses_a_deposed_writer(store: JobStore) -> None:
    replicas = Replicas(store)
    assert replicas.take("a", "j", 30.0) == 1
    store.fence = LeaseFence("a", {"j": 1})
    store._execute(  # the job row (as CreateJob writes it; only its state matters)
        "INSERT INTO dist_jobs (job_id, spec, state, manifest_digest, targets, topology_version, "
        "topology, ready_hosts, completion_emitted, created_at, updated_at) VALUES "
        "('j', '{}', 'DISTRIBUTING', 'd', '{}', 1, '{}', '[]', 0, 0, 0)",
        {},
    )
    store.update_job("j", state="COMPLETE")  # the holder at its epoch writes
    store._execute("UPDATE dist_lease SET expires_at_ms = 0 WHERE name = 'job:j'", {})
    assert replicas.take("b", "j", 30.0) == 2  # expired: b takes it, the epoch moves on
    with pytest.raises(Fenced) as refused:
        store.update_job("j", state="FAILED")
    assert refused.value.check == "job-lease-fence"
    assert store.job_state("j") == "COMPLETE"
    store.fence = LeaseFence("b", {"j": 1})  # the new holder, at a stale epoch: refused too
    with pytest.raises(Fenced):
        store.update_job("j", state="FAILED")
    store.fence = LeaseFence("b", {"j": 2})
    store.update_job("j", state="DONE")
    assert store.job_state("j") == "DONE"


def test_a_job_write_needs_the_jobs_lease_at_its_epoch_sqlite(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "s.sqlite"))
    try:
        _fence_refuses_a_deposed_writer(store)
    finally:
        store.close()


def test_a_job_write_needs_the_jobs_lease_at_its_epoch_postgres(pg_dsn: str) -> None:
    store = JobStore(pg_dsn)
    try:
        _fence_refuses_a_deposed_writer(store)
    finally:
        store.close()


# ---------------------------------------------------------------- replicas in processes
def _replica(cluster: Cluster, rid: str) -> str:
    return cluster.start_coordinator(
        name=f"coordinator-{rid}",
        extra=[
            "--shard-by-job",
            "--lease-ttl",
            TTL,
            "--replica-id",
            rid,
            "--dead-after",
            "600",
            "--metrics-listen",
            "127.0.0.1:0",
        ],
    )


def _db(cluster: Cluster) -> Path:
    return cluster.base / "coordinator.sqlite"


def _live_replicas(cluster: Cluster) -> set[str]:
    con = sqlite3.connect(_db(cluster))
    try:
        rows = con.execute(
            "SELECT replica_id FROM dist_replicas WHERE expires_at_ms >= "
            "CAST(strftime('%s','now') AS INTEGER) * 1000"
        ).fetchall()
    finally:
        con.close()
    return {r[0] for r in rows}


def _fleet(cluster: Cluster, checkpoint: dict[str, Any]) -> dict[str, str]:
    """Three replicas (id -> address), the hosts enrolled and live, six jobs created
    through replica a once all three are live."""
    addresses = {rid: _replica(cluster, rid) for rid in REPLICAS}
    cluster.wait_for(lambda: _live_replicas(cluster) == set(REPLICAS), 30, "3 live replicas")
    cluster.coordinator = addresses["a"]
    store = JobStore(str(_db(cluster)))
    try:
        for h, r in HOSTS.items():
            cluster.enroll_host(h, r)
            store.upsert_host(h, r, {"cluster": "inf-a"}, f"127.0.0.1:{7000 + int(h[1:])}", [])
    finally:
        store.close()
    c = CoordinatorClient(addresses["a"], cluster.tls())
    try:
        for job in JOBS:
            assert c.create_job(**job_spec(checkpoint, job_id=job)).hosts_total == len(HOSTS)
    finally:
        c.close()
    return addresses


def _leaders(cluster: Cluster, address: str) -> dict[str, tuple[str, int]]:
    """``job list`` through ``address``: job -> (leading replica, its lease epoch)."""
    c = CoordinatorClient(address, cluster.tls())
    try:
        return {j.job_id: (j.leader_replica, j.leader_epoch) for j in c.list_jobs()}
    finally:
        c.close()


def _spread(cluster: Cluster, address: str, want: dict[str, int]) -> dict[str, tuple[str, int]]:
    """Wait until every job has a leader and the replicas lead ``want`` jobs each."""

    def settled() -> dict[str, tuple[str, int]] | None:
        leaders = _leaders(cluster, address)
        counts = Counter(r for r, _ in leaders.values())
        ok = len(leaders) == len(JOBS) and all(r for r, _ in leaders.values())
        return leaders if ok and dict(counts) == want else None

    return cluster.wait_for(settled, 60, f"the jobs spread {want}")


def _jobs_led(cluster: Cluster, rid: str) -> float:
    return scrape(cluster.coordinator_infos[rid]["metrics"])[("relgate_coordinator_jobs_led", ())]


def _topology_versions(cluster: Cluster) -> dict[str, int]:
    con = sqlite3.connect(_db(cluster))
    try:
        return dict(con.execute("SELECT job_id, topology_version FROM dist_jobs").fetchall())
    finally:
        con.close()


@pytest.fixture
def fleet(cluster: Cluster, checkpoint: dict[str, Any]) -> dict[str, str]:
    cluster.enroll = False  # hosts are enrolled once the replicas are up (_fleet)
    infos: dict[str, dict[str, Any]] = {}
    original = cluster.start_coordinator

    def start(*args: Any, **kwargs: Any) -> str:
        address = original(*args, **kwargs)
        infos[kwargs["name"].removeprefix("coordinator-")] = cluster.coordinator_info
        return address

    cluster.start_coordinator = start  # type: ignore[method-assign]
    cluster.coordinator_infos = infos  # type: ignore[attr-defined]
    cluster.enrolled.update({h: (r, "cluster=inf-a") for h, r in HOSTS.items()})
    return _fleet(cluster, checkpoint)


def test_jobs_spread_a_wrong_replica_redirects_and_a_killed_replica_moves_only_its_jobs(
    cluster: Cluster, fleet: dict[str, str]
) -> None:
    # (a) six jobs over three live replicas: two each, every lease at its first epoch
    before = _spread(cluster, fleet["b"], {"a": 2, "b": 2, "c": 2})
    assert {e for _, e in before.values()} == {1}
    assert {rid: _jobs_led(cluster, rid) for rid in REPLICAS} == {"a": 2.0, "b": 2.0, "c": 2.0}
    versions = _topology_versions(cluster)

    # (d) a client asking a replica that does not lead the job is sent to its leader
    job = next(j for j, (r, _) in before.items() if r == "c")
    c = CoordinatorClient(fleet["a"], cluster.tls())
    try:
        with pytest.raises(grpc.RpcError) as refused:  # a itself: UNAVAILABLE naming c
            c.jobs.stubs[0].GetJob(pb.GetJobRequest(job_id=job), timeout=10)
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert leader_hint(refused.value) == fleet["c"]
        trailing = dict(refused.value.trailing_metadata())
        assert (
            trailing[LEADER_METADATA_KEY] == fleet["c"]
            and trailing["relgate-check"] == "job-leader"
        )
        assert c.get_job(job).job_id == job  # the client follows the hint
        assert c.jobs.addresses[c.jobs.routes[job]] == fleet["c"]
        shown = c.get_job(job)  # and goes straight there next time
        assert shown.state == "DISTRIBUTING"
        assert (shown.leader_replica, shown.leader_epoch) == before[job]  # job get names it
    finally:
        c.close()

    # (b) SIGKILL c: only its two jobs move, one to each survivor, at the next epoch
    cluster.kill("coordinator-c", signal.SIGKILL)
    after = _spread(cluster, fleet["a"], {"a": 3, "b": 3})
    for j, (was, epoch) in before.items():
        if was == "c":
            assert after[j][1] == epoch + 1, (j, before[j], after[j])
        else:
            assert after[j] == (was, epoch), (j, before[j], after[j])  # same leader, same epoch
    moved = [j for j, (r, _) in before.items() if r == "c"]
    assert Counter(after[j][0] for j in moved) == {"a": 1, "b": 1}
    assert _topology_versions(cluster) == versions  # nobody's topology was bumped
    # the moved jobs keep serving, through either survivor
    c = CoordinatorClient(f"{fleet['b']},{fleet['a']}", cluster.tls())
    try:
        for j in moved:
            shown = c.get_job(j)
            assert shown.state == "DISTRIBUTING"
            assert (shown.leader_replica, shown.leader_epoch) == after[j]
        assert c.cancel_job(moved[0]).state == "CANCELLED"  # a write, on the new leader
    finally:
        c.close()
    assert cluster.status(moved[0])["state"] == "CANCELLED"


def test_a_frozen_replica_loses_its_jobs_and_after_sigcont_serves_and_writes_none(
    cluster: Cluster, fleet: dict[str, str]
) -> None:
    # (c) SIGSTOP b past its lease: its jobs move; a and c keep theirs
    before = _spread(cluster, fleet["a"], {"a": 2, "b": 2, "c": 2})
    frozen = cluster.procs["coordinator-b"]
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        after = _spread(cluster, fleet["a"], {"a": 3, "c": 3})
    finally:
        os.kill(frozen.pid, signal.SIGCONT)
    moved = sorted(j for j, (r, _) in before.items() if r == "b")
    for j, (was, epoch) in before.items():
        assert after[j] == ((after[j][0], epoch + 1) if was == "b" else (was, epoch)), j

    # resumed, b answers NotLeader naming each moved job's new leader, and leads nothing
    def refuses(j: str) -> bool:
        c = CoordinatorClient(fleet["b"], cluster.tls())
        try:
            c.jobs.stubs[0].GetJob(pb.GetJobRequest(job_id=j), timeout=10)
        except grpc.RpcError as exc:
            return (
                exc.code() == grpc.StatusCode.UNAVAILABLE and leader_hint(exc) == fleet[after[j][0]]
            )
        finally:
            c.close()
        return False

    for j in moved:
        cluster.wait_for(lambda j=j: refuses(j), 30, f"b refusing {j} with its leader's address")
    assert _jobs_led(cluster, "b") == 0.0
    assert _leaders(cluster, fleet["b"]) == after  # it took nothing back
    # its old leases' epochs are fenced in the store: a write as b at them is refused
    store = JobStore(str(_db(cluster)))
    try:
        store.fence = LeaseFence("b", {j: before[j][1] for j in moved})
        with pytest.raises(Fenced):
            store.update_job(moved[0], state="FAILED")
        assert store.job_state(moved[0]) == "DISTRIBUTING"
    finally:
        store.close()
