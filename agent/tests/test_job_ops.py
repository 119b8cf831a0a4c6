"""Operator commands over real processes (a coordinator and four agents on loopback, mutual
TLS): ``job list`` shows each job with its state and hosts READY/targets and filters by
state; ``job get --topology`` shows each stripe's chain as the coordinator holds it (its
store's topology of the same version), live and after the job is DONE; a host's
certificate is refused both, with the check named (exit 3)."""

from __future__ import annotations

import json
import sqlite3
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_harness import Cluster, job_spec
from relgate_trust.manifest import build_manifest, sign_manifest, write_envelope

from relgate_agent.cli import EXIT_OK, EXIT_REJECTED, EXIT_USAGE, main
from relgate_agent.client import CoordinatorClient, sent_check
from relgate_agent.contracts import ORIGIN
from relgate_agent.coordinator.topology import Topology

HOSTS = [("h00", "r0"), ("h01", "r1"), ("h02", "r0"), ("h03", "r1")]
ACTIVE = ("PLANNING", "DISTRIBUTING", "COMPLETE")
MiB = 1 << 20
KiB = 1 << 10


def cli(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str]:
    capsys.readouterr()
    rc = main(list(argv))
    return rc, capsys.readouterr().out


def cli_json(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc, out = cli(capsys, *argv)
    return rc, json.loads(out)


def stored_topology(cluster: Cluster, job: str) -> Topology:
    """The job's topology as the coordinator persisted it (its latest version)."""
    con = sqlite3.connect(cluster.base / "coordinator.sqlite")
    try:
        (doc,) = con.execute("SELECT topology FROM dist_jobs WHERE job_id = ?", (job,)).fetchone()
    finally:
        con.close()
    return Topology.from_json(json.loads(doc))


def assert_chains(shown: dict[str, Any], topo: Topology, hosts: set[str]) -> None:
    """``job get --topology``'s stripes are ``topo``'s chains: per stripe its root, every
    host once in chain order, each with its upstream (ORIGIN for the root) and downstreams."""
    assert shown["topologyVersion"] == topo.version
    assert len(shown["stripes"]) == len(topo.stripes)
    for s, chain in zip(shown["stripes"], topo.stripes, strict=True):
        hops = s["hops"]
        assert s["root"] == chain.root() == hops[0]["hostId"]
        assert [h["hostId"] for h in hops] == chain.order and set(chain.order) == hosts
        for h in hops:
            assert h["upstream"] == (chain.parent[h["hostId"]] or ORIGIN)
            assert h["downstreams"] == chain.children(h["hostId"])
        assert [h["upstream"] for h in hops].count(ORIGIN) == 1


def live_topology_matches_store(
    capsys: pytest.CaptureFixture[str], cluster: Cluster, job: str, base: list[str]
) -> dict[str, Any]:
    """``job get --topology`` read when the store holds the same version (a splice between
    the two reads moves both: read again)."""

    def read() -> dict[str, Any] | None:
        rc, doc = cli_json(capsys, "job", "get", job, "--topology", *base)
        assert rc == EXIT_OK, doc
        topo = stored_topology(cluster, job)
        if doc["topology"]["topologyVersion"] != topo.version:
            return None
        assert_chains(doc["topology"], topo, set(topo.racks))
        return dict(doc)

    return dict(cluster.wait_for(read, 30, "a topology read at the stored version"))


def second_version(tmp_path: Path, keypair: Any, checkpoint: dict[str, Any]) -> Path:
    """The same files signed as another version (a second job over the same origin)."""
    m = build_manifest(
        checkpoint["origin"], "claude-x", "2026-10-12.4", chunk_size=1 * MiB, block_size=64 * KiB
    )
    env = tmp_path / "origin" / "manifest-v4.dsse.json"
    write_envelope(sign_manifest(m, keypair[0]), env)
    return env


def test_job_list_and_topology(
    tmp_path: Path, keypair: Any, checkpoint: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    cluster = Cluster(
        tmp_path / "c", checkpoint["trusted"], ["--report-interval", "0.5", "--dead-after", "3"]
    )
    started = int(time.time())
    try:
        cluster.start_coordinator()
        for h, r in HOSTS:
            cluster.start_agent(h, r, wait=False)
        cluster.wait_started()
        base = ["--json", "--coordinator", cluster.coordinator, "--pki", str(cluster.pki)]
        assert cli_json(capsys, "job", "list", *base) == (EXIT_OK, {"jobs": []})

        spec = job_spec(checkpoint, origin_cap_bytes_per_s=4 * MiB)
        a = cluster.create_full_job(len(HOSTS), "ops-a", **spec)
        rc, listed = cli_json(capsys, "job", "list", *base)
        assert rc == EXIT_OK
        (row,) = [j for j in listed["jobs"] if j["jobId"] == a]
        assert (row["model"], row["version"]) == ("claude-x", "2026-10-12.3")
        assert row["hostsTotal"] == len(HOSTS) and 0 <= row["hostsReady"] <= len(HOSTS)
        assert row["state"] in (*ACTIVE, "DONE")
        assert started <= row["createdAt"] <= time.time()

        # under way (or already done): the chains the coordinator holds, with progress
        doc = live_topology_matches_store(capsys, cluster, a, base)
        topo = doc["topology"]
        assert topo["jobId"] == a and topo["state"] == doc["state"]
        total = checkpoint["manifest"].total_size
        if topo["live"]:
            assert sum(s["stripeBytes"] for s in topo["stripes"]) == total
            for s in topo["stripes"]:
                for h in s["hops"]:
                    assert 0 <= h["bytesDone"] <= s["stripeBytes"]
                    assert h["rxBytesPerS"] >= -1

        st = cluster.wait_for(
            lambda: (s := cluster.status(a))["state"] == "DONE" and s, 120, "job a DONE"
        )
        assert st["hosts_ready"] == len(HOSTS)

        b = _second_job_cancelled(tmp_path, keypair, checkpoint, capsys, cluster)
        _listed_and_filtered(capsys, cluster, a, b)
        _finished_topology(capsys, cluster, a, total)
        _refusals(capsys, cluster, a)
    finally:
        cluster.stop_all()


def _second_job_cancelled(
    tmp_path: Path,
    keypair: Any,
    checkpoint: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
    cluster: Cluster,
) -> str:
    b = "ops-b"
    spec_b = job_spec(checkpoint, manifest_uri=str(second_version(tmp_path, keypair, checkpoint)))
    c = cluster.client()
    try:
        assert c.create_job(job_id=b, **{**spec_b, "version": "2026-10-12.4"}).job_id == b
    finally:
        c.close()
    base = ["--json", "--coordinator", cluster.coordinator, "--pki", str(cluster.pki)]
    rc, out = cli_json(capsys, "job", "cancel", b, *base)
    assert rc == EXIT_OK and out["state"] == "CANCELLED"
    return b


def _listed_and_filtered(
    capsys: pytest.CaptureFixture[str], cluster: Cluster, a: str, b: str
) -> None:
    base = ["--json", "--coordinator", cluster.coordinator, "--pki", str(cluster.pki)]
    rc, listed = cli_json(capsys, "job", "list", *base)
    assert rc == EXIT_OK
    assert [(j["jobId"], j["state"]) for j in listed["jobs"]] == [(a, "DONE"), (b, "CANCELLED")]
    assert (listed["jobs"][0]["hostsReady"], listed["jobs"][0]["hostsTotal"]) == (4, 4)
    for state, want in (("DONE", [a]), ("cancelled", [b]), ("DISTRIBUTING", [])):
        rc, only = cli_json(capsys, "job", "list", "--state", state, *base)
        assert rc == EXIT_OK and [j["jobId"] for j in only["jobs"]] == want, (state, only)
    rc, text = cli(capsys, "job", "list", *base[1:])  # the text table
    header, *rows = text.splitlines()
    assert header.split() == ["JOB", "MODEL", "VERSION", "STATE", "HOSTS", "CREATED", "LEADER"]
    assert rc == EXIT_OK
    assert rows[0].split()[:5] == [a, "claude-x", "2026-10-12.3", "DONE", "4/4"]
    assert rows[1].split()[3] == "CANCELLED"


def _finished_topology(
    capsys: pytest.CaptureFixture[str], cluster: Cluster, a: str, total: int
) -> None:
    """The last stored topology, every READY host holding each stripe whole."""
    base = ["--json", "--coordinator", cluster.coordinator, "--pki", str(cluster.pki)]
    rc, done = cli_json(capsys, "job", "get", a, "--topology", *base)
    assert rc == EXIT_OK and done["state"] == "DONE"
    stored = stored_topology(cluster, a)
    assert_chains(done["topology"], stored, {h for h, _ in HOSTS})
    assert done["topology"]["live"] is False
    assert sum(s["stripeBytes"] for s in done["topology"]["stripes"]) == total
    for s in done["topology"]["stripes"]:
        assert all(h["bytesDone"] == s["stripeBytes"] for h in s["hops"])
    rc, text = cli(capsys, "job", "get", a, "--topology", *base[1:])
    assert rc == EXIT_OK and f"topology: v{stored.version} (last stored)" in text
    for i, chain in enumerate(stored.stripes):
        assert f"stripe {i}: root {chain.root()}," in text


def _refusals(capsys: pytest.CaptureFixture[str], cluster: Cluster, job: str) -> None:
    """A host's certificate lists no jobs and reads no topology (exit 3, the check named);
    an unknown state or job is refused too."""
    h00 = cluster.tls("h00")
    as_host = [
        "--json",
        "--coordinator",
        cluster.coordinator,
        "--ca",
        str(h00.ca),
        "--cert",
        str(h00.cert),
        "--key",
        str(h00.key),
    ]
    rc, out = cli_json(capsys, "job", "list", *as_host)
    assert rc == EXIT_REJECTED
    assert out == {
        "error": "permission_denied",
        "message": "ListJobs refused: operator RPC, caller is host:h00@r0",
        "check": "operator-role",
    }
    c = CoordinatorClient(cluster.coordinator, h00)
    try:
        with pytest.raises(grpc.RpcError) as exc:
            c.job_topology(job)
    finally:
        c.close()
    assert exc.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert exc.value.details() == "GetJobTopology refused: operator RPC, caller is host:h00@r0"
    assert sent_check(exc.value) == "operator-role"

    c = cluster.client()
    try:
        with pytest.raises(grpc.RpcError) as exc:
            c.list_jobs("RUNNING")
        assert exc.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert sent_check(exc.value) == "job-state" and "'RUNNING'" in str(exc.value.details())
        with pytest.raises(grpc.RpcError) as exc:
            c.job_topology("no-such-job")
        assert exc.value.code() == grpc.StatusCode.NOT_FOUND
        assert exc.value.details() == "job no-such-job is unknown"
    finally:
        c.close()
    base = ["--json", "--coordinator", cluster.coordinator, "--pki", str(cluster.pki)]
    assert main(["job", "list", "--state", "RUNNING", *base]) == EXIT_USAGE
