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

from relgate_agent.agent.endgame import (
    UNDERFED_WINDOW_S,
    FeedRate,
    rarest_first,
    tail_chunks,
)
from relgate_agent.coordinator.topology import build_topology
from relgate_agent.manifest import build_manifest, sign_manifest, write_envelope

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


def test_a_host_fed_under_half_its_peak_is_underfed() -> None:
    feed, w = FeedRate(), UNDERFED_WINDOW_S
    feed.add(0.0, 0)
    assert feed.rate == 0 and not feed.underfed()  # no whole window yet: nothing to compare
    feed.add(w, int(10e6 * w))  # 10 MB/s over the first window
    assert feed.peak == feed.rate == 10e6 and not feed.underfed()
    feed.add(2 * w, int(10e6 * w + 6e6 * w))  # 6 MB/s: slower, not starved
    assert feed.rate == 6e6 and feed.peak == 10e6 and not feed.underfed()
    feed.add(3 * w, int(16e6 * w + 4e6 * w))  # 4 MB/s: under half the peak
    assert feed.rate == 4e6 and feed.underfed()
    assert len(feed.samples) == 2  # one window's samples are kept, never more
    # a host that never received has no peak: never underfed (the start, a paused job)
    idle = FeedRate()
    for t in range(5):
        idle.add(float(t), 0)
    assert not idle.underfed()


def test_tail_chunks_take_the_back_of_every_stripe_first() -> None:
    missing = [[0, 4, 8, 12], [5], [], [3, 7, 11]]
    assert tail_chunks(missing, 4) == [12, 5, 11, 8]
    assert tail_chunks(missing, 100) == [12, 5, 11, 8, 7, 4, 3, 0]
    assert tail_chunks([[], []], 4) == [] and tail_chunks(missing, 0) == []


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
