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
    """Generate a synthetic corpus into an Iceberg table, an object prefix and a CDC log,
    and build, register and tag the demo's pinned transform wheel."""
    from relgate.demo.corpus import seed_demo, tag_demo_transforms

    ws = ctx.ws()
    seeded = seed_demo(ws, tickets=tickets, seed=seed)
    return {**seeded.to_json(), "transformTags": tag_demo_transforms(ws)}


@command(demo, "transform")
@pass_ctx
def demo_transform(ctx: Ctx) -> CommandOutput:
    """Build the demo transform's wheel, register it and tag registry.local/normalize:v1."""
    from relgate.demo.corpus import tag_demo_transforms

    return {"transformTags": tag_demo_transforms(ctx.ws())}


def register(main: click.Group) -> None:
    main.add_command(demo)
