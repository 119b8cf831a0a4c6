"""``relgate snapshot``: build, validate, approve, activate, diff and replay dataset snapshots."""

from __future__ import annotations

import click

from relgate.cli.common import (
    CommandOutput,
    CommandResult,
    Ctx,
    actor,
    as_object,
    command,
    pass_ctx,
)


@click.group()
def snapshot() -> None:
    """Build, validate, approve, activate, diff and replay dataset snapshots."""


@command(snapshot, "build")
@click.option("--purpose", default=None)
@click.option(
    "--transform",
    "transform_spec",
    default=None,
    help="repository/name:tag or repository/name@sha256:...",
)
@click.option(
    "--parent",
    "parents",
    multiple=True,
    help="Parent snapshot digest (default: the alias's active digest).",
)
@click.option(
    "--alias", default="default", show_default=True, help="Alias whose active digest is the parent."
)
@click.option("--source", "sources", multiple=True, help="Only these source ids (default: all).")
@click.option("--no-validate", is_flag=True, help="Leave the snapshot BUILDING.")
@pass_ctx
def snapshot_build(
    ctx: Ctx,
    purpose: str | None,
    transform_spec: str | None,
    parents: tuple[str, ...],
    alias: str,
    sources: tuple[str, ...],
    no_validate: bool,
) -> CommandOutput:
    """Freeze fences and sources, select members, sign the manifest, then validate."""
    from relgate.snapshot.build import BuildSpec, build_snapshot
    from relgate.snapshot.validate import validate_snapshot

    ws = ctx.ws()
    spec = BuildSpec.from_config(ws.config)
    if purpose:
        spec.purpose = purpose
    if transform_spec:
        spec.transform = transform_spec
    active = ws.gate().alias(alias, "snapshot").active_digest
    spec.parents = list(parents) or ([active] if active else [])
    spec.source_ids = list(sources) or None
    result = build_snapshot(ws, spec, actor=actor())
    out: dict[str, object] = {
        "snapshot": result.digest,
        "members": result.manifest.member_count,
        "counts": result.counts,
    }
    if no_validate:
        return {**out, "state": "BUILDING"}
    report = validate_snapshot(ws, result.digest, actor=actor())
    out.update(
        state=report.outcome,
        report=report.report_digest,
        failedChecks={k: v for k, v in report.checks.items() if v},
    )
    return CommandResult.of(out, ok=report.ok)


@command(snapshot, "list")
@pass_ctx
def snapshot_list(ctx: Ctx) -> CommandOutput:
    from relgate.catalog.snapshot_table import list_snapshots

    return {"snapshots": list_snapshots(ctx.ws().db)}


@command(snapshot, "show")
@click.argument("digest")
@click.option("--manifest", "with_manifest", is_flag=True, help="Include the verified manifest.")
@pass_ctx
def snapshot_show(ctx: Ctx, digest: str, with_manifest: bool) -> CommandOutput:
    from relgate.catalog.audit import approvals, latest_report
    from relgate.catalog.snapshot_table import resolve, snapshot_history
    from relgate.snapshot.activation import describe
    from relgate.snapshot.compare import load_manifest

    ws = ctx.ws()
    digest = resolve(ws.db, digest)
    out = as_object(describe(ws, digest))
    out["history"] = snapshot_history(ws.db, digest)
    out["approvals"] = approvals(ws.db, digest)
    out["latestReport"] = latest_report(ws.db, digest, "snapshot")
    if with_manifest:
        out["manifest"] = load_manifest(ws, digest).body
    return out


@command(snapshot, "validate")
@click.argument("digest")
@pass_ctx
def snapshot_validate(ctx: Ctx, digest: str) -> CommandOutput:
    """Recompute from pinned sources; VALIDATED, REJECTED or INCOMPLETE."""
    from relgate.catalog.snapshot_table import resolve
    from relgate.snapshot.validate import validate_snapshot

    ws = ctx.ws()
    report = validate_snapshot(ws, resolve(ws.db, digest), actor=actor())
    return CommandResult.of({**as_object(report), "report": report.report_digest}, ok=report.ok)


@command(snapshot, "approve")
@click.argument("digest")
@click.option("--approver", required=True, help="Name of the person approving this exact digest.")
@click.option("--comment", default="")
@pass_ctx
def snapshot_approve(ctx: Ctx, digest: str, approver: str, comment: str) -> CommandOutput:
    from relgate.catalog.snapshot_table import resolve
    from relgate.snapshot.activation import approve

    ws = ctx.ws()
    return approve(ws, resolve(ws.db, digest), approver=approver, comment=comment)


@command(snapshot, "activate")
@click.argument("digest")
@click.option("--alias", required=True)
@click.option(
    "--expect-generation",
    type=int,
    default=None,
    help="CAS: the generation you read (default: current).",
)
@pass_ctx
def snapshot_activate(
    ctx: Ctx, digest: str, alias: str, expect_generation: int | None
) -> CommandOutput:
    """Switch the alias by CAS through the gate."""
    from relgate.catalog.snapshot_table import resolve
    from relgate.snapshot.activation import activate

    ws = ctx.ws()
    return activate(
        ws,
        resolve(ws.db, digest),
        alias=alias,
        actor=actor(),
        expected_generation=expect_generation,
    )


@command(snapshot, "diff")
@click.argument("old")
@click.argument("new")
@pass_ctx
def snapshot_diff(ctx: Ctx, old: str, new: str) -> CommandOutput:
    """Additions, deletions, split migrations, per-source and per-split deltas."""
    from relgate.catalog.snapshot_table import resolve
    from relgate.snapshot.compare import diff

    ws = ctx.ws()
    return diff(ws, resolve(ws.db, old), resolve(ws.db, new))


@command(snapshot, "replay")
@click.argument("digest")
@click.option(
    "--canary-bp", default=10_000, show_default=True, help="Canary size in basis points of ids."
)
@pass_ctx
def snapshot_replay(ctx: Ctx, digest: str, canary_bp: int) -> CommandOutput:
    """Re-run selection from pinned sources; requires the exact same member-id set."""
    from relgate.catalog.snapshot_table import resolve
    from relgate.snapshot.compare import replay

    ws = ctx.ws()
    return replay(ws, resolve(ws.db, digest), canary_bp=canary_bp)


@command(snapshot, "provenance")
@click.argument("digest")
@pass_ctx
def snapshot_provenance(ctx: Ctx, digest: str) -> CommandOutput:
    """Print the snapshot's in-toto/SLSA statement after verifying it: the builder key's
    signature, subjects equal to the manifest and its membership table, every material
    with a digest and equal to the manifest's pins (exit 3 otherwise)."""
    from relgate.catalog.snapshot_table import resolve
    from relgate.snapshot.provenance import verify_provenance

    ws = ctx.ws()
    return verify_provenance(ws, resolve(ws.db, digest))


def register(main: click.Group) -> None:
    main.add_command(snapshot)
