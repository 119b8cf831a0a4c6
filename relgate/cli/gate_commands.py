"""``relgate gate``: the gate's metrics (Prometheus), counted from the catalog."""

from __future__ import annotations

import contextlib
import signal
import sys
import threading
from typing import TYPE_CHECKING

import click

from relgate.cli.common import CommandOutput, CommandResult, Ctx, command, pass_ctx

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry


@click.group()
def gate() -> None:
    """The gate's own figures: admissions, alias moves, CAS conflicts, fence advances, hits."""


@command(gate, "metrics")
@click.option(
    "--listen",
    default=None,
    metavar="HOST:PORT",
    help="Serve /metrics here until SIGTERM or Ctrl-C (port 0: any free port);"
    " without it, print the metrics once.",
)
@pass_ctx
def gate_metrics(ctx: Ctx, listen: str | None) -> CommandOutput:
    """The gate's metrics in the Prometheus text format (every process reports the same
    totals: they are counted from the catalog at each scrape)."""
    from prometheus_client import generate_latest

    from relgate.gate.telemetry import gate_registry

    registry = gate_registry(ctx.ws().db)
    if listen is not None:
        return _serve(registry, listen)
    samples = [
        {"name": s.name, "labels": dict(s.labels), "value": s.value}
        for family in registry.collect()
        for s in family.samples
    ]
    return CommandResult({"samples": samples}, text=generate_latest(registry).decode().rstrip())


def _serve(registry: CollectorRegistry, listen: str) -> CommandOutput:
    from prometheus_client import start_http_server

    from relgate.errors import UsageError

    host, _, port = listen.rpartition(":")
    try:
        server, thread = start_http_server(int(port), host or "127.0.0.1", registry=registry)
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"cannot serve gate metrics on {listen!r}: {exc}", object=listen, check="listen"
        ) from exc
    address = f"{host or '127.0.0.1'}:{server.server_port}"
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    click.echo(f"relgate: serving gate metrics on http://{address}/metrics", err=True)
    sys.stderr.flush()
    with contextlib.suppress(KeyboardInterrupt):  # Ctrl-C stops the server like SIGTERM
        stop.wait()
    server.shutdown()
    server.server_close()
    thread.join(timeout=5)
    return {"listen": address, "stopped": True}


def register(main: click.Group) -> None:
    main.add_command(gate)
