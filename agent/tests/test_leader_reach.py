"""Agents say when no coordinator leader answers them: the first failure, then at most every
10 s while it lasts (rate-limited), and the recovery."""

from __future__ import annotations

import logging
import socket
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_harness import Cluster

from relgate_agent.agent.host import UNREACHABLE_LOG_S, LeaderReach


class _Unavailable(grpc.RpcError):
    def code(self) -> grpc.StatusCode:
        return grpc.StatusCode.UNAVAILABLE

    def details(self) -> str:
        return "connection refused"


def test_unreachable_leader_is_logged_rate_limited(caplog: pytest.LogCaptureFixture) -> None:
    reach = LeaderReach()
    exc = _Unavailable()
    with caplog.at_level(logging.WARNING, logger="relgate_agent.agent.host"):
        logged = [reach.failed(exc, now=100.0 + 0.5 * i) for i in range(41)]  # 20 s of retries
        assert logged.count(True) == 3  # at 0, 10 and 20 s
        assert [i for i, x in enumerate(logged) if x] == [0, 20, 40]
        reach.ok(now=121.0)
        reach.ok(now=122.0)  # already reachable: nothing more to say
    lines = [r.getMessage() for r in caplog.records]
    assert lines[0].startswith("cannot reach a coordinator leader for 0s (1 attempts): UNAVAILABLE")
    assert lines[2].startswith("cannot reach a coordinator leader for 20s (41 attempts)")
    assert lines[3] == "coordinator leader reachable again after 21s (41 failed attempts)"
    assert len(lines) == 4 and UNREACHABLE_LOG_S == 10.0


def test_a_real_agent_without_a_coordinator_says_so(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    cluster = Cluster(tmp_path / "cluster", checkpoint["trusted"], enroll=False)
    cluster.coordinator = f"127.0.0.1:{port}"
    (cluster.base / "logs").mkdir(parents=True)
    try:
        cluster.start_agent("h00", "r0")
        log = cluster.base / "logs" / "h00.log"
        cluster.wait_for(
            lambda: "cannot reach a coordinator leader" in log.read_text(), 30, "the warning"
        )
    finally:
        cluster.stop_all()
