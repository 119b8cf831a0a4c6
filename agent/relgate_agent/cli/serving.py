"""The ``ack-serving`` command: the deployer says a placed version serves (N-1 retention)."""

from __future__ import annotations

from pathlib import Path

import click

from relgate_agent.cli.params import common, output


@click.command(
    "ack-serving",
    help="record that MODEL VERSION serves on this host, then retire versions older than "
    "the previous one (never the serving one, never a newer one awaiting its ack)",
)
@common
@click.argument("model")
@click.argument("version")
@click.option("--models-root", default="/models")
@click.option("--retain", type=int, default=2, help="versions kept up to the serving one (2 = N-1)")
def ack_serving(model: str, version: str, models_root: str, retain: int) -> None:
    from relgate_agent.staging.retention import ack_serving as ack

    output().emit(ack(Path(models_root), model, version, max(retain, 1)).to_json())
