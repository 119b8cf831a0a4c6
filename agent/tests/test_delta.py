"""Delta across versions and job priority, with real agents on loopback.

A new version in which 1 of 12 files changed (same size) moves only the chunks overlapping
that file over the network: every other chunk is copied from the placed previous version
after being re-hashed against the new signed digest (a held copy that rotted is refused
and fetched). Two jobs sharing hosts: the higher-priority one is fetched first.
"""

from __future__ import annotations

import hashlib
import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from agent_harness import Cluster, assert_placed, job_spec, write_checkpoint
from relgate_trust.manifest import (
    CheckpointManifest,
    TrustedKeys,
    build_manifest,
    envelope_bytes,
    generate_private_key,
    sign_manifest,
    write_envelope,
    write_keypair,
)

from relgate_agent.agent.delta import copy_held_chunks
from relgate_agent.staging.storage import JournalState, VersionStore

KiB = 1024
HOSTS = [(f"h{i:02d}", f"r{i % 2}") for i in range(4)]
# 12 files of uneven sizes (chunks straddle files); ~3.3 MiB in 128 KiB chunks
SIZES = {f"model-{i:05d}-of-00012.safetensors": 200 * KiB + 37 * i * KiB + i for i in range(12)}
CHANGED = "model-00005-of-00012.safetensors"
CHUNK, BLOCK = 128 * KiB, 32 * KiB


def _signed(
    tmp: Path, name: str, files: Path, model: str, version: str, key: Any, **kw: int
) -> dict[str, Any]:
    m = build_manifest(
        files, model, version, chunk_size=kw.get("chunk", CHUNK), block_size=kw.get("block", BLOCK)
    )
    env = tmp / f"{name}.dsse.json"
    write_envelope(sign_manifest(m, key), env)
    digests = {f.path: hashlib.sha256((files / f.path).read_bytes()).hexdigest() for f in m.files}
    return {"manifest": m, "envelope": env, "origin": files, "digests": digests}


@pytest.fixture
def cluster(tmp_path: Path, keypair):
    c = Cluster(tmp_path / "cluster", keypair[2], ["--dead-after", "3", "--report-interval", "0.5"])
    try:
        yield c
    finally:
        c.stop_all()


def _create(cluster: Cluster, ck: dict[str, Any], **kw: Any) -> str:
    c = cluster.client()
    try:
        m = ck["manifest"]
        return c.create_job(**job_spec(ck, model=m.model, version=m.version, **kw)).job_id
    finally:
        c.close()


def _all_ready(cluster: Cluster, job: str, timeout: float = 120) -> dict[str, Any]:
    return cluster.wait_for(
        lambda: (s := cluster.status(job))["hosts_ready"] == len(HOSTS) and s,
        timeout,
        f"every host READY in {job}",
    )


def _stats(cluster: Cluster, host: str, job: str) -> dict[str, Any]:
    d = cluster.models_root(host) / ".agent-stats"
    docs = [json.loads(p.read_text()) for p in sorted(d.glob(f"{job}.*.json"))]
    assert len(docs) == 1, f"{host}: {len(docs)} stats files for {job}"
    return docs[0]


def _start(cluster: Cluster) -> None:
    cluster.start_coordinator()
    for h, r in HOSTS:
        cluster.start_agent(h, r, wait=False)
    cluster.wait_started()
    cluster.wait_registered(len(HOSTS))


def _overlapping(m: CheckpointManifest, path: str) -> set[int]:
    f = next(f for f in m.files if f.path == path)
    return {
        c.index for c in m.chunks if c.offset < f.offset + f.size and f.offset < c.offset + c.size
    }


def test_new_version_moves_only_the_changed_files_chunks(
    cluster: Cluster, tmp_path: Path, keypair
) -> None:
    key = keypair[0]
    v1_dir = write_checkpoint(tmp_path / "v1", SIZES, seed=11)
    v2_dir = tmp_path / "v2"
    shutil.copytree(v1_dir, v2_dir)
    (v2_dir / CHANGED).write_bytes(random.Random(99).randbytes(SIZES[CHANGED]))  # same size
    v1 = _signed(tmp_path, "v1", v1_dir, "claude-x", "2026-12-01.1", key)
    v2 = _signed(tmp_path, "v2", v2_dir, "claude-x", "2026-12-02.1", key)
    m1, m2 = v1["manifest"], v2["manifest"]
    changed = {c.index for c in m2.chunks if c.digest != m1.chunks[c.index].digest}
    assert changed == _overlapping(m2, CHANGED)  # exactly the chunks that overlap the file
    bound = sum(m2.chunks[c].size for c in changed)
    assert bound < m2.total_size / 6

    _start(cluster)
    _all_ready(cluster, _create(cluster, v1))
    # h01's placed v1 rotted in an unchanged file: its copy of that chunk must not be used
    rot_file = "model-00009-of-00012.safetensors"
    f = next(f for f in m1.files if f.path == rot_file)
    rotted = cluster.models_root("h01") / m1.model / m1.version / rot_file
    data = bytearray(rotted.read_bytes())
    data[1000] ^= 0xFF
    rotted.write_bytes(bytes(data))
    rot_chunk = (f.offset + 1000) // CHUNK
    assert rot_chunk not in changed

    job = _create(cluster, v2)
    st = _all_ready(cluster, job)
    for h, _ in HOSTS:
        assert_placed(cluster, v2, h)
    origin = 0
    for h, _ in HOSTS:
        s = _stats(cluster, h, job)
        rejected = 1 if h == "h01" else 0
        # over the network: at most the changed file's chunks (+ the chunk h01's copy lost;
        # + what an end-game race costs, if a loaded machine stalled a stripe for 2 s: the
        # stream's copy of a raced chunk and whole losing copies)
        allowed = (
            bound
            + rejected * m2.chunks[rot_chunk].size
            + s["endgame_chunks"] * CHUNK
            + s["endgame_duplicate_bytes"]
        )
        assert s["rx_bytes"] + s["origin_bytes"] <= allowed, (h, s)
        assert s["local_chunks"] == m2.num_chunks - len(changed) - rejected, (h, s)
        assert s["local_rejected"] == rejected, (h, s)
        origin += s["origin_bytes"]
    assert origin <= bound  # the origin serves only the changed chunks
    assert st["origin_bytes"] <= bound
    h01 = next(x for x in st["hosts"] if x["host_id"] == "h01")
    assert any(e.startswith("LOCAL_COPY_REJECTED") for e in h01["errors"]), h01["errors"]
    # the previous version is still placed (N-1 retention, nothing acknowledged)
    for h, _ in HOSTS:
        assert (cluster.models_root(h) / m1.model / m1.version).is_dir()


def test_higher_priority_job_is_fetched_first(cluster: Cluster, tmp_path: Path, keypair) -> None:
    key = keypair[0]
    sizes = {"a.safetensors": 2 << 20, "b.safetensors": 2 << 20}
    low = _signed(
        tmp_path, "low", write_checkpoint(tmp_path / "low", sizes, seed=1), "model-a", "v1", key
    )
    high = _signed(
        tmp_path, "high", write_checkpoint(tmp_path / "high", sizes, seed=2), "model-b", "v1", key
    )
    _start(cluster)
    cap = 1 << 20  # 1 MiB/s of origin per job: each job alone takes ~4 s
    low_job = _create(cluster, low, priority="low", origin_cap_bytes_per_s=cap)
    lm, hm = low["manifest"], high["manifest"]
    cluster.wait_for(
        lambda: any(cluster.journaled(h, lm) >= 2 for h, _ in HOSTS), 60, "low job under way"
    )
    high_job = _create(cluster, high, priority="high", origin_cap_bytes_per_s=cap)
    # the low job had a head start and was not done anywhere when the high one arrived
    assert not any((cluster.models_root(h) / lm.model / lm.version).exists() for h, _ in HOSTS)
    _all_ready(cluster, high_job)
    _all_ready(cluster, low_job)
    for h, _ in HOSTS:
        root = cluster.models_root(h) / ".placed"
        t_low = (root / lm.model / f"{lm.version}.digest").stat().st_mtime_ns
        t_high = (root / hm.model / f"{hm.version}.digest").stat().st_mtime_ns
        assert t_high < t_low, f"{h}: the low-priority job was placed first"
        assert_placed(cluster, low, h)
        assert_placed(cluster, high, h)


def test_staged_journal_chunks_are_reused_and_rot_refused(tmp_path: Path, keypair) -> None:
    """A version still staging (interrupted, or another job) lends its journaled chunks;
    chunks it never journaled are not trusted, and a journaled one that rotted is refused."""
    key, _, trusted = keypair
    v1_dir = write_checkpoint(tmp_path / "v1", SIZES, seed=11)
    v2_dir = tmp_path / "v2"
    shutil.copytree(v1_dir, v2_dir)
    (v2_dir / CHANGED).write_bytes(random.Random(99).randbytes(SIZES[CHANGED]))
    m1 = build_manifest(v1_dir, "claude-x", "v1", chunk_size=CHUNK, block_size=BLOCK)
    m2 = build_manifest(v2_dir, "claude-x", "v2", chunk_size=CHUNK, block_size=BLOCK)
    root = tmp_path / "models"
    staged = VersionStore(root, m1)
    staged.open()
    whole = b"".join((v1_dir / f.path).read_bytes() for f in m1.files)
    journaled = set(range(0, m1.num_chunks, 2))  # every other chunk verified and journaled
    for c in range(m1.num_chunks):
        e = m1.chunks[c]
        staged.pwrite(e.offset, whole[e.offset : e.offset + e.size])
    staged.fsync()
    staged.journal.save(JournalState(m1.digest, journaled), m1.num_chunks)
    staged.write_staged_envelope(envelope_bytes(sign_manifest(m1, key)))
    rot = 4  # journaled, unchanged in v2: its staged bytes rot
    staged.pwrite(m1.chunks[rot].offset + 5, b"\x00\x01\x02")
    staged.close()

    written: dict[int, bytes] = {}
    got = copy_held_chunks(
        root,
        TrustedKeys.load([trusted]),
        m2,
        list(range(m2.num_chunks)),
        written.__setitem__,
    )
    changed = _overlapping(m2, CHANGED)
    assert set(got.copied) == journaled - changed - {rot}
    assert got.rejected == [(rot, "claude-x/v1 (staged)")]
    for c in got.copied:
        e = m2.chunks[c]
        assert written[c] == whole[e.offset : e.offset + e.size]
    # an envelope signed by an unknown key: nothing of that staged version is used
    other = tmp_path / "other-trusted"
    other.mkdir()
    write_keypair(generate_private_key(), tmp_path / "o.key", other / "builder-v1-o.pem")
    none = copy_held_chunks(root, TrustedKeys.load([other]), m2, [0, 1], lambda c, d: None)
    assert none.copied == [] and none.rejected == []
