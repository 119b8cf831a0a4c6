"""Hosts route around a dead or tx-slow upstream on their own (agent/bypass.py), in the
network-namespace lab (real NIC caps, one direction where the fault is one-way), with the
coordinator frozen (SIGSTOP): no leader judges anything and no FindPeers answers, and the
fleet still finishes; a fault-free fleet bypasses nobody. The opt-in slow-hop rules
(``--bypass-slow``) are tested by test_bypass.py alone: their lab test (a host whose upload
alone was capped at 15 %) passed alone but failed 1 run in 4 beside other lab tests, a
child of the capped host finishing without a verdict, and a test that fails by chance is
worse than none."""

from __future__ import annotations

import os
import re
import signal
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from agent_harness import assert_placed, create_lab_job, journaled_chunks, running_lab
from relgate_lab.netns import LabSpec

from relgate_agent.client import CoordinatorClient
from relgate_agent.pki import TlsFiles

pytestmark = pytest.mark.lab

MiB = 1 << 20
BYPASS_LINE = re.compile(r"(h\d\d) bypasses (h\d\d): stripe (\d+): (?:upstream \S+ )?(.*)")


class _Placed:
    """assert_placed()'s view of the lab: each host's models root."""

    def __init__(self, state: dict[str, Any]) -> None:
        self.state = state

    def models_root(self, host: str) -> Path:
        return Path(self.state["hosts"][host]["models_root"])


@contextmanager
def _lab(tmp_path: Path, checkpoint: dict[str, Any], **spec: Any) -> Iterator[dict[str, Any]]:
    with running_lab(
        LabSpec(
            state_dir=tmp_path / "lab",
            trusted_keys=[str(checkpoint["trusted"])],
            journal_interval_s=0.3,
            report_interval_s=0.5,
            **spec,
        )
    ) as state:
        yield state


def _frozen_once_moving(state: dict[str, Any], checkpoint: dict[str, Any], stripes: int) -> str:
    """A job to every lab host; once each verified a chunk the coordinator is SIGSTOPped
    (SIGCONT comes with the lab's teardown: :func:`_thawed`)."""
    hosts = len(state["hosts"])
    client = CoordinatorClient(
        state["coordinator_unix"], TlsFiles.from_pki(state["pki"], "operator")
    )
    try:
        job = create_lab_job(
            client, checkpoint, hosts, stripes=stripes, origin_cap_bytes_per_s=4 * MiB
        )
    finally:
        client.close()
    m = checkpoint["manifest"]
    deadline = time.monotonic() + 60
    while not all(_journaled(state, h, m) >= 1 for h in state["hosts"]):
        assert time.monotonic() < deadline, "the hosts never got under way"
        time.sleep(0.1)
    os.kill(state["pids"]["coordinator"], signal.SIGSTOP)
    return job


@contextmanager
def _thawed(state: dict[str, Any]) -> Iterator[None]:
    try:
        yield
    finally:
        os.kill(state["pids"]["coordinator"], signal.SIGCONT)


def _journaled(state: dict[str, Any], host: str, m: Any) -> int:
    return journaled_chunks(_Placed(state).models_root(host), m)


def _placed_while_frozen(
    state: dict[str, Any], checkpoint: dict[str, Any], hosts: list[str]
) -> None:
    m = checkpoint["manifest"]

    def placed(h: str) -> bool:
        return (_Placed(state).models_root(h) / m.model / m.version).is_dir()

    assert not any(placed(h) for h in hosts), "frozen too late: a host was done"
    deadline = time.monotonic() + 120
    while not all(placed(h) for h in hosts):
        assert time.monotonic() < deadline, f"not all of {hosts} placed with the leader frozen"
        time.sleep(0.2)
    for h in hosts:
        assert_placed(_Placed(state), checkpoint, h)  # type: ignore[arg-type]


def _bypasses(state: dict[str, Any]) -> list[tuple[str, str, int, str]]:
    """(host, bypassed upstream, stripe, why) from every agent's log."""
    out = []
    for h in state["hosts"]:
        log = Path(state["state_dir"]) / "logs" / f"{h}.log"
        text = log.read_text(errors="replace") if log.exists() else ""
        out += [(g[0], g[1], int(g[2]), g[3]) for g in BYPASS_LINE.findall(text)]
    return sorted(out)


def test_a_dead_upstream_is_bypassed_while_the_leader_is_frozen(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    """One rack of four, k = 2: stripe 0 runs h00 > h01 > h02 > h03, stripe 1 h01 > h02 >
    h03 > h00 (a host that registered late hangs at the tails instead). h02 is SIGKILLed
    after the coordinator was frozen: its downstreams pull from their bypass peers and
    every survivor is placed."""
    with _lab(tmp_path, checkpoint, hosts=4, racks=1, nic_bytes_per_s=2 * MiB) as state:
        _frozen_once_moving(state, checkpoint, stripes=2)
        with _thawed(state):
            os.kill(state["pids"]["h02"], signal.SIGKILL)
            _placed_while_frozen(state, checkpoint, ["h00", "h01", "h03"])
            seen = _bypasses(state)
    # h02's downstreams, whichever the topology made them by then (a host that registered
    # a moment late hangs at the tail), and only they, bypassed it: nobody else
    assert seen, "nobody bypassed the killed host"
    assert {up for _, up, _, _ in seen} == {"h02"}, seen
    assert {h for h, *_ in seen} <= {"h00", "h01", "h03"}, seen
    assert all(why.startswith("failed") for *_, why in seen), seen


# six hosts in three racks (h00 r0, h01 r1, h02 r2, h03 r0, ...), k = 4
SIX = {"hosts": 6, "racks": 3, "nic_bytes_per_s": 4 * MiB}


def test_a_fault_free_fleet_bypasses_nobody(tmp_path: Path, checkpoint: dict[str, Any]) -> None:
    """With the defaults (dead upstreams only; the slow-hop rules are opt-in because bench
    chaos's CPU-bound fault-free run saw them bypass healthy hosts, see docs)."""
    with _lab(tmp_path, checkpoint, **SIX) as state:
        _frozen_once_moving(state, checkpoint, stripes=4)
        with _thawed(state):
            _placed_while_frozen(state, checkpoint, [f"h{i:02d}" for i in range(6)])
            seen = _bypasses(state)
    assert seen == []
