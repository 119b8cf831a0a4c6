"""``relgate demo``: the synthetic demo corpus."""

from __future__ import annotations

import click

from relgate.cli.common import CommandOutput, Ctx, command, pass_ctx


@click.group()
def demo() -> None:
    """Synthetic demo corpus."""


@command(demo, "seed")
@click.option("--tickets", default=600, show_default=True)
@click.option("--seed", default=7, show_default=True)
@pass_ctx
def demo_seed(ctx: Ctx, tickets: int, seed: int) -> CommandOutput:
    """Generate a synthetic corpus into an Iceberg table, an object prefix and a CDC log."""
    from relgate.demo.corpus import seed_demo

    return seed_demo(ctx.ws(), tickets=tickets, seed=seed)


def register(main: click.Group) -> None:
    main.add_command(demo)
