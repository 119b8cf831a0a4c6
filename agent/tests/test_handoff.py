"""The deployer handoff through the outbox: a real webhook on loopback that fails first, real
SQLite (and PostgreSQL), the coordinator restarted on the same store."""

from __future__ import annotations

import signal
import socket
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from agent_harness import HOSTS as CLUSTER_HOSTS
from agent_harness import Cluster, Webhook, job_spec
from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import TrustedKeys

from relgate_agent.contracts import ProgressReport
from relgate_agent.coordinator.outbox import IDEMPOTENCY_HEADER
from relgate_agent.coordinator.service import Coordinator, CoordinatorConfig
from relgate_agent.staging.storage import bitmap_from_bits

HOSTS = {f"h{i}": f"r{i % 2}" for i in range(5)}
KEY = IDEMPOTENCY_HEADER.lower()


def _coordinator(db: str, checkpoint: dict[str, Any]) -> Coordinator:
    c = Coordinator(
        CoordinatorConfig(
            db=db,
            trusted_keys=TrustedKeys.load(checkpoint["trusted"]),
            webhook_backoff_s=0.02,
            webhook_backoff_max_s=0.2,
        )
    )
    for h, r in HOSTS.items():
        c.enroll(h, r, {"cluster": "hand"})
        c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
    return c


def _create(c: Coordinator, checkpoint: dict[str, Any], url: str, job_id: str) -> str:
    spec = JobSpec(
        model="claude-x",
        version="2026-10-12.3",
        manifest_uri=str(checkpoint["envelope"]),
        target_selector="cluster=hand",
        stripes=2,
        ready_threshold_ppm=600_000,  # 3 of 5
        webhook_url=url,
        job_id=job_id,
    )
    return c.create_job(spec).job_id


def _ready(c: Coordinator, job_id: str, hosts: list[str], checkpoint: dict[str, Any]) -> None:
    m = checkpoint["manifest"]
    full = bitmap_from_bits(bytearray([1]) * m.num_chunks)
    for h in hosts:
        report = ProgressReport(have=full, ready=True, placed_manifest_digest=m.digest)
        c.report_progress(job_id, h, report)


def _until(c: Coordinator, cond: Callable[[], bool], what: str) -> None:
    end = time.monotonic() + 30
    while not cond():
        assert time.monotonic() < end, f"timed out waiting for {what}"
        c.tick()
        time.sleep(0.02)


def _acknowledged(c: Coordinator, job_id: str, hook: Webhook, events: int) -> bool:
    """``events`` accepted by the webhook and none left pending in the coordinator's store."""
    return len(hook.events) == events and c.job_status(job_id).pending_events == 0


def test_events_retried_until_acknowledged_once_with_stable_ids(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    hook = Webhook(fail_first=3)
    c = _coordinator(str(tmp_path / "c.sqlite"), checkpoint)
    try:
        job = _create(c, checkpoint, hook.url, "dj_hand")
        _ready(c, job, ["h0", "h1", "h2"], checkpoint)
        c.tick()
        assert c.job_status(job).state == "COMPLETE"
        # the webhook records a POST before its answer reaches the sender, which marks the
        # event delivered after: wait for the store, not for the webhook alone
        _until(c, lambda: _acknowledged(c, job, hook, 1), "the DistributionComplete acknowledged")
        (complete,) = hook.events
        assert complete["type"] == "DistributionComplete"
        assert complete["readyHosts"] == ["h0", "h1", "h2"] and complete["hostsTotal"] == 5
        # three 503s, then the 2xx: four POSTs of one event, one id in header and body
        assert len(hook.requests) == 4
        assert {r[0][KEY] for r in hook.requests} == {complete["eventId"]}
        assert all(r[1] == complete for r in hook.requests)
        report = c.job_status(job)
        assert report.completion_emitted and report.pending_events == 0
        for _ in range(5):  # acknowledged: never sent again
            c.tick()
        # the hosts READY after the handoff are announced, once
        _ready(c, job, ["h3", "h4"], checkpoint)
        _until(c, lambda: _acknowledged(c, job, hook, 2), "the HostsReady acknowledged")
        late = hook.events[1]
        assert late["type"] == "HostsReady" and late["readyHosts"] == ["h3", "h4"]
        assert (late["hostsReady"], late["hostsTotal"]) == (5, 5)
        assert late["eventId"] != complete["eventId"]
        assert hook.requests[-1][0][KEY] == late["eventId"]
        for _ in range(5):
            c.tick()
        assert len(hook.requests) == 5 and len(hook.events) == 2
        report = c.job_status(job)
        assert report.state == "DONE" and report.pending_events == 0
    finally:
        c.close()
        hook.close()


def restart_resumes_delivery(db: str, checkpoint: dict[str, Any], job_id: str) -> None:
    """The webhook is down while the first coordinator runs; the next one on the same store
    delivers what it left, under the same event id, and never enqueues it twice."""
    hook = Webhook(fail_first=10**9)
    first = _coordinator(db, checkpoint)
    try:
        job = _create(first, checkpoint, hook.url, job_id)
        _ready(first, job, ["h0", "h1", "h2"], checkpoint)
        _until(first, lambda: len(hook.requests) >= 2, "a few failed POSTs")
        report = first.job_status(job)
        assert not report.completion_emitted and report.pending_events == 1
        first.close()
        tried = {r[0][KEY] for r in hook.requests}
        hook.fail_first = 0  # the deployer is back
        second = _coordinator(db, checkpoint)
        try:
            _until(second, lambda: bool(hook.events), "delivery by the restarted coordinator")
            _ready(second, job, ["h3", "h4"], checkpoint)
            _until(
                second,
                lambda: (
                    second.job_status(job).state == "DONE" and _acknowledged(second, job, hook, 2)
                ),
                "DONE and both events acknowledged",
            )
            assert [e["type"] for e in hook.events] == ["DistributionComplete", "HostsReady"]
            assert {hook.events[0]["eventId"]} == tried
            assert hook.events[0]["readyHosts"] == ["h0", "h1", "h2"]
            assert hook.events[1]["readyHosts"] == ["h3", "h4"]
            report = second.job_status(job)
            assert report.completion_emitted and report.pending_events == 0
        finally:
            second.close()
    finally:
        hook.close()


def test_delivery_resumes_after_a_restart_on_sqlite(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    restart_resumes_delivery(str(tmp_path / "c.sqlite"), checkpoint, "dj_restart")


@pytest.mark.postgres
def test_delivery_resumes_after_a_restart_on_postgres(
    pg_dsn: str, checkpoint: dict[str, Any]
) -> None:
    restart_resumes_delivery(pg_dsn, checkpoint, "dj_restart_pg")


def test_no_webhook_is_delivered_at_once(tmp_path: Path, checkpoint: dict[str, Any]) -> None:
    c = _coordinator(str(tmp_path / "c.sqlite"), checkpoint)
    try:
        job = _create(c, checkpoint, "", "dj_nohook")
        _ready(c, job, list(HOSTS), checkpoint)
        c.tick()
        report = c.job_status(job)
        assert report.state == "DONE" and report.completion_emitted and report.pending_events == 0
    finally:
        c.close()


def test_a_killed_coordinator_process_delivers_after_restart(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    """Real processes: the job ends while the deployer answers 503; the coordinator is killed
    (SIGKILL) and restarted on the same SQLite; it delivers each event once, same ids."""
    # a deployer that verifies: the coordinator's signature and every host's attestation
    hook = Webhook(fail_first=10**9, ca=tmp_path / "cluster" / "pki" / "ca.pem")
    cluster = Cluster(tmp_path / "cluster", checkpoint["trusted"], ["--report-interval", "0.5"])
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        cluster.start_coordinator(f"127.0.0.1:{port}")
        for h, r in CLUSTER_HOSTS[:3]:
            cluster.start_agent(h, r)
        cluster.wait_started()
        cluster.wait_registered(3)
        c = cluster.client()
        try:
            job = c.create_job(**job_spec(checkpoint, stripes=2, webhook_url=hook.url)).job_id
        finally:
            c.close()
        st = cluster.wait_for(
            lambda: (r := cluster.status(job))["state"] == "DONE" and len(hook.requests) >= 2 and r,
            120,
            "DONE with the deployer refusing",
        )
        assert not st["completion_emitted"] and st["pending_events"] >= 1
        cluster.kill("coordinator", signal.SIGKILL)
        tried = {r[0][KEY] for r in hook.requests}
        hook.fail_first = 0  # the deployer is back
        cluster.start_coordinator(f"127.0.0.1:{port}")
        st = cluster.wait_for(
            lambda: (r := cluster.status(job))["pending_events"] == 0 and r, 90, "delivery"
        )
        assert st["completion_emitted"] and st["state"] == "DONE"
        (complete,) = [e for e in hook.events if e["type"] == "DistributionComplete"]
        assert complete["eventId"] in tried and sorted(complete["readyHosts"]) == sorted(
            h for h, _ in CLUSTER_HOSTS[:3]
        )
        ids = [e["eventId"] for e in hook.events]
        assert len(ids) == len(set(ids))  # each event acknowledged once
        assert hook.refused == [] and set(complete["attestations"]) == set(complete["readyHosts"])
    finally:
        cluster.stop_all()
        hook.close()
