"""The network-namespace lab (root only): per-host namespaces, rack bridges, NIC caps."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from agent_harness import assert_placed, running_lab
from relgate_lab.netns import LabSpec, wan_bytes

from relgate_agent.client import CoordinatorClient, job_to_dict

MiB = 1024 * 1024

pytestmark = pytest.mark.lab


class _LabCluster:
    """Adapter so assert_placed() can find each lab host's models root."""

    def __init__(self, state: dict) -> None:
        self.state = state

    def models_root(self, host: str) -> Path:
        return Path(self.state["hosts"][host]["models_root"])


@pytest.fixture
def lab(tmp_path: Path, checkpoint):
    spec = LabSpec(
        hosts=8,
        racks=2,
        nic_bytes_per_s=25 * MiB,
        state_dir=tmp_path / "lab",
        trusted_keys=[str(checkpoint["trusted"])],
        journal_interval_s=0.5,
        report_interval_s=0.5,
        # h03 serves inference: it declares an upload cap and must become a leaf
        agent_args={"h03": ["--max-rate", str(20 * MiB)]},
    )
    with running_lab(spec) as state:
        yield state


def _distribute(lab: dict, checkpoint: dict, **spec: Any) -> dict:
    """Create the job once every lab host registered; its status once all are READY."""
    from relgate_agent.pki import TlsFiles

    hosts = len(lab["hosts"])
    client = CoordinatorClient(lab["coordinator_unix"], TlsFiles.from_pki(lab["pki"], "operator"))
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                job = client.create_job(
                    model="claude-x",
                    version="2026-10-12.3",
                    manifest_uri=str(checkpoint["envelope"]),
                    origin_uri=str(checkpoint["origin"]),
                    target_selector="cluster=lab",
                    ready_threshold_ppm=1_000_000,
                    stripes=4,
                    **spec,
                )
                if job.hosts_total == hosts:
                    break
                client.cancel_job(job.job_id)
            except Exception:
                if time.monotonic() > deadline:
                    raise
            assert time.monotonic() < deadline, "agents did not register in the lab"
            time.sleep(0.5)
        deadline = time.monotonic() + 120
        while (st := job_to_dict(client.get_job(job.job_id)))["hosts_ready"] < hosts:
            assert time.monotonic() < deadline, st
            time.sleep(0.5)
    finally:
        client.close()
    return st


def test_lab_fanout_in_namespaces(lab, checkpoint) -> None:
    assert lab["mode"] == "netns"
    # the caps are really installed on every host NIC
    h0 = lab["hosts"]["h00"]
    qdisc = subprocess.run(
        ["ip", "netns", "exec", h0["ns"], "tc", "qdisc", "show", "dev", "eth0"],
        capture_output=True,
        text=True,
    ).stdout
    assert "htb" in qdisc  # a class per peer: see test_a_capped_upload_is_shared_fairly...

    st = _distribute(lab, checkpoint)
    for h in lab["hosts"]:
        assert_placed(_LabCluster(lab), checkpoint, h)  # type: ignore[arg-type]
    assert st["origin_bytes"] <= 1.05 * checkpoint["manifest"].total_size
    serving = next(h for h in st["hosts"] if h["host_id"] == "h03")
    assert any(e.startswith(f"LEAF declared serving rate {20 * MiB}") for e in serving["errors"])


@pytest.fixture
def dc_lab(tmp_path: Path, bf16_checkpoint):
    """Two DCs of two racks of two hosts; the WAN link between them at 1/6 of a host NIC."""
    spec = LabSpec(
        hosts=8,
        racks=4,
        dcs=2,
        nic_bytes_per_s=25 * MiB,
        wan_bytes_per_s=4 * MiB,
        state_dir=tmp_path / "lab",
        trusted_keys=[str(bf16_checkpoint["trusted"])],
        journal_interval_s=0.5,
        report_interval_s=0.5,
    )
    with running_lab(spec) as state:
        yield state


def _agent_stats(lab: dict, host: str) -> dict[str, int]:
    d = Path(lab["hosts"][host]["models_root"]) / ".agent-stats"
    docs = [json.loads(p.read_text()) for p in d.glob("*.json")]
    keys = ("origin_bytes", "wan_wire_bytes", "wan_raw_bytes")
    return {k: sum(int(doc.get(k, 0)) for doc in docs) for k in keys}


def test_two_dcs_over_a_slow_wan_read_the_origin_once_and_cross_it_once(
    dc_lab, bf16_checkpoint
) -> None:
    by_dc: dict[str, list[str]] = {}
    for h, info in dc_lab["hosts"].items():
        by_dc.setdefault(info["labels"].rsplit("dc=", 1)[1], []).append(h)
    assert sorted(by_dc) == ["dc0", "dc1"] and all(len(v) == 4 for v in by_dc.values())
    before = wan_bytes(dc_lab)["dc1"]["in"]
    _distribute(dc_lab, bf16_checkpoint, origin_dc="dc0")
    crossed = wan_bytes(dc_lab)["dc1"]["in"] - before
    for h in dc_lab["hosts"]:
        assert_placed(_LabCluster(dc_lab), bf16_checkpoint, h)  # type: ignore[arg-type]
    size = bf16_checkpoint["manifest"].total_size
    stats = {h: _agent_stats(dc_lab, h) for h in dc_lab["hosts"]}
    origin = {dc: sum(stats[h]["origin_bytes"] for h in hosts) for dc, hosts in by_dc.items()}
    assert size <= origin["dc0"] <= 1.05 * size  # the origin's DC reads it about once
    assert origin["dc1"] == 0  # the other DC reads it from its own stripe roots
    wire = sum(stats[h]["wan_wire_bytes"] for h in by_dc["dc1"])
    raw = sum(stats[h]["wan_raw_bytes"] for h in by_dc["dc1"])
    assert size <= raw <= 1.05 * size  # one copy of every stripe went into dc1
    # what really crossed the WAN link (frames, TLS, TCP, control plane) is less than one
    # raw copy: the blocks crossed compressed, once
    assert wire <= crossed < size, (wire, crossed, size)


# a TCP sink that records what it has received over time (CLOCK_MONOTONIC, one clock for
# every namespace), and a source that sends at will; the rates are read over one window
# that every flow spans, so sinks that started apart (a loaded machine starts the sources
# seconds apart) are compared over the same seconds
RECEIVE_S = 4.0
SINK_S = 9.0
_SINK = f"""
import json, socket, time
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", 5001))
s.listen(1)
print("listening", flush=True)
c, _ = s.accept()
n, t = 0, time.monotonic()
seen = [[t, 0]]
while time.monotonic() - t < {SINK_S}:
    b = c.recv(1 << 20)
    if not b:
        break
    n += len(b)
    now = time.monotonic()
    if now - seen[-1][0] >= 0.05:
        seen.append([now, n])
seen.append([time.monotonic(), n])
print(json.dumps(seen), flush=True)
"""


def _received_at(seen: list[list[float]], when: float) -> float:
    """Bytes a sink had received at ``when`` (linear between its samples)."""
    for (t0, n0), (t1, n1) in itertools.pairwise(seen):
        if t0 <= when <= t1:
            return n0 + (n1 - n0) * (when - t0) / max(t1 - t0, 1e-9)
    raise AssertionError(f"{when} is outside the sink's record {seen[0][0]}..{seen[-1][0]}")


def _common_rates(timelines: list[list[list[float]]]) -> list[float]:
    """Each sink's rate over the same RECEIVE_S window, a second after the last flow began."""
    start = max(seen[0][0] for seen in timelines) + 1.0
    end = start + RECEIVE_S
    assert end <= min(seen[-1][0] for seen in timelines), "the flows overlapped too briefly"
    return [(_received_at(s, end) - _received_at(s, start)) / RECEIVE_S for s in timelines]


_SOURCE = """
import socket, sys, time
c = socket.create_connection((sys.argv[1], 5001))
b = b"x" * (1 << 20)
t = time.monotonic()
try:
    while time.monotonic() - t < 30:
        c.sendall(b)
except OSError:
    pass
"""


@pytest.mark.parametrize("fair", [True, False])
def test_a_capped_upload_is_shared_fairly_among_its_peers(
    tmp_path: Path, keypair, fair: bool
) -> None:
    """A real host's fq_codel shares its NIC among its flows; a bare tbf queues them in one
    FIFO, where TCP gave one of three flows from a 2 MiB/s upload 1.49 MiB/s and the
    others 0.26 (measured here): the judge read the starved children of a 30 % uploader as
    rx-slow. The lab's htb class per peer shares it: each flow gets half its fair share or
    more (0.64-0.66 MiB/s measured) and the cap holds."""
    cap = 2 * MiB
    spec = LabSpec(
        hosts=4,
        racks=1,
        nic_bytes_per_s=8 * MiB,
        state_dir=tmp_path / "lab",
        trusted_keys=[str(keypair[2])],
        start_agents=False,
        tx_overrides={"h00": cap},
        fair_nics=fair,
    )
    with running_lab(spec) as state:
        hosts = state["hosts"]
        wrap = ["ip", "netns", "exec"]
        kids = ("h01", "h02", "h03")
        sinks = [
            subprocess.Popen(
                [*wrap, hosts[h]["ns"], sys.executable, "-c", _SINK],
                stdout=subprocess.PIPE,
                text=True,
            )
            for h in kids
        ]
        sources = []
        try:
            for sink in sinks:
                assert sink.stdout is not None and sink.stdout.readline() == "listening\n"
            sources = [
                subprocess.Popen(
                    [*wrap, hosts["h00"]["ns"], sys.executable, "-c", _SOURCE, hosts[h]["address"]]
                )
                for h in kids
            ]
            timelines = [json.loads(sink.communicate(timeout=60)[0]) for sink in sinks]
            got = _common_rates(timelines)
        finally:
            for p in (*sinks, *sources):
                p.kill()
                p.wait()
    assert sum(got) <= 1.1 * cap  # the cap holds either way
    if fair:
        assert min(got) >= 0.5 * cap / len(kids), got
