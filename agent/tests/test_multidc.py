"""Two data centers on loopback: the home DC reads the origin, the other DC's stripe roots
are its regional replica, filled over one cross-DC edge per stripe with compressed frames.

Real coordinator and agent processes, mutual TLS; the DC is the enrollment label ``dc``.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from agent_harness import Cluster, assert_placed, job_spec

EAST = [("e0a", "e0"), ("e0b", "e0"), ("e1a", "e1"), ("e1b", "e1")]
WEST = [("w0a", "w0"), ("w0b", "w0"), ("w1a", "w1")]


@pytest.fixture
def dc_cluster(tmp_path: Path, bf16_checkpoint: dict[str, Any]):
    c = Cluster(
        tmp_path / "cluster",
        bf16_checkpoint["trusted"],
        ["--dead-after", "3", "--report-interval", "0.5"],
    )
    try:
        yield c
    finally:
        c.stop_all()


def _stats(cluster: Cluster, host: str, job: str) -> dict[str, int]:
    d = cluster.models_root(host) / ".agent-stats"
    docs = [json.loads(p.read_text()) for p in sorted(d.glob(f"{job}.*.json"))]
    keys = ("origin_bytes", "wan_wire_bytes", "wan_raw_bytes", "rx_bytes")
    return {k: sum(int(doc.get(k, 0)) for doc in docs) for k in keys}


def test_each_dc_reads_the_origin_about_once_and_the_wan_carries_one_compressed_copy(
    dc_cluster: Cluster, bf16_checkpoint: dict[str, Any]
) -> None:
    c = dc_cluster
    c.start_coordinator()
    for dc, hosts in (("east", EAST), ("west", WEST)):
        for h, r in hosts:
            c.start_agent(h, r, labels=f"cluster=inf-a,dc={dc}")
    c.wait_started()
    c.wait_registered(len(EAST) + len(WEST))
    client = c.client()
    try:
        job = client.create_job(**job_spec(bf16_checkpoint, origin_dc="east")).job_id
    finally:
        client.close()
    total = len(EAST) + len(WEST)
    c.wait_for(lambda: c.status(job)["hosts_ready"] == total, 120, "all hosts READY")
    for h, _ in EAST + WEST:
        assert_placed(c, bf16_checkpoint, h)
    size = bf16_checkpoint["manifest"].total_size
    east = {h: _stats(c, h, job) for h, _ in EAST}
    west = {h: _stats(c, h, job) for h, _ in WEST}
    # the home DC reads the origin once; the other DC never touches it
    assert size <= sum(s["origin_bytes"] for s in east.values()) <= 1.05 * size
    assert sum(s["origin_bytes"] for s in west.values()) == 0
    # each of the 4 stripes crosses the WAN once: one copy of S, compressed on the wire
    wan_raw = sum(s["wan_raw_bytes"] for s in west.values())
    wan_wire = sum(s["wan_wire_bytes"] for s in west.values())
    assert size <= wan_raw <= 1.05 * size
    assert wan_wire < 0.8 * wan_raw
    # in-DC links stay raw
    assert all(s["wan_raw_bytes"] == s["wan_wire_bytes"] == 0 for s in east.values())
