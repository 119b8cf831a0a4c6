"""Chaos in the network-namespace lab (root only), at small scale: 8 hosts on 2 racks; 2
hosts SIGKILLed mid-transfer, 1 corrupting every block it sends, 1 at 30 % of the NIC, the
leading coordinator SIGKILLed once (its replica takes the lease). Nothing corrupt or
partial is ever READY and every surviving host is placed with exactly the signed bytes.
The bench's chaos row (`make bench`) runs the same lab against a fault-free one."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_harness import assert_placed, create_lab_job, running_lab
from relgate_lab.netns import LabSpec

from relgate_agent.client import CoordinatorClient, job_to_dict
from relgate_agent.pki import TlsFiles

MiB = 1024 * 1024
NIC = 25 * MiB
KILLED = ("h02", "h07")
CORRUPTER, SLOW = "h05", "h06"

pytestmark = pytest.mark.lab


class _LabCluster:
    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def models_root(self, host: str) -> Path:
        return Path(self.state["hosts"][host]["models_root"])


def chaos_spec(state_dir: Path, trusted: str, hosts: int = 8) -> LabSpec:
    """The chaos lab: two coordinator replicas, a corrupting host, a host at 30 % NIC."""
    return LabSpec(
        hosts=hosts,
        racks=2,
        nic_bytes_per_s=NIC,
        state_dir=state_dir,
        trusted_keys=[trusted],
        journal_interval_s=0.5,
        report_interval_s=0.5,
        dead_after_s=4.0,
        coordinator_replicas=2,
        nic_overrides={SLOW: int(0.3 * NIC)},
        agent_env={CORRUPTER: {"RELGATE_AGENT_FAULT": "corrupt_send=all"}},
    )


def _wait(what: str, timeout: float, fn: Any) -> Any:
    """``fn()`` until truthy; a replica taking over answers UNAVAILABLE for a moment (retried,
    and named if the wait runs out); any other error, a refusal included, fails at once."""
    deadline, last = time.monotonic() + timeout, None
    while True:
        try:
            got = fn()
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            got, last = None, exc
        if got:
            return got
        assert time.monotonic() < deadline, f"timed out waiting for {what} (last: {last})"
        time.sleep(0.5)


def start_job(
    client: CoordinatorClient,
    checkpoint: dict[str, Any],
    hosts: int,
    origin_cap_bytes_per_s: int = 3 * MiB,  # ~8 s: the faults land mid-transfer
) -> str:
    return create_lab_job(client, checkpoint, hosts, origin_cap_bytes_per_s=origin_cap_bytes_per_s)


def inject_chaos(state: dict[str, Any], client: CoordinatorClient, job: str, size: int) -> None:
    """Once the transfer is under way: SIGKILL the two hosts, then the leading coordinator."""
    _wait(
        "transfer under way",
        60,
        lambda: job_to_dict(client.get_job(job))["bytes_moved"] >= 2 * size,
    )
    for h in KILLED:
        os.kill(int(state["pids"][h]), signal.SIGKILL)
    os.kill(int(state["pids"]["coordinator"]), signal.SIGKILL)


def settled(client: CoordinatorClient, job: str) -> dict[str, Any] | None:
    """The job once every host is READY, DEAD, QUARANTINED or REMOVED (None before). A killed
    host that had complained of the corrupter may be removed as the suspect of its own
    complaints (its peers' connections to it fail too) before its silence makes it DEAD:
    either takes it out of the job (seen once in a clean-clone CI run); check_copies still
    wants every host that was not killed READY."""
    st = job_to_dict(client.get_job(job))
    states = {h["host_id"]: h["state"] for h in st["hosts"]}
    out = ("READY", "DEAD", "QUARANTINED", "REMOVED")
    return st if all(s in out for s in states.values()) else None


def check_copies(state: dict[str, Any], checkpoint: dict[str, Any], st: dict[str, Any]) -> None:
    m, lab = checkpoint["manifest"], _LabCluster(state)
    states = {h["host_id"]: h["state"] for h in st["hosts"]}
    for h in state["hosts"]:
        if h not in KILLED and h != CORRUPTER:
            assert states[h] == "READY", (h, states[h])
        if states[h] == "READY" or (lab.models_root(h) / m.model / m.version).exists():
            assert_placed(lab, checkpoint, h)  # type: ignore[arg-type] - exact signed bytes


@pytest.fixture
def chaos_lab(tmp_path: Path, checkpoint):
    # 8 hosts in make test (4 of them faulty); bench chaos runs the 16-host fleet
    spec = chaos_spec(tmp_path / "lab", str(checkpoint["trusted"]), 8)
    with running_lab(spec) as state:
        yield state


def test_chaos_kills_corruption_slow_nic_and_a_coordinator_failover(chaos_lab, checkpoint) -> None:
    state = chaos_lab
    size = checkpoint["manifest"].total_size
    client = CoordinatorClient(
        state["coordinator_unix"], TlsFiles.from_pki(state["pki"], "operator")
    )
    try:
        job = start_job(client, checkpoint, len(state["hosts"]))
        inject_chaos(state, client, job, size)
        st = _wait("every host settled", 150, lambda: settled(client, job))
    finally:
        client.close()
    check_copies(state, checkpoint, st)
    states = {h["host_id"]: h["state"] for h in st["hosts"]}
    # READY only if done before; REMOVED: see settled
    assert {states[h] for h in KILLED} <= {"DEAD", "READY", "REMOVED"}
    # the corrupter's own copy is sound (it flips bytes on the wire only); what it sent
    # was caught by CRC at its downstreams, never written, never forwarded
    assert states[CORRUPTER] in ("QUARANTINED", "READY")
    # every CRC failure names the corrupter; how many blocks it got to send before it was
    # quarantined or left a leaf depends on timing (a loaded CI may demote it first)
    caught = [e for h in st["hosts"] for e in h["errors"] if "CRC_MISMATCH" in e]
    assert all(CORRUPTER in e for e in caught), caught[:3]
    if states[CORRUPTER] == "QUARANTINED":  # two downstreams reported its bad data
        assert caught
    # the leader is gone: the replica answered every call since
    assert _dead(int(state["pids"]["coordinator"]))


def _dead(pid: int) -> bool:
    """Gone, or a zombie not reaped yet (the lab started it as a child of this process)."""
    status = Path(f"/proc/{pid}/status")
    return not status.exists() or "State:\tZ" in status.read_text()
