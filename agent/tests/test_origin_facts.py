"""Origin bytes are what the origin served, and the origin cap holds in every window.

Real processes (a coordinator, agents) against a real HTTP origin on loopback that keeps its
own log (counting_origin.py): the checks read the origin's count and its one-second windows,
never the agents' own figures.
"""

from __future__ import annotations

import json
import signal
import socket
from pathlib import Path
from typing import Any

import pytest
from agent_harness import Cluster, assert_placed, job_spec
from counting_origin import CountingOrigin
from relgate_trust.manifest import build_manifest, sign_manifest, write_envelope

from relgate_agent.cli import EXIT_REJECTED, main

HOSTS = [("h00", "r0"), ("h01", "r1"), ("h02", "r0")]
MiB = 1 << 20
RANGE = 1 * MiB  # --origin-range-mib 1: the most one range may be
AGENT_ARGS = ["--origin-range-mib", "1"]


def _run(cluster: Cluster, job_id: str, timeout: float = 90) -> dict[str, Any]:
    return cluster.wait_for(
        lambda: (s := cluster.status(job_id))["state"] == "DONE" and s, timeout, f"{job_id} DONE"
    )


@pytest.fixture
def cluster(tmp_path: Path, checkpoint):
    """A coordinator and the agents (a range at most 1 MiB), stopped after the test."""
    c = Cluster(tmp_path / "c", checkpoint["trusted"], ["--report-interval", "0.5"])
    with socket.socket() as s:  # a fixed port: a restarted coordinator is found again
        s.bind(("127.0.0.1", 0))
        c.listen = f"127.0.0.1:{s.getsockname()[1]}"  # type: ignore[attr-defined]
    try:
        c.start_coordinator(c.listen)  # type: ignore[attr-defined]
        for h, r in HOSTS:
            c.start_agent(h, r, wait=False, extra_args=AGENT_ARGS)
        c.wait_started()
        yield c
    finally:
        c.stop_all()


def _create(cluster: Cluster, *specs: dict[str, Any]) -> list[str]:
    c = cluster.client()
    try:
        return [c.create_job(**spec).job_id for spec in specs]
    finally:
        c.close()


@pytest.fixture
def origin(checkpoint):
    o = CountingOrigin(Path(checkpoint["origin"]))
    yield o
    o.close()


def test_origin_bytes_equal_what_the_origin_served_across_agent_and_coordinator_restarts(
    cluster: Cluster, checkpoint, origin: CountingOrigin
) -> None:
    size = checkpoint["manifest"].total_size
    (job,) = _create(
        cluster, job_spec(checkpoint, origin_uri=origin.url, origin_cap_bytes_per_s=6 * MiB)
    )
    # restart a stripe root (an orderly stop) once the origin served a third; which host
    # roots stripes depends on who registered first, so it is the one GetJob shows reading
    cluster.wait_for(lambda: origin.served() > size // 3, 60, "a third served")
    root, rack = cluster.wait_for(lambda: _a_root(cluster, job), 10, "a root reported bytes")
    cluster.kill(root, signal.SIGTERM)
    cluster.start_agent(root, rack, extra_args=AGENT_ARGS)
    # and the coordinator, killed once two thirds were served: a new one on the same store
    # restores the counters of hosts that stopped reporting, the others report theirs
    cluster.wait_for(lambda: origin.served() > 2 * size // 3, 60, "two thirds served")
    cluster.kill("coordinator", signal.SIGKILL)
    cluster.start_coordinator(cluster.listen)  # type: ignore[attr-defined]
    status = _run(cluster, job)
    for h, _ in HOSTS:
        assert_placed(cluster, checkpoint, h)
    # the origin's own count, to the byte: the restarted agent went on from its journal
    assert status["origin_bytes"] == origin.served()
    assert status["origin_bytes"] >= size
    restarted = next(h for h in status["hosts"] if h["host_id"] == root)
    assert restarted["origin_bytes"] > 0, status["hosts"]


def _a_root(cluster: Cluster, job_id: str) -> tuple[str, str] | None:
    """A host of HOSTS that GetJob shows with origin bytes (it roots a stripe)."""
    reading = {h["host_id"] for h in cluster.status(job_id)["hosts"] if h["origin_bytes"] > 0}
    return next(((h, r) for h, r in HOSTS if h in reading), None)


def test_the_origin_cap_holds_in_every_window_across_two_jobs(
    tmp_path: Path,
    cluster: Cluster,
    checkpoint,
    keypair,
    origin: CountingOrigin,
    capsys: pytest.CaptureFixture[str],
) -> None:
    """Two jobs reading one origin at once (two versions of the checkpoint), each with the
    cap: one budget, so no one-second window of the origin's log is over the cap (plus one
    range); each fault-free job reads the origin at most 1.01 x its size."""
    cap = 6 * MiB
    key = keypair[0]
    src = Path(checkpoint["origin"])
    m2 = build_manifest(src, "claude-y", "2026-10-13.1", chunk_size=MiB, block_size=64 << 10)
    env2 = tmp_path / "origin" / "manifest-y.dsse.json"
    write_envelope(sign_manifest(m2, key), env2)
    size = checkpoint["manifest"].total_size
    first, second = _create(
        cluster,
        job_spec(checkpoint, origin_uri=origin.url, origin_cap_bytes_per_s=cap, stripes=2),
        job_spec(
            checkpoint,
            model="claude-y",
            version="2026-10-13.1",
            manifest_uri=str(env2),
            origin_uri=origin.url,
            origin_cap_bytes_per_s=cap,
            stripes=2,
        ),
    )
    done = [_run(cluster, first), _run(cluster, second)]
    assert origin.worst_window(1.0) <= cap + RANGE, (origin.worst_window(1.0), cap)
    assert sum(s["origin_bytes"] for s in done) == origin.served()
    for s in done:
        assert s["origin_bytes"] <= 1.01 * size, (s["origin_bytes"], size)
    # the operator's end of a job, through the CLI: nothing to evict from a finished job
    # (exit 3, the check and the job named); a host with no hold: nothing cleared
    base = ["--json", "--coordinator", cluster.coordinator, "--pki", str(cluster.pki)]
    capsys.readouterr()
    rc = main(["job", "evict", first, "h00", "--reason", "rma", *base])
    assert rc == EXIT_REJECTED
    refusal = json.loads(capsys.readouterr().out)
    assert refusal["check"] == "job-not-found" and first in refusal["message"]
    assert main(["hosts", "clear", "h00", "--note", "scrubbed", *base]) == 0
    assert json.loads(capsys.readouterr().out) == {"hostId": "h00", "cleared": False, "was": ""}


def test_a_sigkilled_agent_loses_no_counted_byte(
    tmp_path: Path, checkpoint, origin: CountingOrigin
) -> None:
    """A stripe root SIGKILLed mid-job (the journal every 2 s, the default): GetJob's origin
    bytes equal what the origin served, short of at most the ranges it had in flight (one
    per stripe it roots: ``--origin-parallel 1``), and every byte sent is counted received
    but the blocks in flight to it (before the byte log: 2.4-8.1 MB short of the origin's
    count, and the peers' bytes received ~4 MB over the bytes sent)."""
    args = [*AGENT_ARGS, "--origin-parallel", "1"]
    c = Cluster(tmp_path / "k", checkpoint["trusted"], ["--report-interval", "0.5"])
    try:
        c.start_coordinator()
        for h, r in HOSTS:
            c.start_agent(h, r, wait=False, extra_args=args, journal_interval=2.0)
        c.wait_started()
        size = checkpoint["manifest"].total_size
        spec = job_spec(checkpoint, origin_uri=origin.url, origin_cap_bytes_per_s=4 * MiB)
        (job,) = _create(c, {**spec, "stripes": 2})
        c.wait_for(lambda: origin.served() > size // 3, 60, "a third served")
        c.kill("h00", signal.SIGKILL)  # the root of stripe 0 (rack r0's leader)
        c.start_agent("h00", "r0", extra_args=args, journal_interval=2.0)
        status = _run(c, job)
        for h, _ in HOSTS:
            assert_placed(c, checkpoint, h)
    finally:
        c.stop_all()
    served, reported = origin.served(), status["origin_bytes"]
    assert 0 <= served - reported <= 2 * RANGE, (served, reported)
    # bytes moved: what peers sent (blocks, and the manifest envelopes they served) less
    # what was in flight to the killed host (16 credits of 64 KiB blocks per stream)
    rx = sum(h["rx_bytes"] for h in status["hosts"])
    tx = sum(h["tx_bytes"] for h in status["hosts"])
    assert status["bytes_moved"] == rx
    envelopes = 2 * len(HOSTS) * checkpoint["envelope"].stat().st_size
    assert 0 <= tx - rx <= 2 * 16 * (64 << 10) + envelopes, (tx, rx)
