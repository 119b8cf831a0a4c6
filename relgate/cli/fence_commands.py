"""``relgate fence``: tombstone and benchmark fences."""

from __future__ import annotations

import click

from relgate.cli.common import CommandOutput, Ctx, actor, command, pass_ctx
from relgate.gate.transitions import open_gate


@click.group()
def fence() -> None:
    """Tombstone and benchmark fences."""


@fence.group("tombstone")
def fence_tombstone() -> None:
    """Revoked sample ids."""


@command(fence_tombstone, "add")
@click.argument("sample_ids", nargs=-1, required=True)
@click.option("--reason", required=True)
@pass_ctx
def tombstone_add(ctx: Ctx, sample_ids: tuple[str, ...], reason: str) -> CommandOutput:
    from relgate.snapshot.activation import add_tombstones

    return add_tombstones(ctx.ws(), list(sample_ids), reason=reason, actor=actor())


@fence.group("benchmark")
def fence_benchmark() -> None:
    """Benchmark items (by logical content digest) that no training set may contain."""


@command(fence_benchmark, "add")
@click.argument("content_digests", nargs=-1, required=True)
@click.option("--benchmark", required=True, help="Benchmark name.")
@pass_ctx
def benchmark_add(ctx: Ctx, content_digests: tuple[str, ...], benchmark: str) -> CommandOutput:
    from relgate.integrity.digests import require_digest
    from relgate.snapshot.activation import add_benchmark_items

    digests = [require_digest(d, what="content digest") for d in content_digests]
    return add_benchmark_items(ctx.ws(), digests, benchmark=benchmark, actor=actor())


@command(fence, "show")
@click.argument("tombstone", required=False)
@click.option(
    "--propagation",
    is_flag=True,
    help="With TOMBSTONE: every stored object that still holds the erased sample, who holds"
    " it and when it becomes deletable.",
)
@click.option("--grace", default="6h", show_default=True, help="The sweep's grace period.")
@pass_ctx
def fence_show(ctx: Ctx, tombstone: str | None, propagation: bool, grace: str) -> CommandOutput:
    """The fences; with TOMBSTONE (a sequence number or a sample id) and --propagation,
    where the erased sample's bytes still are."""
    from relgate.errors import UsageError

    if tombstone is None:
        if propagation:
            raise UsageError(
                "--propagation needs a TOMBSTONE (its sequence number or sample id)",
                object="fence show",
                check="tombstone",
            )
        gate = open_gate(ctx.ws())
        fences = gate.fences()
        return {
            "tombstoneWatermark": fences.tombstone_watermark,
            "benchmarkFence": fences.benchmark_fence,
            "tombstones": len(gate.tombstones()),
            "benchmarkItems": len(gate.benchmark_items()),
        }
    from relgate.lifecycle.collector import parse_duration
    from relgate.lifecycle.propagation import propagation as watch
    from relgate.lifecycle.propagation import tombstoned_sample

    if propagation:
        return watch(ctx.ws(), tombstone, grace_seconds=parse_duration(grace)).to_json()
    sample, seqs = tombstoned_sample(ctx.ws(), tombstone)
    return {"sampleId": sample, "tombstones": seqs}


def register(main: click.Group) -> None:
    main.add_command(fence)
