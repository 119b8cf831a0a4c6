"""``relgate transform``: transform image tags."""

from __future__ import annotations

import click

from relgate.cli.common import CommandOutput, Ctx, command, pass_ctx


@click.group()
def transform() -> None:
    """Transform image tags."""


@command(transform, "tag")
@click.argument("tag")
@click.option(
    "--digest", default=None, help="Point the tag at this digest (default: the code here)."
)
@pass_ctx
def transform_tag(ctx: Ctx, tag: str, digest: str | None) -> CommandOutput:
    from relgate.snapshot.transforms import tag_transform

    return {"tag": tag, "digest": tag_transform(ctx.ws().db, tag, digest)}


def register(main: click.Group) -> None:
    main.add_command(transform)
