"""Agents on sharded coordinators (``agent serve --coordinator a,b --coordinator-sharded``):
each agent watches both replicas, runs the jobs each one leads, reports each job to its
leader, and when a replica is SIGKILLed mid-job its job moves to the survivor and still
ends DONE byte-exact on every host (agent/replicas.py)."""

from __future__ import annotations

import signal
import sqlite3
from pathlib import Path
from typing import Any

from agent_harness import Cluster, assert_placed, job_spec
from relgate_trust.manifest import build_manifest, sign_manifest, write_envelope

from relgate_agent.client import CoordinatorClient

HOSTS = {"h1": "r1", "h2": "r1", "h3": "r2"}
WAIT_S = 120
KiB, MiB = 1024, 1024 * 1024


def _replica(cluster: Cluster, rid: str) -> str:
    return cluster.start_coordinator(
        name=f"coordinator-{rid}",
        extra=["--shard-by-job", "--lease-ttl", "3", "--replica-id", rid],
    )


def _live(cluster: Cluster) -> int:
    con = sqlite3.connect(cluster.base / "coordinator.sqlite")
    try:
        return con.execute(
            "SELECT COUNT(*) FROM dist_replicas WHERE expires_at_ms >= "
            "CAST(strftime('%s','now') AS INTEGER) * 1000"
        ).fetchone()[0]
    finally:
        con.close()


def _another_version(tmp_path: Path, keypair: Any, checkpoint: dict[str, Any]) -> dict[str, Any]:
    """The same bytes published as a second version (its own manifest, signed)."""
    key, _, _ = keypair
    m = build_manifest(
        checkpoint["origin"], "claude-x", "2026-10-12.4", chunk_size=1 * MiB, block_size=64 * KiB
    )
    env = tmp_path / "origin" / "manifest-4.dsse.json"
    write_envelope(sign_manifest(m, key), env)
    return {**checkpoint, "manifest": m, "envelope": env}


def _leaders(address: str, cluster: Cluster) -> dict[str, str]:
    c = CoordinatorClient(address, cluster.tls())
    try:
        return {j.job_id: j.leader_replica for j in c.list_jobs()}
    finally:
        c.close()


def test_agents_run_the_jobs_of_every_replica_and_follow_a_moved_job(
    cluster: Cluster, checkpoint: dict[str, Any], keypair: Any, tmp_path: Path
) -> None:
    cluster.enrolled.update({h: (r, "cluster=inf-a") for h, r in HOSTS.items()})
    addresses = {rid: _replica(cluster, rid) for rid in ("a", "b")}
    cluster.wait_for(lambda: _live(cluster) == 2, 30, "2 live replicas")
    both = ",".join(addresses.values())
    cluster.coordinator = both
    for h, r in HOSTS.items():
        cluster.start_agent(h, r, extra_args=["--coordinator-sharded"])
    second = _another_version(tmp_path, keypair, checkpoint)
    versions = {"v3": checkpoint, "v4": second}
    c = CoordinatorClient(both, cluster.tls())
    try:
        for name, ck in versions.items():
            # the origin at 1 MiB/s: 24 s of bytes, time to kill a leader mid-job
            spec = job_spec(ck, job_id=f"sharded-{name}", origin_cap_bytes_per_s=1 << 20)
            spec["version"] = ck["manifest"].version
            c.create_job(**spec)
    finally:
        c.close()

    def spread() -> dict[str, str] | None:
        led = _leaders(addresses["a"], cluster)
        return led if sorted(led.values()) == ["a", "b"] else None

    leaders = cluster.wait_for(spread, 60, "one job led by each replica")
    # both jobs' bytes flow on every host while each replica leads one: the agents run
    # the jobs of both watches (an agent watching one replica runs only its job)
    cluster.wait_for(
        lambda: all(
            cluster.journaled(h, ck["manifest"]) > 0 for h in HOSTS for ck in versions.values()
        ),
        WAIT_S,
        "both jobs' bytes flowing on every host",
    )
    assert sorted(_leaders(addresses["a"], cluster).values()) == ["a", "b"]
    victim = leaders["sharded-v3"]
    cluster.kill(f"coordinator-{victim}", signal.SIGKILL)
    survivor = next(r for r in addresses if r != victim)
    cluster.wait_for(
        lambda: set(_leaders(addresses[survivor], cluster).values()) == {survivor},
        60,
        f"both jobs led by {survivor}",
    )
    c = CoordinatorClient(addresses[survivor], cluster.tls())
    try:
        cluster.wait_for(
            lambda: all(c.get_job(j, timeout=10).state == "DONE" for j in leaders),
            WAIT_S,
            "both jobs DONE",
            interval=0.5,
        )
    finally:
        c.close()
    for h in HOSTS:
        for ck in versions.values():
            assert_placed(cluster, ck, h)
        assert cluster.procs[h].poll() is None  # no agent restarted
