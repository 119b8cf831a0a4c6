"""Placement you can trust, with real agent processes on loopback.

* bytes flipped in staging *after* their chunk verified and *before* the rename (a real
  hook point: the agent pauses, this test flips the byte from outside the process) are
  caught by the placement re-hash: never placed, re-fetched, placed byte-exact; flipped on
  every round -> the host gives up (HOST_FAILED), never places, and the job reports it;
* ``relgate-agent verify`` scrubs a placed copy: a flipped byte -> exit 3 naming file, chunk
  and expected digest, and the copy is un-placed; intact -> exit 0;
* a symlink planted in the models root or the staging tree is refused, never followed;
* origin bit rot (a byte flipped at the origin after signing) fails the job in bounded time
  with an error naming the chunk, the file and the origin object.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from agent_harness import HOSTS, Cluster, assert_placed, job_spec

from relgate_agent.staging.storage import Journal, JournalState

HOSTS4 = HOSTS[:4]


def start(cluster: Cluster, hosts=HOSTS4, env_for: dict[str, dict[str, str]] | None = None) -> None:
    cluster.start_coordinator()
    for h, r in hosts:
        cluster.start_agent(h, r, env=(env_for or {}).get(h), wait=False)
    cluster.wait_started()
    cluster.wait_registered(len(hosts))


def create_job(cluster: Cluster, checkpoint: dict[str, Any], **kw: Any) -> str:
    c = cluster.client()
    try:
        return c.create_job(**job_spec(checkpoint, **kw)).job_id
    finally:
        c.close()


def host_status(cluster: Cluster, job: str, host: str) -> dict[str, Any]:
    return next(h for h in cluster.status(job)["hosts"] if h["host_id"] == host)


def flip_byte(path: Path, offset: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        b = os.pread(fd, 1, offset)
        os.pwrite(fd, bytes([b[0] ^ 0x5A]), offset)
        os.fsync(fd)
    finally:
        os.close(fd)


def chunk_location(m: Any, chunk: int) -> tuple[str, int]:
    """(file, offset in file) of a byte in the middle of ``chunk``."""
    c = m.chunks[chunk]
    f, foff, _n, _ = m.segments(c.offset + c.size // 2, 1)[0]
    return f.path, foff


def wait_paused(cluster: Cluster, gate: Path, timeout: float = 90) -> Path:
    waiting = gate.with_name(gate.name + ".waiting")
    cluster.wait_for(lambda: waiting.exists() and not gate.exists(), timeout, f"{waiting}")
    return Path(waiting.read_text())


def release(cluster: Cluster, gate: Path) -> None:
    gate.touch()
    cluster.wait_for(lambda: not gate.exists(), 30, "agent to leave the pause")


def agent_cli(*args: str) -> tuple[int, dict[str, Any]]:
    out = subprocess.run(
        [sys.executable, "-m", "relgate_agent", "--json", *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    return out.returncode, json.loads(out.stdout.strip().splitlines()[-1])


def test_flip_in_staging_after_verification_is_caught_repaired_and_scrubbed(
    cluster: Cluster, checkpoint, tmp_path: Path
) -> None:
    m = checkpoint["manifest"]
    victim, chunk = "h01", 9
    gate = tmp_path / "gate"
    start(cluster, env_for={victim: {"RELGATE_AGENT_FAULT": f"pause_before_place={gate}:2"}})
    job = create_job(cluster, checkpoint)

    # pause 1: every chunk verified, nothing placed yet -> flip a byte of chunk 9 in staging
    tree = wait_paused(cluster, gate)
    rel, off = chunk_location(m, chunk)
    final = cluster.models_root(victim) / m.model / m.version
    assert not final.exists()
    flip_byte(tree / rel, off)
    release(cluster, gate)

    # pause 2 (after the re-fetch): the corrupt copy was never placed nor reported READY
    wait_paused(cluster, gate)
    assert not final.exists(), "a copy that failed re-verification must never be placed"
    hs = cluster.wait_for(
        lambda: (h := host_status(cluster, job, victim))["errors"] and h, 20, "errors reported"
    )
    assert hs["state"] != "READY"
    assert any(e.startswith(f"STAGED_MISMATCH chunk={chunk}") for e in hs["errors"]), hs
    release(cluster, gate)

    cluster.wait_for(
        lambda: cluster.status(job)["hosts_ready"] == len(HOSTS4), 90, "all hosts READY"
    )
    for h, _ in HOSTS4:
        assert_placed(cluster, checkpoint, h)
    st = json.loads(
        next((cluster.models_root(victim) / ".agent-stats").glob(f"{job}.*")).read_text()
    )
    assert st["staged_mismatches"] == 1 and st["placement_rounds"] == 1
    marker = cluster.models_root(victim) / ".placed" / m.model / f"{m.version}.digest"
    assert marker.read_text().strip() == m.digest

    # scrub: intact -> 0
    root = cluster.models_root(victim)
    rc, out = agent_cli(
        "verify",
        m.model,
        m.version,
        "--models-root",
        str(root),
        "--trusted-keys",
        str(checkpoint["trusted"]),
    )
    assert rc == 0 and out["intact"] is True and out["manifestDigest"] == m.digest
    # a flipped byte in the placed copy -> exit 3 naming file, chunk, expected digest; un-placed
    rel, off = chunk_location(m, 3)
    flip_byte(final / rel, off)
    rc, out = agent_cli(
        "verify",
        m.model,
        m.version,
        "--models-root",
        str(root),
        "--trusted-keys",
        str(checkpoint["trusted"]),
    )
    assert rc == 3, out
    assert out["check"] == "chunk-digest" and out["chunk"] == 3 and out["file"] == rel
    assert out["expected"] == m.chunks[3].digest and out["actual"] != out["expected"]
    assert out["badChunks"] == [3] and out["unplaced"] is True
    assert not final.exists() and not marker.exists()
    # and nothing placed is left to verify
    rc, out = agent_cli(
        "verify",
        m.model,
        m.version,
        "--models-root",
        str(root),
        "--trusted-keys",
        str(checkpoint["trusted"]),
    )
    assert rc == 3 and out["check"] == "not-placed"


def test_flip_on_every_placement_round_host_fails_and_never_places(
    cluster: Cluster, checkpoint, tmp_path: Path
) -> None:
    m = checkpoint["manifest"]
    victim = "h02"
    gate = tmp_path / "gate"
    start(cluster, env_for={victim: {"RELGATE_AGENT_FAULT": f"pause_before_place={gate}:3"}})
    job = create_job(cluster, checkpoint)
    final = cluster.models_root(victim) / m.model / m.version
    for rnd in range(3):  # placement_attempts = 3
        tree = wait_paused(cluster, gate)
        assert not final.exists()
        rel, off = chunk_location(m, 2 + rnd)
        flip_byte(tree / rel, off)
        release(cluster, gate)
    st = cluster.wait_for(
        lambda: (s := cluster.status(job))["state"] == "FAILED" and s, 60, "job FAILED"
    )
    assert not final.exists()
    hs = next(h for h in st["hosts"] if h["host_id"] == victim)
    assert hs["state"] == "FAILED"
    assert any(
        e.startswith("HOST_FAILED") and "re-verification failed 3 times" in e for e in hs["errors"]
    )
    assert "HOST_FAILED" in st["error"] and victim in st["error"]
    assert st["hosts_ready"] == len(HOSTS4) - 1  # the others placed and are READY
    for h, _ in HOSTS4:
        if h != victim:
            assert_placed(cluster, checkpoint, h)


def test_symlinks_planted_in_models_root_are_refused_not_followed(
    cluster: Cluster, checkpoint, tmp_path: Path
) -> None:
    m = checkpoint["manifest"]
    outside = tmp_path / "outside"
    outside.mkdir()
    secret = tmp_path / "secret.txt"
    secret.write_text("do not overwrite")
    # h01: the model directory is a symlink to a directory elsewhere
    r1 = cluster.models_root("h01")
    r1.mkdir(parents=True)
    (r1 / m.model).symlink_to(outside, target_is_directory=True)
    # h02: a staged file is a symlink to a file elsewhere
    r2 = cluster.models_root("h02")
    tree = r2 / ".staging" / m.model / m.version / "tree"
    tree.mkdir(parents=True)
    (tree / "config.json").symlink_to(secret)
    # with a journal for this manifest, so the agent resumes into (not discards) the staging
    Journal(tree.parent / "journal").save(JournalState(m.digest, set(), []), m.num_chunks)
    start(cluster)
    job = create_job(cluster, checkpoint)
    st = cluster.wait_for(
        lambda: (s := cluster.status(job))["state"] == "FAILED" and s, 90, "job FAILED"
    )
    errs = {h["host_id"]: h["errors"] for h in st["hosts"]}
    assert any(
        "UNSAFE_PATH" in e and str(r1 / m.model) in e and "check symlink" in e for e in errs["h01"]
    ), errs["h01"]
    assert any(
        "UNSAFE_PATH" in e and "config.json" in e and "check symlink" in e for e in errs["h02"]
    ), errs["h02"]
    assert st["hosts_ready"] == 2
    for h in ("h00", "h03"):
        assert_placed(cluster, checkpoint, h)
    assert list(outside.iterdir()) == []
    assert secret.read_text() == "do not overwrite"
    assert (tree / "config.json").is_symlink()


def test_origin_bit_rot_fails_job_naming_chunk_file_and_object(
    cluster: Cluster, checkpoint
) -> None:
    m = checkpoint["manifest"]
    chunk = 13
    rel, off = chunk_location(m, chunk)
    flip_byte(checkpoint["origin"] / rel, off)  # after signing: the origin rotted
    start(cluster)
    t0 = time.monotonic()
    job = create_job(cluster, checkpoint)
    st = cluster.wait_for(
        lambda: (s := cluster.status(job))["state"] == "FAILED" and s, 90, "job FAILED"
    )
    assert time.monotonic() - t0 < 90
    err = st["error"]
    assert "CHUNK_FAILED" in err and f"chunk {chunk} " in err, err
    assert f"file {rel}" in err and str(checkpoint["origin"] / rel) in err
    assert m.chunks[chunk].digest in err and "from ORIGIN" in err
    assert st["hosts_ready"] == 0
    for h, _ in HOSTS4:
        assert not (cluster.models_root(h) / m.model / m.version).exists()
    # the CLI reports the same error
    rc, out = agent_cli(
        "job", "get", job, "--coordinator", cluster.coordinator, "--pki", str(cluster.pki)
    )
    assert rc == 0 and out["state"] == "FAILED" and f"chunk {chunk} " in out["error"]


@pytest.mark.postgres
def test_origin_bit_rot_fails_job_durably_on_postgres(
    pg_dsn: str,
    tmp_path: Path,
    checkpoint,
) -> None:
    from relgate_agent.coordinator.store import JobStore

    m = checkpoint["manifest"]
    chunk = 6
    rel, off = chunk_location(m, chunk)
    flip_byte(checkpoint["origin"] / rel, off)
    label = f"cluster=pg-rot-{os.getpid()}-{tmp_path.name[-6:]}"
    hosts = [(f"rot{i}-{os.getpid()}", f"r{i % 2}") for i in range(3)]
    cluster = Cluster(tmp_path / "c", checkpoint["trusted"], ["--report-interval", "0.5"])
    try:
        cluster.start_coordinator_with_db(pg_dsn)
        for h, r in hosts:
            cluster.start_agent(h, r, labels=label, wait=False)
        cluster.wait_started()
        job = cluster.create_full_job(
            3,
            f"dj_rot_{os.getpid()}_{tmp_path.name[-6:]}",
            model=m.model,
            version=m.version,
            manifest_uri=str(checkpoint["envelope"]),
            origin_uri=str(checkpoint["origin"]),
            target_selector=label,
            ready_threshold_ppm=1_000_000,
            stripes=2,
        )
        st = cluster.wait_for(
            lambda: (s := cluster.status(job))["state"] == "FAILED" and s, 90, "job FAILED"
        )
        assert f"chunk {chunk} " in st["error"] and f"file {rel}" in st["error"]
    finally:
        cluster.stop_all()
    store = JobStore(pg_dsn)
    try:
        assert store.job_state(job) == "FAILED"
    finally:
        store.close()


def test_one_peer_sending_bad_data_forever_is_bypassed_not_fatal(
    cluster: Cluster, checkpoint
) -> None:
    from relgate_agent.coordinator.topology import build_topology

    m = checkpoint["manifest"]
    s = 1
    chain = build_topology(dict(HOSTS4), 4).stripes[s]
    # a sender with one downstream: one reporter never quarantines it, so only the
    # receiver's own bound and detour can keep the job from failing or hanging
    x = next(h for h in chain.order if len(chain.children(h)) == 1)
    y = chain.children(x)[0]
    block = m.stripe_blocks(s, 4)[5]
    start(cluster, env_for={x: {"RELGATE_AGENT_FAULT": f"corrupt_send={block}:100000"}})
    job = create_job(cluster, checkpoint)
    st = cluster.wait_for(
        lambda: (r := cluster.status(job))["state"] == "DONE" and r, 120, "job DONE"
    )
    assert st["hosts_ready"] == len(HOSTS4) and st["error"] == ""
    for h, _ in HOSTS4:
        assert_placed(cluster, checkpoint, h)
    ys = json.loads(next((cluster.models_root(y) / ".agent-stats").glob(f"{job}.*")).read_text())
    assert ys["crc_errors"] >= 3 and ys["swarm_chunks"] >= 1 and ys["failed"] == ""


def test_host_corrupting_every_block_is_quarantined_scrubbed_and_left_out(
    cluster: Cluster, checkpoint
) -> None:
    """Two downstreams get bad data from one host: it is quarantined, told so, scrubs its
    staging and re-verifies what it holds; the job is DONE over the others and names it."""
    from relgate_agent.coordinator.topology import build_topology

    m = checkpoint["manifest"]
    topo = build_topology(dict(HOSTS4), 4)
    kids = {h: {c for chain in topo.stripes for c in chain.children(h)} for h, _ in HOSTS4}
    x = max(sorted(kids), key=lambda h: len(kids[h]))
    assert len(kids[x]) >= 2  # two distinct receivers of its bad data
    start(cluster, env_for={x: {"RELGATE_AGENT_FAULT": "corrupt_send=all"}})
    job = create_job(cluster, checkpoint, origin_cap_bytes_per_s=4 * 1024 * 1024)
    st = cluster.wait_for(
        lambda: (r := cluster.status(job))["state"] == "DONE" and r, 120, "job DONE"
    )
    others = sorted(h for h, _ in HOSTS4 if h != x)
    assert st["quarantined_hosts"] == [x] and st["error"] == ""
    assert st["hosts_ready"] == len(others) and st["ready_hosts"] == others
    assert x not in st["stragglers"]
    for h in others:
        assert_placed(cluster, checkpoint, h)
    row = next(h for h in st["hosts"] if h["host_id"] == x)
    assert row["state"] == "QUARANTINED"
    assert any(e.startswith("QUARANTINED: BAD_DATA from") for e in row["errors"])

    def scrubbed() -> str:
        files = list((cluster.models_root(x) / ".agent-stats").glob(f"{job}.*.json"))
        return str(json.loads(files[0].read_text()).get("scrubbed", "")) if files else ""

    record = cluster.wait_for(scrubbed, 60, "the quarantined host's scrub")
    assert record.startswith(f"staging of {m.model}/{m.version} removed; re-verified: ")
    assert not (cluster.models_root(x) / ".staging" / m.model / m.version).exists()
