"""A job with lost hosts ends (real processes): one lost host is evicted by an operator
through the CLI, another is removed by the coordinator after ``--remove-dead-after``; the
job is DONE with the rest READY and names both with their reasons and when, in GetJob and in
the DistributionComplete the deployer's verifying webhook accepted, signed by the
coordinator: ``verify-handoff`` prints them, and an event that drops one is refused."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest
from agent_harness import Cluster, Webhook, assert_placed, job_spec

from relgate_agent.cli import EXIT_OK, EXIT_REJECTED, main

HOSTS = [("h00", "r0"), ("h01", "r1"), ("h02", "r0"), ("h03", "r1")]
MiB = 1 << 20


def test_lost_hosts_are_evicted_or_removed_and_the_job_is_done(
    tmp_path: Path, checkpoint, capsys: pytest.CaptureFixture[str]
) -> None:
    args = ["--report-interval", "0.5", "--dead-after", "2", "--remove-dead-after", "3"]
    cluster = Cluster(tmp_path / "c", checkpoint["trusted"], args)
    hook = Webhook(ca=cluster.pki / "ca.pem")  # a deployer that verifies what it is sent
    started = int(time.time())
    try:
        cluster.start_coordinator()
        for h, r in HOSTS:
            cluster.start_agent(h, r, wait=False)
        cluster.wait_started()
        spec = job_spec(checkpoint, origin_cap_bytes_per_s=4 * MiB, webhook_url=hook.url)
        c = cluster.client()
        try:
            job = c.create_job(**spec).job_id
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
        assert all(started <= r["removed_at"] <= time.time() for r in st["removed_hosts"])
        assert st["stragglers"] == [] and st["eta_s"] == 0
        _the_deployer_sees_them(tmp_path, cluster, hook, st, capsys)
        # the operator's `job get` says the same as the signed event
        assert main(["job", "get", job, *base]) == EXIT_OK
        shown = json.loads(capsys.readouterr().out)["removedHosts"]
        assert (
            shown
            == next(e for e in hook.events if e["type"] == "DistributionComplete")["removedHosts"]
        )
    finally:
        cluster.stop_all()
        hook.close()


def _the_deployer_sees_them(
    tmp_path: Path,
    cluster: Cluster,
    hook: Webhook,
    st: dict[str, Any],
    capsys: pytest.CaptureFixture[str],
) -> None:
    """The DistributionComplete names the removed hosts as GetJob does, under the
    coordinator's signature: verify-handoff prints them; dropping one breaks the signature."""
    assert hook.refused == []
    (event,) = [e for e in hook.events if e["type"] == "DistributionComplete"]
    got = [(r["hostId"], r["reason"], r["removedAt"]) for r in event["removedHosts"]]
    want = [(r["host_id"], r["reason"], r["removed_at"]) for r in st["removed_hosts"]]
    assert got == want and [h for h, *_ in got] == ["h02", "h03"]
    assert sorted(event["readyHosts"]) == ["h00", "h01"]
    ca = str(cluster.pki / "ca.pem")
    received = tmp_path / "event.json"
    received.write_text(json.dumps(event))
    capsys.readouterr()
    assert main(["verify-handoff", "--json", str(received), "--ca", ca]) == EXIT_OK
    out = json.loads(capsys.readouterr().out)
    assert out["verified"] is True and out["hostsAttested"] == 2
    assert out["removedHosts"] == event["removedHosts"]
    # a forger who hides a lost host from the deployer (and keeps the signature)
    forged = {**event, "removedHosts": event["removedHosts"][:1]}
    received.write_text(json.dumps(forged))
    assert main(["verify-handoff", "--json", str(received), "--ca", ca]) == EXIT_REJECTED
    refusal = json.loads(capsys.readouterr().out)
    assert refusal["check"] == "handoff-signature", refusal
