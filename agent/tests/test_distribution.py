"""End-to-end distribution with real processes on loopback: coordinator + >= 8 agents, 2 racks."""

from __future__ import annotations

import contextlib
import json
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from agent_harness import HOSTS, Cluster, Webhook, assert_placed, job_spec, scrape

KiB = 1024
MiB = 1024 * KiB


@pytest.fixture
def webhook():
    w = Webhook()
    try:
        yield w
    finally:
        w.close()


def start_hosts(
    cluster: Cluster,
    hosts=HOSTS,
    env_for: dict[str, dict[str, str]] | None = None,
    args_for: dict[str, list[str]] | None = None,
) -> None:
    for h, r in hosts:
        cluster.start_agent(h, r, env=(env_for or {}).get(h), extra_args=(args_for or {}).get(h))
    cluster.wait_started()
    cluster.wait_registered(len(hosts))


def create_job(cluster: Cluster, checkpoint: dict[str, Any], **kw: Any) -> str:
    c = cluster.client()
    try:
        return c.create_job(**job_spec(checkpoint, **kw)).job_id
    finally:
        c.close()


def stats(cluster: Cluster, host: str, job: str) -> list[dict[str, Any]]:
    d = cluster.models_root(host) / ".agent-stats"
    return [json.loads(p.read_text()) for p in sorted(d.glob(f"{job}.*.json"))]


def test_fanout_all_hosts_byte_exact(cluster: Cluster, checkpoint, webhook) -> None:
    cluster.start_coordinator()
    # one host is serving traffic and caps its distribution rate; it still converges
    for h, r in HOSTS:
        cluster.start_agent(h, r, extra_args=["--max-rate", "40MiB"] if h == "h03" else None)
    cluster.wait_registered(len(HOSTS))
    job = create_job(cluster, checkpoint, webhook_url=webhook.url)
    st = cluster.wait_for(
        lambda: (s := cluster.status(job))["hosts_ready"] == 8 and s, 120, "all hosts READY"
    )
    for h, _ in HOSTS:
        assert_placed(cluster, checkpoint, h)
    size = checkpoint["manifest"].total_size
    # origin read ~once: roots read each block of their stripe once
    origin = sum(s["origin_bytes"] for h, _ in HOSTS for s in stats(cluster, h, job))
    assert origin <= 1.05 * size
    assert st["origin_bytes"] <= 1.05 * size
    cluster.wait_for(lambda: webhook.events, 30, "DistributionComplete webhook")
    ev = webhook.events[0]
    assert (
        ev["type"] == "DistributionComplete"
        and ev["job"] == job
        and ev["version"] == "2026-10-12.3"
    )
    assert sorted(ev["readyHosts"]) == sorted(h for h, _ in HOSTS)
    # a clean run: the data-plane refusal counter is an attack's, never a start-up race's
    refused = {
        h: line
        for h, _ in HOSTS
        for line in (cluster.base / "logs" / f"{h}.log").read_text().splitlines()
        if "data plane refused" in line
    }
    assert refused == {}
    assert {h["host_id"]: h["data_refusals"] for h in st["hosts"]} == dict.fromkeys(
        (h for h, _ in HOSTS), 0
    )


def journal_chunks(cluster: Cluster, host: str, checkpoint: dict[str, Any]) -> int:
    return cluster.journaled(host, checkpoint["manifest"])


def topology_for(hosts=HOSTS, stripes: int = 4):
    from relgate_agent.coordinator.topology import build_topology

    return build_topology(dict(hosts), stripes)


def test_killed_agent_resumes_from_journal(cluster: Cluster, checkpoint) -> None:
    cluster.start_coordinator()
    start_hosts(cluster)
    m = checkpoint["manifest"]
    # a 4 MiB/s origin cap stretches the job to ~6 s so the kill lands mid-transfer
    job = create_job(cluster, checkpoint, origin_cap_bytes_per_s=4 * MiB)
    victim = "h05"
    cluster.wait_for(
        lambda: journal_chunks(cluster, victim, checkpoint) >= 6, 60, "victim journaled 6 chunks"
    )
    cluster.kill(victim, signal.SIGKILL)
    journaled = journal_chunks(cluster, victim, checkpoint)
    assert 0 < journaled < m.num_chunks
    assert not (cluster.models_root(victim) / m.model / m.version).exists()
    cluster.start_agent(victim, "r1")
    cluster.wait_for(lambda: cluster.status(job)["hosts_ready"] == 8, 120, "all hosts READY")
    for h, _ in HOSTS:
        assert_placed(cluster, checkpoint, h)
    (second,) = [s for s in stats(cluster, victim, job) if s["ready"]]
    assert second["resumed_chunks"] >= journaled
    # resumed, never from zero: re-received at most the unjournaled chunks plus a few in flight
    received = second["rx_bytes"] + second["origin_bytes"]
    assert received <= (m.num_chunks - journaled + 8) * m.chunk_size
    assert received < m.total_size


def test_corruption_caught_by_crc_in_flight_and_sha_on_disk(cluster: Cluster, checkpoint) -> None:
    m = checkpoint["manifest"]
    topo = topology_for()
    # a mid-chain sender X with a downstream Y, whose own downstream Z must never see bad bytes
    s, chain = 1, topo.stripes[1]
    x = next(
        h
        for h in chain.order
        if chain.parent[h] is not None
        and chain.children(h)
        and all(chain.children(c) for c in chain.children(h))
    )
    y = chain.children(x)[0]
    z = chain.children(y)[0]
    block = m.stripe_blocks(s, 4)[20]
    disk_victim = next(h for h, _ in HOSTS if h not in (x, y, z))
    disk_chunk = 7
    cluster.start_coordinator()
    start_hosts(
        cluster,
        env_for={
            x: {"RELGATE_AGENT_FAULT": f"corrupt_send={block}:1"},
            disk_victim: {"RELGATE_AGENT_FAULT": f"corrupt_disk_chunk={disk_chunk}"},
        },
        args_for={h: ["--metrics-listen", "127.0.0.1:0"] for h in (y, z, disk_victim)},
    )
    job = create_job(cluster, checkpoint)
    st = cluster.wait_for(
        lambda: (r := cluster.status(job))["hosts_ready"] == 8 and r, 120, "all hosts READY"
    )
    for h, _ in HOSTS:
        assert_placed(cluster, checkpoint, h)
    (ys,) = stats(cluster, y, job)
    (zs,) = stats(cluster, z, job)
    assert ys["crc_errors"] >= 1, "receiver must catch the corrupted block by CRC32C"
    assert zs["crc_errors"] == 0, "the corrupted block must not be forwarded downstream"
    host_errors = {h["host_id"]: h["errors"] for h in st["hosts"]}
    assert any(e.startswith("CRC_MISMATCH") and f"from={x}" in e for e in host_errors[y])
    (ds,) = stats(cluster, disk_victim, job)
    assert ds["hash_mismatches"] >= 1 and ds["refetched_chunks"] >= 1
    assert any(e.startswith(f"HASH_MISMATCH chunk={disk_chunk}") for e in host_errors[disk_victim])

    # each agent's Prometheus figures say what its stats file says
    def figure(host: str, name: str, **labels: str) -> float:
        key = (name, tuple(sorted({"job": job, **labels}.items())))
        return scrape(cluster.agents[host]["metrics"])[key]

    assert figure(y, "relgate_agent_crc_errors_total") == ys["crc_errors"] >= 1
    assert figure(z, "relgate_agent_crc_errors_total") == 0
    assert figure(disk_victim, "relgate_agent_hash_mismatches_total") == ds["hash_mismatches"]
    for h, st_ in ((y, ys), (z, zs)):
        assert figure(h, "relgate_agent_job_ready") == 1
        assert figure(h, "relgate_agent_chunks_verified") == m.num_chunks
        assert figure(h, "relgate_agent_received_bytes_total", source="peer") == st_["rx_bytes"]
        assert (
            figure(h, "relgate_agent_received_bytes_total", source="origin") == st_["origin_bytes"]
        )


def test_dead_host_spliced_out_and_others_finish(cluster: Cluster, checkpoint) -> None:
    m = checkpoint["manifest"]
    topo = topology_for()
    # the host feeding the most downstreams: everyone behind it must still finish
    dead = max(
        (h for h, _ in HOSTS), key=lambda h: (sum(len(c.children(h)) for c in topo.stripes), h)
    )
    assert any(c.children(dead) and c.parent[dead] is not None for c in topo.stripes)
    cluster.start_coordinator(extra=["--metrics-listen", "127.0.0.1:0"])
    start_hosts(cluster)
    job = create_job(
        cluster, checkpoint, origin_cap_bytes_per_s=4 * MiB, ready_threshold_ppm=875_000
    )
    cluster.wait_for(
        lambda: journal_chunks(cluster, dead, checkpoint) >= 3, 60, "victim mid-transfer"
    )
    cluster.kill(dead, signal.SIGKILL)
    others = [h for h, _ in HOSTS if h != dead]
    st = cluster.wait_for(
        lambda: (r := cluster.status(job))["hosts_ready"] == 7 and r, 120, "all survivors READY"
    )
    for h in others:
        assert_placed(cluster, checkpoint, h)
    assert not (cluster.models_root(dead) / m.model / m.version).exists()
    states = {h["host_id"]: h["state"] for h in st["hosts"]}
    assert states[dead] == "DEAD"
    assert st["topology_version"] > 1
    assert dead in st["stragglers"]
    cluster.wait_for(lambda: cluster.status(job)["completion_emitted"], 30, "handoff at 7/8 ready")
    # the coordinator's Prometheus figures say the same as GetJob
    scraped = scrape(cluster.coordinator_info["metrics"])
    st = cluster.status(job)
    assert scraped[("relgate_coordinator_job_hosts_ready", (("job", job),))] == 7
    assert scraped[("relgate_coordinator_job_hosts", (("job", job), ("state", "DEAD")))] == 1
    assert scraped[("relgate_coordinator_splices_total", (("reason", "dead"),))] == 1
    assert scraped[("relgate_coordinator_leader", ())] == 1
    assert (
        scraped[("relgate_coordinator_job_topology_version", (("job", job),))]
        == (st["topology_version"])
    )
    origin = scraped[("relgate_coordinator_job_origin_bytes", (("job", job),))]
    assert origin == sum(h["origin_bytes"] for h in st["hosts"]) > 0
    received = scraped[("relgate_coordinator_job_received_bytes", (("job", job),))]
    assert received == sum(h["rx_bytes"] for h in st["hosts"]) > 0
    reports = scraped[
        ("relgate_coordinator_rpc_duration_seconds_count", (("method", "ReportStream"),))
    ]
    assert reports >= 7  # every host reported on its stream, each report timed
    assert scraped[("relgate_coordinator_rpc_duration_seconds_count", (("method", "Register"),))]
    # the loop's own lag is probed and every sweep tick timed while the job ran (seconds)
    assert scraped[("relgate_coordinator_loop_lag_seconds_count", ())] >= 10
    assert scraped[("relgate_coordinator_tick_duration_seconds_count", ())] >= 10
    # eight hosts: a tick's own work is far under 15 % of 0.5 s, so the sweeper keeps 0.5 s
    assert scraped[("relgate_coordinator_sweep_wait_seconds", ())] == 0.5
    assert (
        sum(
            scraped.get(("relgate_coordinator_gc_pause_seconds_count", (("generation", g),)), 0)
            for g in "012"
        )
        > 0
    )  # the job's reports made garbage: collections were timed


def test_coordinator_stopped_mid_transfer_chains_finish(cluster: Cluster, checkpoint) -> None:
    import socket

    m = checkpoint["manifest"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cluster.start_coordinator(f"127.0.0.1:{port}")
    start_hosts(cluster)
    job = create_job(cluster, checkpoint, origin_cap_bytes_per_s=4 * MiB)
    cluster.wait_for(
        lambda: journal_chunks(cluster, "h07", checkpoint) >= 2, 60, "transfer under way"
    )
    cluster.kill("coordinator", signal.SIGKILL)
    assert not all((cluster.models_root(h) / m.model / m.version).exists() for h, _ in HOSTS)

    # with no coordinator at all, the chains stream to completion and every host places its copy
    def placed(h: str) -> bool:  # renamed into place, and the staging leftovers removed
        root = cluster.models_root(h)
        return (root / m.model / m.version).is_dir() and not (
            root / ".staging" / m.model / m.version
        ).exists()

    cluster.wait_for(
        lambda: all(placed(h) for h, _ in HOSTS), 120, "all hosts placed without a coordinator"
    )
    for h, _ in HOSTS:
        assert_placed(cluster, checkpoint, h)
    # a restarted coordinator reloads the job from SQLite and rebuilds progress from reports
    cluster.start_coordinator(f"127.0.0.1:{port}")
    st = cluster.wait_for(
        lambda: (r := cluster.status(job))["hosts_ready"] == 8 and r, 60, "READY after restart"
    )
    assert st["manifest_digest"] == m.digest


def test_untrusted_or_tampered_manifest_refused_before_any_byte(
    tmp_path: Path, checkpoint, keypair
) -> None:
    import base64

    import grpc
    import rfc8785
    from relgate_trust.manifest import generate_private_key, keyid_for, pae, write_keypair

    from relgate_agent.client import CoordinatorRefusal

    _, _, trusted = keypair
    m = checkpoint["manifest"]
    # coordinator trusts the real key and a second one; agents trust only the real key
    other = generate_private_key()
    coord_trusted = tmp_path / "coord-trusted"
    coord_trusted.mkdir()
    (coord_trusted / "builder-v1.pem").write_bytes((trusted / "builder-v1.pem").read_bytes())
    write_keypair(other, tmp_path / "other.key", coord_trusted / "builder-v1-other.pem")
    c = Cluster(tmp_path / "c2", coord_trusted, ["--report-interval", "0.5"], agent_trusted=trusted)
    try:
        c.start_coordinator()
        start_hosts(c, HOSTS[:2])
        # tampered after signing: refused at CreateJob
        env = json.loads(checkpoint["envelope"].read_bytes())
        doc = json.loads(base64.b64decode(env["payload"]))
        doc["chunks"][0]["digest"] = "sha256:" + "1" * 64
        tampered = {**env, "payload": base64.standard_b64encode(rfc8785.dumps(doc)).decode()}
        (tmp_path / "tampered.json").write_text(json.dumps(tampered))
        with pytest.raises(CoordinatorRefusal) as exc:
            create_job(c, checkpoint, manifest_uri=str(tmp_path / "tampered.json"))
        assert exc.value.code == grpc.StatusCode.INVALID_ARGUMENT.name
        assert exc.value.check == "signature-valid"
        # unsigned: refused
        (tmp_path / "unsigned.json").write_text(json.dumps({**env, "signatures": []}))
        with pytest.raises(CoordinatorRefusal) as exc:
            create_job(c, checkpoint, manifest_uri=str(tmp_path / "unsigned.json"))
        assert exc.value.check == "signature-present"
        # signed by a key the coordinator trusts but the agents do not: agents refuse, place nothing
        payload = base64.b64decode(env["payload"])
        foreign = {
            **env,
            "signatures": [
                {
                    "keyid": keyid_for(other.public_key()),
                    "sig": base64.standard_b64encode(
                        other.sign(pae(env["payloadType"], payload))
                    ).decode(),
                }
            ],
        }
        (tmp_path / "foreign.json").write_text(json.dumps(foreign))
        job = create_job(c, checkpoint, manifest_uri=str(tmp_path / "foreign.json"))
        c.wait_for(
            lambda: all(
                any("MANIFEST_REJECTED" in e for e in h["errors"]) for h in c.status(job)["hosts"]
            ),
            60,
            "both agents to refuse the manifest",
        )
        # no host accepts it: the job fails at once (not DISTRIBUTING forever), naming
        # each host's check
        st = c.wait_for(lambda: (r := c.status(job))["state"] == "FAILED" and r, 30, "FAILED")
        assert "MANIFEST_REJECTED check=signature-trusted" in st["error"], st["error"]
        for h, _ in HOSTS[:2]:
            root = c.models_root(h)
            assert not (root / m.model).exists()
            assert not (root / ".staging" / m.model).exists()
        assert c.status(job)["bytes_moved"] == 0
    finally:
        c.stop_all()


def test_cancel_mid_transfer_discards_staging(cluster: Cluster, checkpoint) -> None:
    m = checkpoint["manifest"]
    hosts = HOSTS[:4]
    cluster.start_coordinator()
    start_hosts(cluster, hosts)
    job = create_job(cluster, checkpoint, origin_cap_bytes_per_s=2 * MiB)
    cluster.wait_for(
        lambda: journal_chunks(cluster, "h01", checkpoint) >= 2, 60, "transfer under way"
    )
    c = cluster.client()
    try:
        c.cancel_job(job)
    finally:
        c.close()
    staging = [cluster.models_root(h) / ".staging" / m.model / m.version for h, _ in hosts]
    cluster.wait_for(
        lambda: not any(p.exists() for p in staging), 30, "staging discarded on every host"
    )
    assert not any((cluster.models_root(h) / m.model / m.version).exists() for h, _ in hosts)
    assert cluster.status(job)["state"] == "CANCELLED"


def test_coordinator_failover_to_replica(cluster: Cluster, checkpoint) -> None:
    """Two replicas share the store; the lease holder freezes mid-job (SIGSTOP: no FIN, its
    connections hang; the chaos lab SIGKILLs one); the other takes over, splices no host
    that is streaming while the agents find it (their reply timeout + keepalive), splices
    a host that dies after the failover (DEAD, never PENDING), and sees every survivor
    READY."""
    import os

    import grpc

    from relgate_agent.client import CoordinatorClient

    ha = ["--ha", "--lease-ttl", "5"]
    a = cluster.start_coordinator(name="coordinator-a", extra=ha)
    b = cluster.start_coordinator(name="coordinator-b", extra=ha)
    cluster.coordinator = f"{a},{b}"
    start_hosts(cluster)
    job = create_job(
        cluster, checkpoint, origin_cap_bytes_per_s=3 * MiB, ready_threshold_ppm=875_000
    )
    follower = CoordinatorClient(b, cluster.tls())
    try:
        with pytest.raises(grpc.RpcError) as exc:  # only the lease holder answers
            follower.get_job(job)
        assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    finally:
        follower.close()
    before = cluster.status(job)["topology_version"]
    cluster.wait_for(
        lambda: journal_chunks(cluster, "h06", checkpoint) >= 2, 60, "transfer under way"
    )
    frozen = cluster.procs.pop("coordinator-a")
    os.kill(frozen.pid, signal.SIGSTOP)
    try:
        cluster.coordinator = b  # the operator asks the replica (the frozen one never answers)
        # the replica takes the lease after the TTL and reloads the job from the store
        cluster.wait_for(lambda: cluster.status(job)["job_id"] == job, 60, "replica serving")
        victim = "h07"
        cluster.kill(victim, signal.SIGKILL)
        st = cluster.wait_for(
            lambda: (
                (r := cluster.status(job))["hosts_ready"] == 7
                and {h["host_id"]: h["state"] for h in r["hosts"]}[victim] == "DEAD"
                and r
            ),
            120,
            "survivors READY, the victim DEAD",
        )
    finally:
        frozen.kill()
        frozen.wait(20)
    for h, _ in HOSTS:
        if h != victim:
            assert_placed(cluster, checkpoint, h)
    errors = {h["host_id"]: h["errors"] for h in st["hosts"]}
    # nobody streaming was spliced while the agents found the new leader
    assert not [h for h, e in errors.items() if h != victim and any("spliced out" in x for x in e)]
    assert st["topology_version"] > before


def _private_tmpfs(root: Path, size: str) -> list[str]:
    """An agent command prefix: ``root`` is a tmpfs of ``size`` in the agent's own mount
    namespace (it dies with the agent; the test reaches it through /proc/<pid>/root)."""
    root.mkdir(parents=True, exist_ok=True)
    return [
        "unshare",
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        f'mount -t tmpfs -o size={size} tmpfs "{root}" && exec "$0" "$@"',
    ]


def _fill(path: Path) -> int:
    """Write zeros to ``path`` until its file system is full; the bytes written."""
    n = 0
    with contextlib.suppress(OSError), path.open("wb", buffering=0) as f:
        while True:
            n += f.write(bytes(1 << 20))
    return n


def test_hosts_out_of_disk_are_removed_with_no_space_and_the_job_ends_done(
    cluster: Cluster, checkpoint
) -> None:
    """h02's models root is an 8 MiB tmpfs (the 24 MiB checkpoint cannot fit: refused
    before staging); h03's is 26 MiB and is filled from outside once it has staged a few
    chunks (ENOSPC while staging). Both report NO_SPACE, free their staging, stop (no
    retry loop, no origin re-read), are removed from the job with that reason while their
    downstreams are re-fed, and the job ends DONE with the other three READY."""
    import shutil

    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.skip("needs root and unshare(1) for a private tmpfs")
    m = checkpoint["manifest"]
    cluster.start_coordinator()
    small, filled = "h02", "h03"
    sizes = {small: "8m", filled: "26m"}
    for h, r in HOSTS[:5]:
        root = cluster.models_root(h)
        cluster.start_agent(h, r, prefix=_private_tmpfs(root, sizes[h]) if h in sizes else None)
    cluster.wait_registered(5)
    # paced so the fill lands while h03 is staging
    job = create_job(cluster, checkpoint, origin_cap_bytes_per_s=3 << 20)

    def staged(host: str) -> int:
        rows = {h["host_id"]: h for h in cluster.status(job)["hosts"]}
        return int(rows[host]["chunks_verified"])

    cluster.wait_for(lambda: staged(filled) >= 2, 60, f"{filled} staging a few chunks")
    pid = cluster.procs[filled].pid
    inside = Path(f"/proc/{pid}/root") / str(cluster.models_root(filled)).lstrip("/")
    assert _fill(inside / "filler") > 0
    st = cluster.wait_for(
        lambda: (r := cluster.status(job))["state"] == "DONE" and r, 120, "the job DONE"
    )
    rows = {h["host_id"]: h for h in st["hosts"]}
    assert st["hosts_ready"] == 3
    for h in (small, filled):
        assert rows[h]["state"] == "REMOVED", rows[h]
        errors = rows[h]["errors"]
        assert any(e.startswith("NO_SPACE") for e in errors), errors
        assert any(e.startswith("REMOVED: NO_SPACE") for e in errors), errors
        # one refusal, no retry loop (before: hundreds of INTERNAL tracebacks)
        assert sum(e.startswith("NO_SPACE") for e in errors) == 1, errors
        assert not any(e.startswith(("INTERNAL", "STORAGE")) for e in errors), errors
        assert rows[h]["origin_bytes"] <= m.total_size
    # h03 freed its staging (seen inside its own mount namespace) and placed nothing
    assert not (inside / ".staging" / m.model / m.version).exists()
    assert not (inside / m.model / m.version).exists()
    assert not (cluster.models_root(small) / m.model / m.version).exists()
    for h, _ in HOSTS[:5]:
        if h not in sizes:
            assert_placed(cluster, checkpoint, h)


def test_swarm_fallback_when_chain_is_broken_and_not_spliced(tmp_path: Path, checkpoint) -> None:
    """With splicing held back (repairs paused) and no bypass (``--no-bypass``: agents wait
    for the coordinator), hosts behind a dead host pull the chunks they miss from any peer
    that holds them and still finish."""
    topo = topology_for()
    # not a stripe root: with splicing held back nobody would take over its origin reads, and
    # chunks no peer ever received cannot come from a swarm
    roots = {ch.root() for ch in topo.stripes}
    dead = max(
        (h for h, _ in HOSTS if h not in roots),
        key=lambda h: (sum(len(ch.children(h)) for ch in topo.stripes), h),
    )
    c = Cluster(
        tmp_path / "swarm",
        checkpoint["trusted"],
        ["--dead-after", "600", "--no-splice-on-suspect", "--report-interval", "0.5"],
    )
    try:
        c.start_coordinator()
        start_hosts(c, args_for={h: ["--no-bypass"] for h, _ in HOSTS})
        job = create_job(c, checkpoint, origin_cap_bytes_per_s=4 * MiB, ready_threshold_ppm=875_000)
        c.wait_for(lambda: journal_chunks(c, dead, checkpoint) >= 3, 60, "victim mid-transfer")
        c.kill(dead, signal.SIGKILL)
        st = c.wait_for(
            lambda: (r := c.status(job))["hosts_ready"] == 7 and r, 120, "survivors READY"
        )
        for h, _ in HOSTS:
            if h != dead:
                assert_placed(c, checkpoint, h)
        assert {h["host_id"]: h["state"] for h in st["hosts"]}[dead] != "DEAD"  # never spliced
        swarm = sum(s["swarm_chunks"] for h, _ in HOSTS if h != dead for s in stats(c, h, job))
        assert swarm >= 1
    finally:
        c.stop_all()


def test_most_reports_go_quiet(cluster: Cluster, checkpoint) -> None:
    """Agents send most reports quiet (the coordinator writes no answer unless it has news):
    at most QUIET_REPORTS in a row, then one answered; the job still completes. Counted on
    the coordinator's own metrics (real processes)."""
    from relgate_agent.rpc import QUIET_REPORTS

    cluster.start_coordinator(extra=["--metrics-listen", "127.0.0.1:0"])
    hosts = HOSTS[:3]
    # capped (24 MiB at 3 MiB/s: ~8 s): each host sends ~16 reports before it is placed
    start_hosts(cluster, hosts, args_for={h: ["--max-rate", "3MiB"] for h, _ in hosts})
    job = create_job(cluster, checkpoint)
    cluster.wait_for(lambda: cluster.status(job)["hosts_ready"] == 3, 120, "all hosts READY")
    got = scrape(cluster.coordinator_info["metrics"])
    name = "relgate_coordinator_report_replies_total"
    quiet = got.get((name, (("answer", "quiet"),)), 0.0)
    answered = got.get((name, (("answer", "answered"),)), 0.0)
    # each host went quiet for whole runs, and asked for an answer at least after every
    # QUIET_REPORTS quiet ones (the last run of each host may be unfinished)
    assert quiet >= len(hosts) * QUIET_REPORTS
    assert quiet <= QUIET_REPORTS * (answered + len(hosts))
