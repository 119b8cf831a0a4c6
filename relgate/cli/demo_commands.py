"""``relgate demo``: the synthetic demo corpus."""

from __future__ import annotations

import click

from relgate.cli.common import CommandOutput, Ctx, command, pass_ctx


@click.group()
def demo() -> None:
    """Synthetic demo corpus."""


@command(demo, "seed")
@click.option("--tickets", default=600, show_default=True, help="Records (text and tokens).")
@click.option("--seed", default=7, show_default=True)
@click.option(
    "--corpus",
    type=click.Choice(["text", "tokens", "images"]),
    default="text",
    show_default=True,
    help="text: three source kinds with a trained tokenizer; tokens: token ids as"
    " list<uint32> in Iceberg; images: PNG bytes with metadata under an object prefix.",
)
@pass_ctx
def demo_seed(ctx: Ctx, tickets: int, seed: int, corpus: str) -> CommandOutput:
    """Generate a synthetic corpus and configure it (sources and record schema), and build,
    register and tag the demo's pinned transform wheels."""
    from relgate.demo.corpus import seed_demo, tag_demo_transforms

    ws = ctx.ws()
    tags = tag_demo_transforms(ws)
    if corpus == "tokens":
        from relgate.demo.token_corpus import seed_tokens

        return {**seed_tokens(ws, records=tickets, seed=seed).to_json(), "transformTags": tags}
    if corpus == "images":
        from relgate.demo.image_corpus import seed_images

        return {**seed_images(ws, seed=seed).to_json(), "transformTags": tags}

    return {**seed_demo(ws, tickets=tickets, seed=seed).to_json(), "transformTags": tags}


@command(demo, "transform")
@pass_ctx
def demo_transform(ctx: Ctx) -> CommandOutput:
    """Build the demo transform's wheel, register it and tag registry.local/normalize:v1."""
    from relgate.demo.corpus import tag_demo_transforms

    return {"transformTags": tag_demo_transforms(ctx.ws())}


def register(main: click.Group) -> None:
    main.add_command(demo)
