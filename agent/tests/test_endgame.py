"""Swarm end-game with real agents on loopback: the last chunk behind a stalled upstream is
raced from every holder at once; the copy that verifies first wins, the others are
cancelled."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from agent_harness import Cluster, assert_placed, job_spec, write_checkpoint
from relgate_lab.faults import FAULT_ENV
from relgate_trust.manifest import build_manifest, sign_manifest, write_envelope

from relgate_agent.agent.endgame import rarest_first
from relgate_agent.coordinator.topology import build_topology

KiB = 1024
HOSTS = [(f"h{i:02d}", f"r{i % 2}") for i in range(4)]
STRIPES = 4


def test_rarest_first_orders_by_holders_then_index() -> None:
    # holder counts as FindPeers reports them: uncapped, so 9 and 40 holders still differ
    holders = {7: 40, 2: 1, 5: 0, 3: 9, 1: 1, 4: 2}
    assert rarest_first(holders) == [1, 2, 4, 3, 7]  # 5 has no holder: the chain or origin only


@pytest.fixture
def ckpt(tmp_path: Path, keypair) -> dict[str, Any]:
    files = write_checkpoint(tmp_path / "ckpt", {"a.bin": 2 << 20, "b.bin": (2 << 20) + 99})
    m = build_manifest(files, "claude-x", "eg.1", chunk_size=128 * KiB, block_size=32 * KiB)
    env = tmp_path / "manifest.dsse.json"
    write_envelope(sign_manifest(m, keypair[0]), env)
    digests = {f.path: hashlib.sha256((files / f.path).read_bytes()).hexdigest() for f in m.files}
    return {"manifest": m, "envelope": env, "origin": files, "digests": digests}


def test_last_chunk_behind_a_stalled_upstream_is_raced_from_holders(
    tmp_path: Path, keypair, ckpt: dict[str, Any]
) -> None:
    m = ckpt["manifest"]
    chain = build_topology(dict(HOSTS), STRIPES).stripes[0]
    # a mid-chain sender that holds stripe 0's last block and stalls sending it (20 s, to
    # its downstream and to any FetchChunk alike); its downstream is the victim
    stalled = next(h for h in chain.order if chain.parent[h] is not None and chain.children(h))
    victim = chain.children(stalled)[0]
    block = m.stripe_blocks(0, STRIPES)[-1]
    chunk = m.block_chunk(block)
    c = Cluster(tmp_path / "cluster", keypair[2], ["--dead-after", "3", "--report-interval", "0.5"])
    try:
        c.start_coordinator()
        for h, r in HOSTS:
            env = {FAULT_ENV: f"stall_send={block}:20"} if h == stalled else None
            c.start_agent(h, r, env=env, wait=False)
        c.wait_started()
        c.wait_registered(len(HOSTS))
        cl = c.client()
        try:
            job = cl.create_job(
                **job_spec(ckpt, model=m.model, version=m.version, stripes=STRIPES)
            ).job_id
        finally:
            cl.close()
        c.wait_for(lambda: c.status(job)["hosts_ready"] == len(HOSTS), 120, "every host READY")
        for h, _ in HOSTS:
            assert_placed(c, ckpt, h)
        d = c.models_root(victim) / ".agent-stats"
        (s,) = [json.loads(p.read_text()) for p in d.glob(f"{job}.*.json")]
        # the chunk came from the end-game race, not the one-at-a-time swarm fallback
        assert s["endgame_chunks"] >= 1, s
        assert s["swarm_chunks"] == 0, s
        # the stalled holder's copy was cancelled once another holder's verified
        assert s["endgame_cancelled"] >= 1, s
        assert chunk in range(m.num_chunks)
    finally:
        c.stop_all()
