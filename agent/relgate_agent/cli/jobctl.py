"""Distribution job commands: ``job create``, ``job list``, ``job get``, ``job cancel``,
``job evict``."""

from __future__ import annotations

import click

from relgate_agent.cli.params import (
    DEFAULT_COORDINATOR,
    RATE,
    TlsArgs,
    common,
    operator_client,
    output,
    tls_options,
)


@click.group("job")
def job() -> None:
    pass


@job.command("create")
@common
@click.option("--coordinator", default=DEFAULT_COORDINATOR)
@click.option("--model", required=True)
@click.option("--version", required=True)
@click.option("--manifest-uri", required=True)
@click.option("--origin-uri", default="")
@click.option("--selector", default="")
@click.option("--priority", default="normal", type=click.Choice(["low", "normal", "high"]))
@click.option("--origin-cap", type=RATE, default=0)
@click.option("--ready-threshold", type=float, default=0.995)
@click.option("--deadline", type=int, default=0)
@click.option("--stripes", type=int, default=0)
@click.option("--webhook", default="")
@click.option("--job-id", default="")
@click.option(
    "--origin-dc",
    default="",
    help="The origin's data center (host label dc=...): its hosts read the origin, other"
    " DCs' stripe roots read over the WAN from it (default: the DC with the most hosts).",
)
@tls_options
def job_create(  # noqa: PLR0913 - one parameter per command-line option
    *,
    coordinator: str,
    model: str,
    version: str,
    manifest_uri: str,
    origin_uri: str,
    selector: str,
    priority: str,
    origin_cap: int,
    ready_threshold: float,
    deadline: int,
    stripes: int,
    webhook: str,
    job_id: str,
    origin_dc: str,
    pki: str,
    ca: str,
    cert: str,
    key: str,
) -> None:
    from relgate_trust.job_request import JobSpec

    spec = JobSpec(
        model=model,
        version=version,
        manifest_uri=manifest_uri,
        origin_uri=origin_uri,
        target_selector=selector,
        priority=priority,
        origin_cap_bytes_per_s=origin_cap,
        ready_threshold_ppm=round(ready_threshold * 1_000_000),
        deadline_s=deadline,
        stripes=stripes,
        webhook_url=webhook,
        job_id=job_id,
        origin_dc=origin_dc,
    )
    with operator_client(coordinator, TlsArgs(pki, ca, cert, key)) as c:
        r = c.create(spec)
    output().emit(
        {
            "jobId": r.job_id,
            "state": r.state,
            "manifestDigest": r.manifest_digest,
            "hostsTotal": r.hosts_total,
        }
    )


# every state a job can be in (coordinator/jobstate.py ACTIVE_STATES + TERMINAL_STATES)
JOB_STATES = ("PLANNING", "DISTRIBUTING", "COMPLETE", "DONE", "CANCELLED", "FAILED")


@job.command("list", help="the coordinator's jobs, oldest first: state and hosts READY/targets")
@common
@click.option("--coordinator", default=DEFAULT_COORDINATOR)
@click.option(
    "--state",
    default="",
    type=click.Choice(["", *JOB_STATES], case_sensitive=False),
    help="only jobs in this state",
)
@tls_options
def job_list(coordinator: str, state: str, pki: str, ca: str, cert: str, key: str) -> None:
    from relgate_agent.cli.render import job_rows

    with operator_client(coordinator, TlsArgs(pki, ca, cert, key)) as c:
        jobs = c.list_jobs(state.upper())
    out = output()
    if out.json:
        out.emit({"jobs": [j.to_json() for j in jobs]})
        return
    for line in job_rows(jobs):
        click.echo(line)


@job.command("get")
@common
@click.argument("job_id")
@click.option("--coordinator", default=DEFAULT_COORDINATOR)
@click.option("--hosts", is_flag=True, help="include per-host status")
@click.option(
    "--topology",
    is_flag=True,
    help="include the current striped chains: per stripe, each host's upstream (a host or"
    " ORIGIN), downstreams, reported receive rate and bytes done",
)
@tls_options
def job_get(
    *,
    job_id: str,
    coordinator: str,
    hosts: bool,
    topology: bool,
    pki: str,
    ca: str,
    cert: str,
    key: str,
) -> None:
    from relgate_agent.cli.render import topology_lines
    from relgate_agent.client import job_from_pb

    with operator_client(coordinator, TlsArgs(pki, ca, cert, key)) as c:
        status = job_from_pb(c.get_job(job_id))
        chains = c.job_topology(job_id) if topology else None
    out = output()
    doc = status.to_json(hosts=hosts)
    if chains is not None and out.json:
        doc["topology"] = chains.to_json()
    out.emit(doc)
    if chains is not None and not out.json:
        for line in topology_lines(chains):
            click.echo(line)


@job.command("cancel")
@common
@click.argument("job_id")
@click.option("--coordinator", default=DEFAULT_COORDINATOR)
@tls_options
def job_cancel(job_id: str, coordinator: str, pki: str, ca: str, cert: str, key: str) -> None:

    with operator_client(coordinator, TlsArgs(pki, ca, cert, key)) as c:
        r = c.cancel_job(job_id)
    # what was placed stays placed (and recorded): the deployer may still use those hosts
    output().emit(
        {
            "jobId": job_id,
            "state": r.state or "CANCELLED",
            "placedHosts": list(r.placed_hosts),
            "hostsTotal": r.hosts_total,
        }
    )


@job.command(
    "evict",
    help="remove HOST from JOB's targets (a lost host, a host under repair): the job no longer"
    " waits for it and reports it among its removed hosts with the reason",
)
@common
@click.argument("job_id")
@click.argument("host_id")
@click.option("--reason", required=True, help="why (recorded with the operator's name)")
@click.option("--coordinator", default=DEFAULT_COORDINATOR)
@tls_options
def job_evict(
    job_id: str, host_id: str, reason: str, coordinator: str, pki: str, ca: str, cert: str, key: str
) -> None:

    with operator_client(coordinator, TlsArgs(pki, ca, cert, key)) as c:
        r = c.evict_host(job_id, host_id, reason)
    output().emit({"jobId": job_id, "hostId": host_id, "state": r.state, "removed": r.removed})
