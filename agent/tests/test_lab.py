"""The network-namespace lab (root only): per-host namespaces, rack bridges, tbf caps."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from agent_harness import assert_placed
from relgate_lab.netns import LabSpec, lab_down, lab_up, netns_available

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
    if not netns_available():
        pytest.skip("network-namespace lab needs root and `ip netns`")
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
    state = lab_up(spec)
    try:
        yield state
    finally:
        lab_down(spec.state_dir)
        leftover = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"rgl{state['id']}" not in leftover


def test_lab_fanout_in_namespaces(lab, checkpoint) -> None:
    assert lab["mode"] == "netns"
    # the caps are really installed on every host NIC
    h0 = lab["hosts"]["h00"]
    qdisc = subprocess.run(
        ["ip", "netns", "exec", h0["ns"], "tc", "qdisc", "show", "dev", "eth0"],
        capture_output=True,
        text=True,
    ).stdout
    assert "tbf" in qdisc
    from relgate_agent.pki import TlsFiles

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
                )
                if job.hosts_total == 8:
                    break
                client.cancel_job(job.job_id)
            except Exception:
                if time.monotonic() > deadline:
                    raise
            assert time.monotonic() < deadline, "agents did not register in the lab"
            time.sleep(0.5)
        deadline = time.monotonic() + 120
        while (st := job_to_dict(client.get_job(job.job_id)))["hosts_ready"] < 8:
            assert time.monotonic() < deadline, st
            time.sleep(0.5)
    finally:
        client.close()
    for h in lab["hosts"]:
        assert_placed(_LabCluster(lab), checkpoint, h)  # type: ignore[arg-type]
    assert st["origin_bytes"] <= 1.05 * checkpoint["manifest"].total_size
    serving = next(h for h in st["hosts"] if h["host_id"] == "h03")
    assert any(e.startswith(f"LEAF declared serving rate {20 * MiB}") for e in serving["errors"])
