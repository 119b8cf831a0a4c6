"""``relgate checkpoint`` and ``relgate distribute``: signed checkpoints to a fleet of hosts."""

from __future__ import annotations

import click

from relgate.cli.common import CommandOutput, CommandResult, Ctx, command, pass_ctx

_UNITS = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}


def _size(text: str) -> int:
    text = text.strip().lower().removesuffix("ib").removesuffix("b")
    if text and text[-1] in _UNITS:
        return int(float(text[:-1]) * _UNITS[text[-1]])
    return int(text)


@click.group()
def checkpoint() -> None:
    """Publish checkpoints as signed, content-addressed manifests."""


@command(checkpoint, "publish")
@click.argument("directory", type=click.Path(exists=True, file_okay=False))
@click.option("--model", required=True)
@click.option("--version", "version", required=True)
@click.option("--chunk-size", default="64MiB", show_default=True)
@click.option("--block-size", default="4MiB", show_default=True)
@pass_ctx
def checkpoint_publish(
    ctx: Ctx, directory: str, model: str, version: str, chunk_size: str, block_size: str
) -> CommandOutput:
    """Copy DIRECTORY to the immutable origin and sign its manifest (DSSE, Ed25519)."""
    from relgate.checkpoint.publish import publish_checkpoint

    return publish_checkpoint(
        ctx.ws(),
        directory,
        model=model,
        version=version,
        chunk_size=_size(chunk_size),
        block_size=_size(block_size),
    )


@command(checkpoint, "list")
@pass_ctx
def checkpoint_list(ctx: Ctx) -> CommandOutput:
    from relgate.checkpoint.listing import list_checkpoints

    return {"checkpoints": list_checkpoints(ctx.ws())}


@command(checkpoint, "demo")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--megabytes", default=192, show_default=True)
def checkpoint_demo(directory: str, megabytes: int) -> CommandOutput:
    """Write a synthetic bf16 safetensors checkpoint to DIRECTORY."""
    from relgate.demo.checkpoint import write_demo_checkpoint

    return write_demo_checkpoint(directory, megabytes=megabytes)


@command(click.Group(), "distribute")
@click.option("--model", required=True)
@click.option("--version", "version", required=True)
@click.option("--hosts", default=4, show_default=True)
@click.option("--racks", default=2, show_default=True)
@click.option(
    "--dcs",
    default=1,
    show_default=True,
    help="Data centers the racks are split into (DC 0 holds the origin; WAN edges compressed).",
)
@click.option("--ready-threshold", default=1.0, show_default=True)
@click.option(
    "--origin-cap", default=0, show_default=True, help="Origin read cap in bytes/s (0: none)."
)
@click.option(
    "--coordinator",
    "coordinators",
    multiple=True,
    help="A running fleet's coordinator host:port (repeat for replicas, tried in order: the"
    " first that answers as leader). Without it a local fleet is started (--hosts/--racks/--dcs).",
)
@click.option(
    "--pki-dir",
    default="",
    help="With --coordinator: the fleet PKI holding ca.pem, operator.pem and operator.key.",
)
@click.option(
    "--selector",
    default="",
    help="With --coordinator: the hosts to target, as labels k=v,... (required there).",
)
@click.option(
    "--webhook-url",
    default="",
    help="With --coordinator: where the coordinator POSTs DistributionComplete.",
)
@pass_ctx
def distribute_cmd(  # noqa: PLR0913 - one parameter per command-line option
    ctx: Ctx,
    *,
    model: str,
    version: str,
    hosts: int,
    racks: int,
    dcs: int,
    ready_threshold: float,
    origin_cap: int,
    coordinators: tuple[str, ...],
    pki_dir: str,
    selector: str,
    webhook_url: str,
) -> CommandOutput:
    """Fan a published checkpoint out to a running fleet (--coordinator) or a local fleet of
    agents started for it; wait for the handoff."""
    from relgate.checkpoint.distribute import DistributionRequest, distribute
    from relgate.checkpoint.fleet import FleetService
    from relgate.errors import UsageError

    fleet = None
    if coordinators:
        fleet = FleetService(
            coordinators=list(coordinators),
            pki_dir=pki_dir,
            selector=selector,
            webhook_url=webhook_url,
        )
    elif pki_dir or selector or webhook_url:
        raise UsageError(
            "--pki-dir, --selector and --webhook-url name a running fleet: pass --coordinator"
        )
    request = DistributionRequest(
        model=model,
        version=version,
        hosts=hosts,
        racks=racks,
        dcs=dcs,
        ready_threshold=ready_threshold,
        origin_cap_bytes_per_s=origin_cap,
        fleet=fleet,
    )
    result = distribute(ctx.ws(), request, log=lambda line: click.echo(line, err=True))
    if result.complete:
        return result
    if result.coordinator:
        return CommandResult.rejected(
            result,
            check="ready-threshold",
            message=(
                f"job {result.status['job_id']} on {result.coordinator} ended "
                f"{result.status['state']} with {result.status['hosts_ready']}/"
                f"{result.status['hosts_total']} hosts ready (threshold {ready_threshold:g})"
            ),
        )
    return CommandResult.rejected(
        result,
        check="distribution-complete",
        message=(
            f"job {result.status['job_id']} ended {result.status['state']} but no "
            "DistributionComplete reached the deployer webhook within 10 s"
        ),
    )


def register(main: click.Group) -> None:
    main.add_command(checkpoint)
    main.add_command(distribute_cmd)
