"""The coordinator under Dagster Pipes, driven exactly as PipesSubprocessClient would (env params)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

from agent_harness import HOSTS, Cluster, assert_placed
from dagster_pipes import encode_param


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _pipes_cluster(tmp_path: Path, trusted: Path, hosts: list[tuple[str, str]]) -> Cluster:
    """A cluster whose coordinator the Pipes process starts (and enrolls the fleet for)."""
    port = _free_port()
    cluster = Cluster(tmp_path / "c", trusted)
    cluster.coordinator = f"127.0.0.1:{port}"
    cluster.enroll = False  # the Pipes process enrolls the fleet itself (extras.serve.enroll)
    cluster.enrolled.update({h: (r, "cluster=inf-a") for h, r in hosts})
    return cluster


def _pipes_context(
    tmp_path: Path, checkpoint: dict[str, Any], cluster: Cluster, hosts: list[tuple[str, str]]
) -> dict[str, Any]:
    """The Pipes context document: serve the coordinator, run one job, wait for all hosts."""
    pki = cluster.pki
    return {
        "asset_keys": ["checkpoint_distribution"],
        "code_version_by_asset_key": None,
        "provenance_by_asset_key": None,
        "partition_key": None,
        "partition_key_range": None,
        "partition_time_window": None,
        "run_id": "run-1",
        "job_name": "distribute",
        "retry_number": 0,
        "extras": {
            "pki": str(pki),
            "serve": {
                "enroll": [
                    {"host_id": h, "rack": r, "labels": {"cluster": "inf-a"}} for h, r in hosts
                ],
                "listen": cluster.coordinator,
                "db": str(tmp_path / "coord.sqlite"),
                "trusted_keys": [str(checkpoint["trusted"])],
                "min_hosts": len(hosts),
            },
            "job": {
                "model": "claude-x",
                "version": "2026-10-12.3",
                "manifest_uri": str(checkpoint["envelope"]),
                "origin_uri": str(checkpoint["origin"]),
                "target_selector": "cluster=inf-a",
                "ready_threshold": 1.0,
                "stripes": 2,
            },
            "poll_interval_s": 0.3,
            "timeout_s": 120,
            "wait_for_all": True,
        },
    }


def _run_pipes(
    tmp_path: Path, cluster: Cluster, hosts: list[tuple[str, str]], ctx: Path, msgs: Path
) -> None:
    """Run ``relgate_agent pipes`` with the agents up; it must exit 0."""
    env = {
        **os.environ,
        "DAGSTER_PIPES_CONTEXT": encode_param({"path": str(ctx)}),
        "DAGSTER_PIPES_MESSAGES": encode_param({"path": str(msgs)}),
    }
    with open(tmp_path / "pipes.log", "w") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", "relgate_agent", "pipes"], env=env, stdout=log, stderr=log
        )
    try:
        for h, r in hosts:
            cluster.start_agent(h, r)
        assert proc.wait(180) == 0, (tmp_path / "pipes.log").read_text()[-3000:]
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        cluster.stop_all()


def test_pipes_entry_reports_check_and_ready_hosts(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    hosts = HOSTS[:4]
    cluster = _pipes_cluster(tmp_path, checkpoint["trusted"], hosts)
    ctx = tmp_path / "context.json"
    msgs = tmp_path / "messages.jsonl"
    ctx.write_text(json.dumps(_pipes_context(tmp_path, checkpoint, cluster, hosts)))
    (tmp_path / "c" / "logs").mkdir(parents=True)
    _run_pipes(tmp_path, cluster, hosts, ctx, msgs)
    for h, _ in hosts:
        assert_placed(cluster, checkpoint, h)
    messages = [json.loads(line) for line in msgs.read_text().splitlines() if line.strip()]
    methods = [m["method"] for m in messages]
    assert methods[0] == "opened" and methods[-1] == "closed"
    logs = [m["params"]["message"] for m in messages if m["method"] == "log"]
    assert any("4/4 ready" in line for line in logs)
    (check,) = [m["params"] for m in messages if m["method"] == "report_asset_check"]
    assert check["check_name"] == "ready_threshold" and check["passed"] is True
    (mat,) = [m["params"] for m in messages if m["method"] == "report_asset_materialization"]
    assert mat["data_version"] == checkpoint["manifest"].digest
    assert sorted(mat["metadata"]["readyHosts"]["raw_value"]) == sorted(h for h, _ in hosts)
