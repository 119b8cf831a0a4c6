"""The coordinator store on PostgreSQL: same SQL as SQLite (server: ``pg_dsn`` in conftest)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from agent_harness import Cluster, assert_placed
from sqlalchemy import text

from relgate_agent.contracts import RemovedHost
from relgate_agent.coordinator.ledger import HostBytes, Ledger
from relgate_agent.coordinator.store import (
    JobRow,
    JobStore,
    RateReference,
    SlowRecord,
    StaleTopology,
)
from relgate_agent.coordinator.topology import build_topology, splice

pytestmark = pytest.mark.postgres


def test_store_on_postgres(pg_dsn: str) -> None:
    store = JobStore(pg_dsn)
    with store.tx() as c:
        from sqlalchemy import text

        c.execute(text("DELETE FROM dist_jobs WHERE job_id = 'dj_pg'"))
    topo = build_topology({"a": "r0", "b": "r0", "c": "r1"}, 2)
    targets = dict(topo.racks)
    row = JobRow(
        "dj_pg", {"model": "m"}, "DISTRIBUTING", "sha256:" + "0" * 64, targets, topo, [], False, 0
    )
    assert store.create_job(row) and not store.create_job(row)
    t2 = splice(topo, "a")
    store.save_topology("dj_pg", 1, t2, targets)
    with pytest.raises(StaleTopology):
        store.save_topology("dj_pg", 1, splice(topo, "b"), targets)
    (loaded,) = [r for r in store.load_jobs() if r.job_id == "dj_pg"]
    assert loaded.topology.version == 2
    store.update_job("dj_pg", state="DONE", ready_hosts=["b", "c"], completion_emitted=True)
    assert store.job_state("dj_pg") == "DONE"
    store.upsert_host("h1", "r0", {"cluster": "a"}, "127.0.0.1:1", ["m/v1"])
    store.upsert_host("h1", "r0", {"cluster": "a"}, "127.0.0.1:2", ["m/v1", "m/v2"])
    assert store.hosts_holding("m", "v2", "sha256:a") == set()  # a claim alone never counts
    store.mark_host_version("h1", "m", "v2", "sha256:a")  # it accepted a verified READY
    assert store.hosts_holding("m", "v2", "sha256:a") == {"h1"}
    assert store.hosts_holding("m", "v2", "sha256:b") == set()  # another manifest of v2
    store.mark_host_version("h1", "m", "v2", "sha256:b")  # placed again under another digest
    assert store.hosts_holding("m", "v2", "sha256:a") == set()
    assert store.hosts_holding("m", "v2", "sha256:b") == {"h1"}
    store.forget_host_version("h1", "m", "v2")
    assert store.hosts_holding("m", "v2", "sha256:b") == set()
    # placement attestations per (host, digest)
    store.put_attestation("h1", "sha256:a", '{"x": 1}')
    store.put_attestation("h1", "sha256:a", '{"x": 2}')
    store.put_attestation("h2", "sha256:a", '{"x": 3}')
    assert store.attestations("sha256:a", ["h1"]) == {"h1": '{"x": 2}'}
    assert store.attestations("sha256:b", ["h1", "h2"]) == {}
    # slowness evidence (a new leader resumes it): upsert, read back, drop
    slow = SlowRecord(1_700_000_000_123, False, frozenset({"a", "b"}))
    store.put_slowness("dj_pg", "c", slow)
    store.put_slowness("dj_pg", "c", SlowRecord(slow.slow_since_ms, True, slow.slow_with))
    assert store.slowness("dj_pg") == {"c": SlowRecord(slow.slow_since_ms, True, slow.slow_with)}
    store.drop_slowness("dj_pg", "c")
    assert store.slowness("dj_pg") == {}
    store.put_rate_reference("dj_pg", RateReference(1, 2, 3))
    store.put_rate_reference("dj_pg", RateReference(4, 5, 6))
    assert store.rate_reference("dj_pg") == RateReference(4, 5, 6)
    lease = f"test-{os.getpid()}"
    assert store.acquire_lease("a", 60, name=lease) == 1
    assert store.acquire_lease("b", 60, name=lease) is None
    store.release_lease("a", name=lease)
    assert store.acquire_lease("b", 60, name=lease) == 2
    store.close()


def test_ledger_on_postgres(pg_dsn: str) -> None:
    """The ledger (second migration step): byte counters, removed targets, host holds."""
    store = JobStore(pg_dsn)
    ledger = Ledger(store)
    ledger.put_bytes("dj_pg", {"c": HostBytes(1, 2, 3)})
    ledger.put_bytes("dj_pg", {"c": HostBytes(4, 1, 6)})  # a late, lower write: kept the max
    assert ledger.bytes("dj_pg") == {"c": HostBytes(4, 2, 6)}
    gone = RemovedHost("c", "evicted by operator:ops: rma", 1_790_000_000)
    ledger.remove("dj_pg", gone)
    ledger.remove("dj_pg", RemovedHost("c", "again", 1_790_000_009))  # the first one stays
    assert ledger.removed("dj_pg") == {"c": gone}
    ledger.clear_hold("h-pg")
    ledger.hold("h-pg", "QUARANTINED", "BAD_DATA from a, b", "dj_pg")
    ledger.hold("h-pg", "HANDSHAKES", "later", "dj_pg")
    assert ledger.holds()["h-pg"].reason == "BAD_DATA from a, b"
    was = ledger.clear_hold("h-pg")
    assert was is not None and was.kind == "QUARANTINED" and "h-pg" not in ledger.holds()
    with store.tx() as c:
        c.execute(text("DELETE FROM dist_host_bytes WHERE job_id = 'dj_pg'"))
        c.execute(text("DELETE FROM dist_removed WHERE job_id = 'dj_pg'"))
    store.close()


def test_distribution_with_postgres_coordinator(pg_dsn: str, tmp_path: Path, checkpoint) -> None:
    cluster = Cluster(tmp_path / "c", checkpoint["trusted"], ["--report-interval", "0.5"])
    hosts = [("p00", "r0"), ("p01", "r1"), ("p02", "r0")]
    try:
        cluster.start_coordinator_with_db(pg_dsn)
        for h, r in hosts:
            cluster.start_agent(h, r, labels="cluster=pg-test")
        job = cluster.create_full_job(
            3,
            f"dj_pg_{os.getpid()}_{tmp_path.name[-6:]}",
            model="claude-x",
            version="2026-10-12.3",
            manifest_uri=str(checkpoint["envelope"]),
            origin_uri=str(checkpoint["origin"]),
            target_selector="cluster=pg-test",
            ready_threshold_ppm=1_000_000,
            stripes=2,
        )
        cluster.wait_for(lambda: cluster.status(job)["hosts_ready"] == 3, 120, "READY")
    finally:
        cluster.stop_all()
    for h, _ in hosts:
        assert_placed(cluster, checkpoint, h)
