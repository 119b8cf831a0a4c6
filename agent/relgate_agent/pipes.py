"""Pipes: run a distribution job under Dagster Pipes (dagster-pipes only; never dagster itself).

The main package launches ``relgate-agent pipes`` with a ``PipesSubprocessClient`` and these
extras:

    {
      "job": {"model", "version", "manifest_uri", "origin_uri"?, "target_selector"?,
              "priority"?, "origin_cap_bytes_per_s"?, "ready_threshold"? (0..1),
              "deadline_s"?, "stripes"?, "webhook_url"?, "job_id"?},
      "pki": "DIR",                           # fleet PKI (ca.pem, operator.*, coordinator.*);
                                              # default $RELGATE_AGENT_PKI
      "coordinator": "host:port"              # use a running coordinator, or
      "serve": {"listen", "db", "trusted_keys": [..], "stripes"?, "dead_after_s"?,
                "min_hosts"?: wait for this many agents before CreateJob,
                "enroll"?: [{"host_id", "rack", "labels": {..} | "k=v,.."}]},
                                              # run one in this process for the job's life
      "poll_interval_s"?: 1.0,
      "timeout_s"?: 3600,
      "wait_for_all"?: false                  # after the handoff, keep going until every host is READY
    }

The extras are parsed once into a :class:`relgate_trust.job_request.JobRequest`. It logs progress, reports
the ready threshold as the asset check ``ready_threshold`` and the ready hosts as
materialization metadata (data version = manifest digest).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from relgate_trust.job_request import JobRequest, ServeSpec
from relgate_trust.manifest import TrustedKeys

from relgate_agent.client import CoordinatorClient, job_from_pb
from relgate_agent.contracts import JobReport
from relgate_agent.coordinator.jobstate import CoordinatorConfig, parse_selector, selector_matches
from relgate_agent.coordinator.server import CoordinatorServer
from relgate_agent.errors import AgentError
from relgate_agent.pki import TlsFiles
from relgate_agent.ready_curve import ReadyCurve

CHECK_NAME = "ready_threshold"
DONE_STATES = ("DONE", "CANCELLED", "FAILED")

Log = Callable[[str], None]
#: Sees every job status polled while waiting (e.g. progress bars).
Watch = Callable[[JobReport], None]


def _serve(request: JobRequest, serve: ServeSpec) -> CoordinatorServer:
    server = CoordinatorServer(
        CoordinatorConfig(
            db=serve.db,
            trusted_keys=TrustedKeys.load(list(serve.trusted_keys)),
            default_stripes=serve.stripes,
            dead_after_s=serve.dead_after_s,
        ),
        serve.listen,
        tls=TlsFiles.from_pki(request.pki, "coordinator"),
    ).start()
    for h in serve.enroll:
        server.coordinator.enroll(h.host_id, h.rack, dict(h.labels))
    return server


def _wait_for_fleet(server: CoordinatorServer, request: JobRequest, serve: ServeSpec) -> None:
    """Agents find a freshly started coordinator by retrying; wait until the fleet we expect
    has checked in, so the target selector resolves to all of it."""
    selector = parse_selector(request.job.target_selector)

    def matching() -> int:  # only agents the job's selector targets count
        return sum(
            selector_matches(selector, rack, labels)
            for _h, rack, labels, _a in server.coordinator.store.hosts()
        )

    wait_until = time.monotonic() + serve.min_hosts_wait_s
    while matching() < serve.min_hosts:
        if time.monotonic() > wait_until:
            raise AgentError(
                f"only {matching()} of {serve.min_hosts} agents matching "
                f"{request.job.target_selector!r} checked in with the coordinator "
                f"at {server.address} within {serve.min_hosts_wait_s:g} s"
            )
        time.sleep(0.2)


def _until_handed_off(
    client: CoordinatorClient,
    job_id: str,
    request: JobRequest,
    log: Log,
    watch: Watch | None = None,
) -> JobReport:
    """Poll GetJob until the job ends or (unless ``wait_for_all``) the handoff happened;
    ``watch`` sees every status polled (a progress display)."""
    deadline = time.monotonic() + request.timeout_s
    last = ""
    while True:
        status = job_from_pb(client.get_job(job_id))
        if watch is not None:
            watch(status)
        line = (
            f"job {job_id} {status.state}: {status.hosts_ready}/{status.hosts_total} ready, "
            f"{status.bytes_moved} bytes moved, {status.origin_bytes} origin bytes"
            + (f", eta {status.eta_s}s" if status.eta_s >= 0 else "")
        )
        if line != last:
            log(line)
            last = line
        done = status.state in DONE_STATES
        if done or (status.completion_emitted and not request.wait_for_all):
            return status
        if time.monotonic() > deadline:
            raise AgentError(
                f"job {job_id} timed out in state {status.state} with "
                f"{status.hosts_ready}/{status.hosts_total} hosts ready "
                "(stragglers: "
                + (
                    "; ".join(f"{r.host_id}: {r.reason}" for r in status.straggler_reasons[:8])
                    or "none"
                )
                + ")"
            )
        time.sleep(request.poll_interval_s)


def distribute(request: JobRequest, log: Log = print, watch: Watch | None = None) -> JobReport:
    """Create the job (on an in-process coordinator if asked), wait for the handoff."""
    server = _serve(request, request.serve) if request.serve is not None else None
    if server is not None:
        log(f"coordinator serving on {server.address}")
    address = server.address if server is not None else request.coordinator
    client = CoordinatorClient(address, TlsFiles.from_pki(request.pki, "operator"))
    try:
        if server is not None and request.serve is not None:
            _wait_for_fleet(server, request, request.serve)
        resp = client.create(request.job)
        log(
            f"job {resp.job_id}: {request.job.model}/{request.job.version} "
            f"to {resp.hosts_total} hosts"
        )
        return _until_handed_off(client, resp.job_id, request, log, watch)
    finally:
        client.close()
        if server is not None:
            server.stop()


def threshold_met(status: JobReport, threshold: float) -> bool:
    return status.hosts_total > 0 and status.hosts_ready >= threshold * status.hosts_total


def run_distribution_job(
    request: JobRequest, log: Log = print, watch: Watch | None = None
) -> dict[str, Any]:
    """The typed request in, GetJob's snake_case status out (plus ``ready_threshold`` and
    ``threshold_met``): the JSON the core's ``distribute`` records and prints."""
    status = distribute(request, log, watch)
    out = status.to_dict()
    out["ready_threshold"] = request.ready_threshold
    out["threshold_met"] = threshold_met(status, request.ready_threshold)
    return out


def run_pipes() -> int:
    from dagster_pipes import open_dagster_pipes  # noqa: PLC0415 - only the pipes command needs it

    with open_dagster_pipes() as pipes:
        request = JobRequest.from_extras(pipes.extras)
        curve = ReadyCurve()
        status = distribute(request, log=pipes.log.info, watch=curve.watch)
        met = threshold_met(status, request.ready_threshold)
        metadata: dict[str, Any] = {
            "jobId": status.job_id,
            "manifestDigest": status.manifest_digest,
            "hostsTotal": status.hosts_total,
            "hostsReady": status.hosts_ready,
            "readyHosts": {"raw_value": list(status.ready_hosts), "type": "json"},
            "stragglers": {"raw_value": list(status.stragglers), "type": "json"},
            # each with why: stragglers (slow, dead since) and targets removed (evicted...)
            "stragglerReasons": {
                "raw_value": [r.to_json() for r in status.straggler_reasons],
                "type": "json",
            },
            "removedHosts": {
                "raw_value": [r.to_json() for r in status.removed_hosts],
                "type": "json",
            },
            "bytesMoved": status.bytes_moved,
            "originBytes": status.origin_bytes,
            "checkpointBytes": status.checkpoint_bytes,
            # hosts READY over time: a text plot the UI shows, and the samples
            "hostsReadyPlot": {"raw_value": f"```\n{curve.text_plot()}\n```", "type": "md"},
            "hostsReadyOverTime": {"raw_value": curve.to_json(), "type": "json"},
        }
        asset_key = pipes.asset_keys[0] if pipes.is_asset_step and pipes.asset_keys else None
        pipes.report_asset_check(
            check_name=CHECK_NAME,
            passed=met,
            severity="ERROR",
            metadata={
                "readyFraction": status.hosts_ready / max(status.hosts_total, 1),
                "readyThreshold": request.ready_threshold,
                "hostsReady": status.hosts_ready,
                "hostsTotal": status.hosts_total,
            },
            asset_key=asset_key,
        )
        pipes.report_asset_materialization(
            metadata=metadata, data_version=status.manifest_digest, asset_key=asset_key
        )
    return 0
