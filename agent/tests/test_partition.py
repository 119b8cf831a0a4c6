"""A leader cut off the network mid-job (root only: the netns lab). Each coordinator replica
has its own namespace and the store is PostgreSQL on the lab network, so the cut leader
loses the agents and the store together, as in a fleet. With bytes flowing, the leading
replica's link is dropped (``down``: nothing in or out) or only its sending side
(``egress-drop``: it still receives and sends nothing). The other replica takes
the lease; no host is spliced or judged DEAD while it streams; every host ends READY with
the signed bytes; from the replica's first answer on the cut leader serves nothing, and
with its link back it stays a follower (its renewal failed: it stepped down) under a
later epoch. (Agents dropping a deposed leader's older epoch is test_failover's.)"""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_harness import assert_placed, running_lab
from relgate_lab.netns import LabSpec, replica_link
from relgate_lab.pgstore import pg_bindir
from test_chaos import _LabCluster, _wait, settled, start_job

from relgate_agent.client import CoordinatorClient, job_to_dict
from relgate_agent.pki import TlsFiles

MiB = 1024 * 1024
HOSTS = 6
LEADER, REPLICA = "coordinator", "coordinator-1"

pytestmark = pytest.mark.lab


@pytest.fixture
def ha_lab(tmp_path: Path, checkpoint):
    if pg_bindir() is None:
        pytest.skip("the partition lab's store needs the PostgreSQL server binaries")
    spec = LabSpec(
        hosts=HOSTS,
        racks=2,
        nic_bytes_per_s=25 * MiB,
        state_dir=tmp_path / "lab",
        trusted_keys=[str(checkpoint["trusted"])],
        journal_interval_s=0.5,
        report_interval_s=0.5,
        dead_after_s=4.0,
        coordinator_replicas=2,
        store="postgres",
    )
    with running_lab(spec) as state:
        yield state


def _client(state: dict[str, Any], replica: int) -> CoordinatorClient:
    """One replica only, through its unix socket (it crosses namespaces: reachable from
    here while the replica's network link is down)."""
    sock = state["coordinator_unix"].split(",")[replica]
    return CoordinatorClient(sock, TlsFiles.from_pki(state["pki"], "operator"))


def _answer(client: CoordinatorClient, job: str) -> str:
    """``ok`` when the replica serves the job (it leads), else the gRPC status name."""
    try:
        client.get_job(job, timeout=2.0)
    except grpc.RpcError as exc:
        return str(exc.code().name)
    return "ok"


def _handover(old: CoordinatorClient, new: CoordinatorClient, job: str) -> list[str]:
    """Both replicas asked in turn until the new one serves, then the old one for as long
    again (at least 3 s): the old one's answers from the new one's first "ok" on."""
    start, first_new = time.monotonic(), 0.0
    after: list[str] = []
    while True:
        got = _answer(old, job)
        if first_new:
            after.append(got)
            if time.monotonic() - first_new > max(3.0, first_new - start):
                return after
        elif _answer(new, job) == "ok":
            first_new = time.monotonic()
        assert time.monotonic() - start < 60, "the replica never took over"
        time.sleep(0.1)


@pytest.mark.parametrize("cut", ["down", "egress-drop"])
def test_a_leader_cut_off_mid_job_hands_over_without_splicing_anyone(
    ha_lab, checkpoint, cut: str
) -> None:
    state, size = ha_lab, checkpoint["manifest"].total_size
    old, new = _client(state, 0), _client(state, 1)
    try:
        assert _answer(new, "none") == "UNAVAILABLE"  # replica 1 follows: 0 leads
        job = start_job(old, checkpoint, HOSTS, origin_cap_bytes_per_s=1 * MiB)
        _wait("bytes flowing", 60, lambda: job_to_dict(old.get_job(job))["bytes_moved"] >= size)
        replica_link(state, LEADER, cut)
        try:
            # never two leaders: once the replica serves, the cut leader serves nothing (its
            # renewal hangs on the cut store; its lease ran out by its own clock first)
            after = _handover(old, new, job)
            assert "ok" not in after, after
            before = job_to_dict(new.get_job(job))
            assert before["hosts_ready"] < HOSTS  # the takeover lands mid-job
            st = _wait("every host settled", 120, lambda: settled(new, job))
        finally:
            replica_link(state, LEADER, "up")
        time.sleep(2.0)  # its link back: it stays a follower, serves nothing
        assert _answer(old, job) == "UNAVAILABLE"
    finally:
        old.close()
        new.close()
    lab = _LabCluster(state)
    for h in st["hosts"]:
        assert h["state"] == "READY", h  # nobody DEAD, REMOVED or QUARANTINED
        assert not [e for e in h["errors"] if "spliced out" in e], h
        assert_placed(lab, checkpoint, h["host_id"])  # type: ignore[arg-type]
    _check_logs(Path(state["state_dir"]) / "logs")


def _check_logs(logs: Path) -> None:
    """The cut leader stepped down; the new one took a later epoch; no agent applied an
    assignment of the old epoch after the new one (a deposed leader's push is dropped)."""
    old = (logs / f"{LEADER}.log").read_text()
    assert "stepping down" in old
    epochs = [
        int(e) for e in re.findall(r"leads \(epoch (\d+)", (logs / f"{REPLICA}.log").read_text())
    ]
    first = [int(e) for e in re.findall(r"leads \(epoch (\d+)", old)]
    assert epochs and first and min(epochs) > max(first)
