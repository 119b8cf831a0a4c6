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
    """Generate a synthetic corpus and configure it (sources and record schema)."""
    if corpus == "tokens":
        from relgate.demo.token_corpus import seed_tokens

        return seed_tokens(ctx.ws(), records=tickets, seed=seed)
    if corpus == "images":
        from relgate.demo.image_corpus import seed_images

        return seed_images(ctx.ws(), seed=seed)
    from relgate.demo.corpus import seed_demo

    return seed_demo(ctx.ws(), tickets=tickets, seed=seed)


def register(main: click.Group) -> None:
    main.add_command(demo)
