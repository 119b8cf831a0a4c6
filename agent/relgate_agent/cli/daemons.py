"""Long-running commands: ``coordinator serve``, ``agent serve``, ``pipes``."""

from __future__ import annotations

import os
import sys
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

import click

from relgate_agent import gcpolicy
from relgate_agent.cli.config import AgentFileConfig, CoordinatorFileConfig, config_option
from relgate_agent.cli.params import (
    LABELS,
    RATE,
    TlsArgs,
    common,
    data_plane_limit_options,
    log_format_option,
    output,
    setup_logging,
    tls_options,
    wait_for_signal,
)
from relgate_agent.identity import certpair
from relgate_agent.staging.direct import BUFFERED, MODES

if TYPE_CHECKING:
    from collections.abc import Callable

    from relgate_trust.dsse import TrustedKeys

    from relgate_agent.cli.params import Output
    from relgate_agent.coordinator.renewal import Renewals
    from relgate_agent.coordinator.server import CoordinatorServer
    from relgate_agent.dataplane.transport import DataPlaneLimits
    from relgate_agent.identity.trustwatch import TrustWatch
    from relgate_agent.logctx import LogFormat


@click.group("coordinator")
def coordinator() -> None:
    pass


@coordinator.command("serve", help="run the coordinator (gRPC)")
@config_option(CoordinatorFileConfig)
@common
@log_format_option
@click.option(
    "--listen",
    multiple=True,
    help="host:port or unix:/path (repeatable; default 127.0.0.1:7470)",
)
@click.option("--db", default="", help="SQLite path or postgresql:// DSN")
@click.option("--trusted-keys", required=True, multiple=True)
@click.option("--stripes", type=int, default=8)
@click.option("--dead-after", type=float, default=6.0)
@click.option(
    "--remove-dead-after",
    type=float,
    default=300.0,
    help="a host DEAD this long is removed from its job (the job stops waiting for it)",
)
@click.option(
    "--mass-silence",
    type=float,
    default=0.02,
    help="hold splices while more than this fraction of a job's chain hosts (and 8) went"
    " silent within 2 x --dead-after (an overloaded coordinator or a partition, likelier"
    " than that many deaths); held, a host silent 5 x --dead-after is spliced; 1 never holds",
)
@click.option("--report-interval", type=float, default=1.0)
@click.option("--webhook", default="")
@click.option("--address-file", default="")
@click.option("--ha", is_flag=True, help="replica mode: lead only while holding the lease in --db")
@click.option("--lease-ttl", type=float, default=10.0)
@click.option(
    "--shard-by-job",
    is_flag=True,
    help="replicas (implies --ha) lead jobs by each job's own lease, spread across them",
)
@click.option(
    "--no-splice-on-suspect",
    is_flag=True,
    help="splice only after --dead-after (agents fall back to swarm repair meanwhile)",
)
@click.option("--replica-id", default="")
@click.option(
    "--host-ttl",
    type=float,
    default=60.0,
    help="enrolled hosts without a heartbeat for this long are not targets",
)
@click.option(
    "--metrics-listen",
    default="",
    help="host:port for Prometheus /metrics (e.g. 127.0.0.1:9470; default: not served)",
)
@click.option(
    "--enroll-listen",
    default="",
    help="host:port of the enrollment listener (TLS, no client certificate: hosts send CSRs"
    " with a bootstrap token; default: not served)",
)
@click.option(
    "--ca-dir",
    default="",
    help="the fleet CA's directory (ca.pem, ca.key): sign enrolled hosts' certificate renewals"
    " (docs/agent-renewal.md; default: none, renewals are refused)",
)
@click.option(
    "--renew-validity",
    type=click.FloatRange(min=0, min_open=True, max=24 * 365),
    default=72.0,
    help="hours a renewed host certificate is valid",
)
@click.option(
    "--gc-threshold",
    default=gcpolicy.DAEMON_DEFAULT,
    show_default=True,
    callback=lambda _ctx, _param, value: gcpolicy.parse_threshold(value),
    help='garbage-collector thresholds GEN0,GEN1,GEN2 ("python": 700,10,10); the start-up'
    " heap is frozen once serving (relgate_agent/gcpolicy.py)",
)
@tls_options
def coordinator_serve(  # noqa: PLR0913 - one parameter per command-line option
    *,
    gc_threshold: tuple[int, int, int],
    ca_dir: str,
    renew_validity: float,
    log_format: LogFormat,
    metrics_listen: str,
    enroll_listen: str,
    listen: tuple[str, ...],
    db: str,
    trusted_keys: tuple[str, ...],
    stripes: int,
    dead_after: float,
    remove_dead_after: float,
    mass_silence: float,
    report_interval: float,
    webhook: str,
    address_file: str,
    ha: bool,
    lease_ttl: float,
    shard_by_job: bool,
    no_splice_on_suspect: bool,
    replica_id: str,
    host_ttl: float,
    pki: str,
    ca: str,
    cert: str,
    key: str,
) -> None:
    from relgate_agent.coordinator.jobstate import CoordinatorConfig, default_db_path
    from relgate_agent.coordinator.server import CoordinatorServer
    from relgate_agent.identity.trustwatch import TrustWatch

    out = output()
    setup_logging(out.verbose, log_format)
    trust = TrustWatch(trusted_keys)  # reloaded while serving: identity/trustwatch.py
    cfg = CoordinatorConfig(
        db=db or default_db_path(),
        trusted_keys=trust.keys,
        default_stripes=stripes,
        dead_after_s=dead_after,
        remove_dead_after_s=remove_dead_after,
        mass_silence_fraction=mass_silence,
        report_interval_s=report_interval,
        webhook_url=webhook,
        ha=ha,
        splice_on_suspect=not no_splice_on_suspect,
        lease_ttl_s=lease_ttl,
        shard_by_job=shard_by_job,
        replica_id=replica_id,
        host_ttl_s=host_ttl,
    )
    tls = TlsArgs(pki, ca, cert, key).files("coordinator")
    server = CoordinatorServer(
        cfg,
        list(listen) or ["127.0.0.1:7470"],
        tls=tls,
        metrics_listen=metrics_listen,
        enroll_listen=enroll_listen,
        renewals=_renewals(ca_dir, renew_validity, tls.ca),
    ).start()
    gcpolicy.apply(gc_threshold)  # serving: the start-up heap is frozen from here
    _serving(out, server, address_file)
    coord = server.coordinator
    _until_signal(
        trust,
        lambda keys: setattr(coord, "config", replace(coord.config, trusted_keys=keys)),
        server.stop,
    )


def _until_signal(
    trust: TrustWatch, swap: Callable[[TrustedKeys], None], stop: Callable[[], None]
) -> None:
    """Serve until SIGTERM/SIGINT: trusted keys reloaded into the daemon by ``swap`` (one
    reference swap) meanwhile, then the trust watch and the daemon stopped."""
    trust.start(swap)
    try:
        wait_for_signal()
    finally:
        trust.stop()
        stop()


def _serving(out: Output, server: CoordinatorServer, address_file: str) -> None:
    """Where the serving coordinator listens: the address file, and one line on stdout."""
    if address_file:
        Path(address_file).write_text(server.address)
    out.emit(
        {
            "listening": server.address,
            "addresses": server.addresses,
            "metrics": server.metrics_address,
            "enroll": server.enroll_address,
            "pid": os.getpid(),
        }
    )
    sys.stdout.flush()


def _renewals(ca_dir: str, validity_h: float, fleet_ca: Path) -> Renewals | None:
    """The renewal signer of ``--ca-dir`` (its CA must be the fleet's); None without one."""
    from relgate_agent.coordinator.renewal import Renewals

    if not ca_dir:
        return None
    Renewals.check_ca_dir(Path(ca_dir), fleet_ca)
    return Renewals(Path(ca_dir), validity_h)


@click.group("agent")
def agent() -> None:
    pass


@agent.command("serve", help="run the host agent")
@config_option(AgentFileConfig)
@common
@log_format_option
@click.option("--host-id", required=True)
@click.option("--rack", required=True)
@click.option("--labels", type=LABELS, default="")
@click.option("--coordinator", required=True)
@click.option(
    "--coordinator-sharded/--no-coordinator-sharded",
    default=False,
    help="the replicas run --shard-by-job: watch each one, report each job to its leader",
)
@click.option("--models-root", default="/models")
@click.option(
    "--staging-io",
    type=click.Choice(MODES),
    default=BUFFERED,
    show_default=True,
    help="write and re-read staging files through the page cache, or with O_DIRECT through "
    "aligned buffers (no page-cache copy: fewer CPU-s per GiB; the models root's file "
    "system must support it: ext4, xfs and tmpfs do, ramfs does not)",
)
@click.option("--trusted-keys", required=True, multiple=True)
@click.option("--listen", default="127.0.0.1:0")
@click.option("--advertise", default="")
@click.option("--journal-interval", type=float, default=2.0)
@click.option("--report-interval", type=float, default=1.0)
@click.option(
    "--retain",
    type=int,
    default=2,
    help="versions kept up to the one the deployer acked as serving (2 = N-1)",
)
@click.option(
    "--max-rate",
    type=RATE,
    default=0,
    help="cap distribution rx and tx on this host (e.g. 20Gbit) so serving traffic keeps its share",
)
@click.option(
    "--max-upload-rate",
    type=RATE,
    default=0,
    help="cap what this host sends to its downstream peers alone (default: --max-rate)",
)
@click.option(
    "--bypass/--no-bypass",
    default=True,
    show_default=True,
    help="route a stripe around a dead upstream without a leader (the upstream's upstream, "
    "named in the assignment); --no-bypass waits for the coordinator's splice",
)
@click.option(
    "--bypass-slow/--no-bypass-slow",
    default=False,
    show_default=True,
    help="also route around an upstream that is the stripe's slow hop (experimental: "
    "measured to hurt in bench chaos, see docs/distribution-design.md)",
)
@click.option(
    "--origin-parallel",
    type=click.IntRange(0, 256),
    default=0,
    help="origin range GETs in flight per stripe root (0: the origin's default, S3 16)",
)
@click.option(
    "--origin-range-mib",
    type=click.IntRange(0, 4096),
    default=0,
    help="size of one origin range GET in MiB (0: the origin's default, S3 64)",
)
@data_plane_limit_options
@click.option(
    "--metrics-listen",
    default="",
    help="host:port for Prometheus /metrics (e.g. 127.0.0.1:9471; default: not served)",
)
@click.option(
    "--renew-before",
    type=click.FloatRange(min=0),
    default=24.0,
    show_default=True,
    help="renew this host's certificate over the mTLS channel when fewer hours of it are left"
    " (a third of the 72 h default; 0: never; docs/agent-renewal.md)",
)
@click.option(
    "--trust-poll",
    type=click.FloatRange(min=0),
    default=300.0,
    show_default=True,
    help="seconds between asks for the coordinator's CA bundle, which a CA rotation changes"
    " (0: never; docs/agent-ca-rotation.md)",
)
@tls_options
def agent_serve(  # noqa: PLR0913 - one parameter per command-line option
    *,
    renew_before: float,
    trust_poll: float,
    coordinator_sharded: bool,
    log_format: LogFormat,
    metrics_listen: str,
    host_id: str,
    rack: str,
    labels: dict[str, str],
    coordinator: str,
    models_root: str,
    staging_io: str,
    trusted_keys: tuple[str, ...],
    listen: str,
    advertise: str,
    journal_interval: float,
    report_interval: float,
    retain: int,
    max_rate: int,
    max_upload_rate: int,
    bypass: bool,
    bypass_slow: bool,
    origin_parallel: int,
    origin_range_mib: int,
    limits: DataPlaneLimits,  # data_plane_limit_options
    pki: str,
    ca: str,
    cert: str,
    key: str,
) -> None:
    from relgate_agent.agent.host import HostAgent
    from relgate_agent.agent.job import AgentConfig
    from relgate_agent.identity.trustwatch import TrustWatch

    setup_logging(output().verbose, log_format, {"host": host_id})
    trust = TrustWatch(trusted_keys)  # reloaded while serving: identity/trustwatch.py
    host, _, port = listen.rpartition(":")
    cfg = AgentConfig(
        host_id=host_id,
        rack=rack,
        coordinator=coordinator,
        models_root=Path(models_root),
        staging_io=staging_io,
        trusted_keys=trust.keys,
        labels=labels,
        listen_host=host or "127.0.0.1",
        listen_port=int(port or 0),
        advertise_host=advertise,
        journal_interval_s=journal_interval,
        report_interval_s=report_interval,
        retain_versions=retain,
        max_rate_bytes_per_s=max_rate,
        max_upload_bytes_per_s=max_upload_rate,
        bypass=bypass,
        bypass_slow=bypass and bypass_slow,
        origin_parallel=origin_parallel,
        origin_range_bytes=origin_range_mib << 20,
        metrics_listen=metrics_listen,
        renew_before_s=renew_before * 3600,
        trust_poll_s=trust_poll,
        coordinator_sharded=coordinator_sharded,
    )
    tls = TlsArgs(pki, ca, cert, key).files(host_id)
    certpair.recover(tls)  # a renewal a crash cut short is finished before TLS loads
    running = HostAgent(cfg, tls=tls, limits=limits).start()
    _announce(cfg.host_id, running.data_address, running.metrics_address)
    # one reference swap: a job's runner takes the host's config when the job starts
    _until_signal(
        trust,
        lambda keys: setattr(running, "config", replace(running.config, trusted_keys=keys)),
        running.stop,
    )


def _announce(host_id: str, data_address: str, metrics_address: str) -> None:
    """The serving agent's one line on stdout: what a supervisor or a test waits for."""
    output().emit(
        {
            "hostId": host_id,
            "dataAddress": data_address,
            "metrics": metrics_address,
            "pid": os.getpid(),
        }
    )
    sys.stdout.flush()


@click.command("pipes", help="run a distribution job under Dagster Pipes (open_dagster_pipes)")
@common
def pipes() -> int:
    from relgate_agent.pipes import run_pipes

    setup_logging(output().verbose)
    return run_pipes()
