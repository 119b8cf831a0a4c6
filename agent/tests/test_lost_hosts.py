"""A job with lost hosts ends (real processes): one lost host is evicted by an operator
through the CLI, another is removed by the coordinator after ``--remove-dead-after``; the
job is DONE with the rest READY and names both with their reasons."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import pytest
from agent_harness import Cluster, assert_placed, job_spec

from relgate_agent.cli import EXIT_OK, main

HOSTS = [("h00", "r0"), ("h01", "r1"), ("h02", "r0"), ("h03", "r1")]
MiB = 1 << 20


def test_lost_hosts_are_evicted_or_removed_and_the_job_is_done(
    tmp_path: Path, checkpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--report-interval", "0.5", "--dead-after", "2", "--remove-dead-after", "3"]
    cluster = Cluster(tmp_path / "c", checkpoint["trusted"], args)
    try:
        cluster.start_coordinator()
        for h, r in HOSTS:
            cluster.start_agent(h, r, wait=False)
        cluster.wait_started()
        c = cluster.client()
        try:
            job = c.create_job(**job_spec(checkpoint, origin_cap_bytes_per_s=4 * MiB)).job_id
        finally:
            c.close()
        cluster.wait_for(
            lambda: cluster.status(job)["bytes_moved"] > 0, 60, "the transfer under way"
        )
        cluster.kill("h02", signal.SIGKILL)  # lost for good: the operator evicts it
        cluster.kill("h03", signal.SIGKILL)  # lost for good: nobody does anything
        base = ["--json", "--coordinator", cluster.coordinator, "--pki", str(cluster.pki)]
        capsys.readouterr()
        rc = main(["job", "evict", job, "h02", "--reason", "lost in rack r0", *base])
        assert rc == EXIT_OK
        assert json.loads(capsys.readouterr().out)["removed"] is True
        st = cluster.wait_for(
            lambda: (s := cluster.status(job))["state"] == "DONE" and s, 90, "DONE without them"
        )
        assert sorted(st["ready_hosts"]) == ["h00", "h01"]
        for h in ("h00", "h01"):
            assert_placed(cluster, checkpoint, h)
        removed = {r["host_id"]: r["reason"] for r in st["removed_hosts"]}
        assert removed["h02"] == "evicted by operator:operator: lost in rack r0"
        assert removed["h03"].startswith("dead since ") and "removed after 3s" in removed["h03"]
        assert st["stragglers"] == [] and st["eta_s"] == 0
    finally:
        cluster.stop_all()
