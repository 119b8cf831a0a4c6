"""Run a distribution job under Dagster Pipes (dagster-pipes only; never dagster itself).

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

It logs progress, reports the ready threshold as the asset check ``ready_threshold`` and
the ready hosts as materialization metadata (data version = manifest digest).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping
from typing import Any

from relgate_agent.client import CoordinatorClient, job_to_dict
from relgate_agent.errors import AgentError

CHECK_NAME = "ready_threshold"


def run_distribution_job(
    extras: Mapping[str, Any], log: Callable[[str], None] = print
) -> dict[str, Any]:
    """Create a job (optionally on an in-process coordinator), wait for the handoff, return status."""
    job_spec = dict(extras.get("job") or {})
    if not job_spec.get("model") or not job_spec.get("version") or not job_spec.get("manifest_uri"):
        raise AgentError("extras.job needs model, version and manifest_uri")
    threshold = float(job_spec.pop("ready_threshold", 0.995))
    import os

    from relgate_agent.pki import TlsFiles

    pki = str(extras.get("pki") or os.environ.get("RELGATE_AGENT_PKI") or "")
    if not pki:
        raise AgentError("extras need 'pki' (the fleet PKI directory) for mutual TLS")
    server = None
    address = str(extras.get("coordinator") or "")
    if not address:
        serve = extras.get("serve")
        if not serve:
            raise AgentError("extras need either 'coordinator' (address) or 'serve' (config)")
        from relgate_agent.coordinator.server import CoordinatorServer
        from relgate_agent.coordinator.service import CoordinatorConfig
        from relgate_agent.manifest import TrustedKeys

        server = CoordinatorServer(
            CoordinatorConfig(
                db=str(serve["db"]),
                trusted_keys=TrustedKeys.load(list(serve["trusted_keys"])),
                default_stripes=int(serve.get("stripes", 8)),
                dead_after_s=float(serve.get("dead_after_s", 6.0)),
            ),
            str(serve.get("listen", "127.0.0.1:7470")),
            tls=TlsFiles.from_pki(pki, "coordinator"),
        ).start()
        for h in serve.get("enroll") or []:
            labels = h.get("labels") or {}
            if isinstance(labels, str):
                labels = dict(item.split("=", 1) for item in labels.split(",") if "=" in item)
            server.coordinator.enroll(str(h["host_id"]), str(h["rack"]), dict(labels))
        address = server.address
        log(f"coordinator serving on {address}")
    client = CoordinatorClient(address, TlsFiles.from_pki(pki, "operator"))
    try:
        if server is not None:
            # agents find a freshly started coordinator by retrying; wait until the fleet we
            # expect has checked in, so the target selector resolves to all of it
            min_hosts = int(extras.get("serve", {}).get("min_hosts", 0))
            wait_until = time.monotonic() + float(
                extras.get("serve", {}).get("min_hosts_wait_s", 120)
            )
            from relgate_agent.coordinator.service import parse_selector, selector_matches

            selector = parse_selector(str(job_spec.get("target_selector") or ""))

            def matching() -> int:  # only agents the job's selector targets count
                return sum(
                    selector_matches(selector, rack, labels)
                    for _h, rack, labels, _a in server.coordinator.store.hosts()
                )

            while matching() < min_hosts:
                if time.monotonic() > wait_until:
                    raise AgentError(
                        f"only {matching()} of {min_hosts} agents matching "
                        f"{job_spec.get('target_selector')!r} checked in with the coordinator "
                        f"at {address} within {extras.get('serve', {}).get('min_hosts_wait_s', 120)} s"
                    )
                time.sleep(0.2)
        resp = client.create_job(
            ready_threshold_ppm=round(threshold * 1_000_000),
            **{k: v for k, v in job_spec.items() if v is not None},
        )
        job_id = resp.job_id
        log(f"job {job_id}: {job_spec['model']}/{job_spec['version']} to {resp.hosts_total} hosts")
        poll = float(extras.get("poll_interval_s", 1.0))
        deadline = time.monotonic() + float(extras.get("timeout_s", 3600))
        wait_all = bool(extras.get("wait_for_all", False))
        last = ""
        while True:
            status = job_to_dict(client.get_job(job_id))
            line = (
                f"job {job_id} {status['state']}: {status['hosts_ready']}/{status['hosts_total']} ready, "
                f"{status['bytes_moved']} bytes moved, {status['origin_bytes']} origin bytes, eta {status['eta_s']}s"
            )
            if line != last:
                log(line)
                last = line
            done = status["state"] in ("DONE", "CANCELLED", "FAILED")
            handed_off = status["completion_emitted"]
            if done or (handed_off and not wait_all):
                break
            if time.monotonic() > deadline:
                raise AgentError(
                    f"job {job_id} timed out in state {status['state']} with "
                    f"{status['hosts_ready']}/{status['hosts_total']} hosts ready "
                    f"(stragglers: {', '.join(status['stragglers'][:8]) or 'none'})"
                )
            time.sleep(poll)
        status["ready_threshold"] = threshold
        status["threshold_met"] = status["hosts_total"] > 0 and (
            status["hosts_ready"] >= threshold * status["hosts_total"]
        )
        return status
    finally:
        client.close()
        if server is not None:
            server.stop()


def run_pipes() -> int:
    from dagster_pipes import open_dagster_pipes

    with open_dagster_pipes() as pipes:
        status = run_distribution_job(pipes.extras, log=pipes.log.info)
        metadata = {
            "job_id": status["job_id"],
            "manifest_digest": status["manifest_digest"],
            "hosts_total": status["hosts_total"],
            "hosts_ready": status["hosts_ready"],
            "ready_hosts": {"raw_value": status["ready_hosts"], "type": "json"},
            "stragglers": {"raw_value": status["stragglers"], "type": "json"},
            "bytes_moved": status["bytes_moved"],
            "origin_bytes": status["origin_bytes"],
            "checkpoint_bytes": status["checkpoint_bytes"],
        }
        asset_key = pipes.asset_keys[0] if pipes.is_asset_step and pipes.asset_keys else None
        pipes.report_asset_check(
            check_name=CHECK_NAME,
            passed=bool(status["threshold_met"]),
            severity="ERROR",
            metadata={
                "ready_fraction": status["hosts_ready"] / max(status["hosts_total"], 1),
                "ready_threshold": status["ready_threshold"],
                "hosts_ready": status["hosts_ready"],
                "hosts_total": status["hosts_total"],
            },
            asset_key=asset_key,
        )
        pipes.report_asset_materialization(
            metadata=metadata, data_version=status["manifest_digest"], asset_key=asset_key
        )
    return 0
