"""``relgate records``: the record schema a workspace builds with, and tokenizers."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING

import click

from relgate.cli.common import CommandOutput, Ctx, command, pass_ctx

if TYPE_CHECKING:
    from relgate.records.record_schema import RecordSchema


@click.group()
def records() -> None:
    """Record schemas (what one record is) and tokenizers."""


@command(records, "show")
@pass_ctx
def records_show(ctx: Ctx) -> CommandOutput:
    """The record schema the next snapshot build declares, with its digest."""
    from relgate.snapshot.build import BuildSpec

    schema = BuildSpec.from_config(ctx.ws().config).records
    return {"recordSchema": schema.digest(), "document": schema.to_json()}


def _read_schema(schema_file: Path) -> RecordSchema:
    from relgate.errors import UsageError
    from relgate.records.record_schema import CHECK, RecordSchema

    try:
        document = json.loads(schema_file.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, ValueError) as exc:
        raise UsageError(
            f"not a JSON document: {exc}", object=str(schema_file), check=CHECK
        ) from None
    return RecordSchema.from_config(document)


@command(records, "check")
@click.argument("schema_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
def records_check(schema_file: Path) -> CommandOutput:
    """Validate a record schema document (JSON) and print its digest."""
    schema = _read_schema(schema_file)
    return {"recordSchema": schema.digest(), "document": schema.to_json()}


@command(records, "use")
@click.argument("schema_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@pass_ctx
def records_use(ctx: Ctx, schema_file: Path) -> CommandOutput:
    """Declare the record schema the workspace's next snapshots are built with."""
    schema = _read_schema(schema_file)
    ws = ctx.ws()
    ws.config.setdefault("snapshot", {})["recordSchema"] = schema.to_json()
    ws.save()
    return {"recordSchema": schema.digest(), "document": schema.to_json()}


@command(records, "tokenizer-train")
@click.argument("text_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@click.option("--vocab-size", default=2000, show_default=True, type=click.IntRange(256, 1 << 20))
@pass_ctx
def tokenizer_train(ctx: Ctx, text_file: Path, vocab_size: int) -> CommandOutput:
    """Train a byte-level BPE tokenizer on a text file (one text per line) and store it."""
    from relgate.snapshot import tokenizer

    lines = text_file.read_text(encoding="utf-8").splitlines()
    digest = tokenizer.register(ctx.ws(), tokenizer.train(lines, vocab_size=vocab_size))
    return {"tokenizer": digest, "texts": len(lines), "vocabSize": vocab_size}


@command(records, "tokenizer-add")
@click.argument("tokenizer_file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@pass_ctx
def tokenizer_add(ctx: Ctx, tokenizer_file: Path) -> CommandOutput:
    """Store a ``tokenizers`` JSON file (it must load); print the digest to declare."""
    from relgate.snapshot import tokenizer

    return {"tokenizer": tokenizer.register(ctx.ws(), tokenizer_file.read_bytes())}


def register(main: click.Group) -> None:
    main.add_command(records)
