"""Lab commands (click): ``python -m relgate_lab up|down|origin-serve``.

What ``relgate-agent lab ...`` used to be, with the same flags; the lab is not part of the
installed agent. ``up`` prints the lab state (``lab.json``) as it is stored.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from pathlib import Path

import click

from relgate_agent.cli.params import (
    RATE,
    common,
    expand_greedy_args,
    output,
    parse_rate,
    setup_logging,
)
from relgate_agent.errors import AgentError
from relgate_lab.netns import LabSpec, lab_down, lab_up, serve_origin


@click.group("relgate_lab", help="network-namespace lab for the distribution tests and benches")
@common
def lab() -> None:
    pass


@lab.command("up", help="netns lab: one namespace per host, a bridge per rack, capped NICs")
@common
@click.option("--hosts", type=int, default=8)
@click.option("--racks", type=int, default=2)
@click.option("--nic", type=RATE, default=parse_rate("100Mbit"))
@click.option("--state-dir", default="var/lab")
@click.option("--trusted-keys", required=True, multiple=True)
@click.option("--coordinator-listen", default="")
@click.option("--journal-interval", type=float, default=2.0)
@click.option("--loopback", is_flag=True, help="no namespaces even when root")
@click.option(
    "--fair-nics/--fifo-nics",
    default=True,
    help="share each NIC cap fairly among peers (htb class per peer, as fq_codel does on "
    "a real host; the default) or queue every flow in one tbf FIFO (TCP shares it unfairly)",
)
def up(  # noqa: PLR0913 - one parameter per command-line option
    *,
    hosts: int,
    racks: int,
    nic: int,
    state_dir: str,
    trusted_keys: tuple[str, ...],
    coordinator_listen: str,
    journal_interval: float,
    loopback: bool,
    fair_nics: bool,
) -> None:
    setup_logging(output().verbose)
    spec = LabSpec(
        hosts=hosts,
        racks=racks,
        nic_bytes_per_s=nic,
        state_dir=Path(state_dir),
        trusted_keys=list(trusted_keys),
        coordinator_listen=coordinator_listen,
        journal_interval_s=journal_interval,
        force_loopback=loopback,
        fair_nics=fair_nics,
    )
    output().emit(lab_up(spec))


@lab.command("down")
@common
@click.option("--state-dir", default="var/lab")
def down(state_dir: str) -> None:
    output().emit(lab_down(Path(state_dir)))


@lab.command("origin-serve", help="ranged-GET HTTP origin (object-store stand-in)")
@common
@click.option("--dir", "directory", required=True)
@click.option("--listen", default="127.0.0.1:0")
def origin_serve(directory: str, listen: str) -> None:
    host, _, port = listen.rpartition(":")
    serve_origin(Path(directory), host or "127.0.0.1", int(port or 0))


def main(argv: Sequence[str] | None = None) -> int:
    args = expand_greedy_args(sys.argv[1:] if argv is None else argv)
    try:
        lab.main(args=args, prog_name="relgate_lab", standalone_mode=False)
    except click.exceptions.Exit as exc:
        return int(exc.exit_code)
    except click.ClickException as exc:
        exc.show()
        return 2 if isinstance(exc, click.UsageError) else 1
    except AgentError as exc:
        output_error(str(exc))
        return 3
    return 0


def output_error(message: str) -> None:
    click.echo(message, err=True)
