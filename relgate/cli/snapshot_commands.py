"""``relgate snapshot``: build, validate, approve, activate, diff and replay dataset snapshots."""

from __future__ import annotations

from typing import TYPE_CHECKING

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
from relgate.gate.transitions import open_gate

if TYPE_CHECKING:
    from relgate.snapshot.diff import SnapshotDiff
    from relgate.snapshot.validate import ValidationReport


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
@click.option(
    "--allow-empty",
    is_flag=True,
    help="Build a snapshot with no member instead of refusing it (check empty-selection).",
)
@pass_ctx
def snapshot_build(
    ctx: Ctx,
    purpose: str | None,
    transform_spec: str | None,
    parents: tuple[str, ...],
    alias: str,
    sources: tuple[str, ...],
    no_validate: bool,
    allow_empty: bool,
) -> CommandOutput:
    """Freeze fences and sources, select members, sign the manifest, then validate.
    An unknown --source (source-unknown) or an empty selection (empty-selection) is
    refused, exit 3, unless --allow-empty."""
    from relgate.snapshot.build import BuildSpec, build_snapshot
    from relgate.snapshot.validate import validate_snapshot

    ws = ctx.ws()
    spec = BuildSpec.from_config(ws.config)
    if purpose:
        spec.purpose = purpose
    if transform_spec:
        spec.transform = transform_spec
    active = open_gate(ws).alias(alias, "snapshot").active_digest
    spec.parents = list(parents) or ([active] if active else [])
    spec.source_ids = list(sources) or None
    spec.allow_empty = spec.allow_empty or allow_empty
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
    from relgate.catalog.snapshot_table import (
        get_snapshot,
        resolve,
        snapshot_history,
        snapshot_reports,
    )
    from relgate.gate.standing import standing_of
    from relgate.snapshot.diff import load_manifest

    ws = ctx.ws()
    digest = resolve(ws.db, digest)
    row = get_snapshot(ws.db, digest)
    out: dict[str, object] = {
        **row.to_json(),
        "fenceHits": [hit.to_json() for hit in open_gate(ws).hits_for(row.digest)],
    }
    with ws.db.tx() as conn:  # ACTIVE but superseded or fence-hit says so
        out.update(standing_of(conn, digest, str(out["state"])).fields())
    out["history"] = snapshot_history(ws.db, digest)
    out["approvals"] = approvals(ws.db, digest)
    out["latestReport"] = latest_report(ws.db, digest, "snapshot")
    out["reports"] = [r.to_json() for r in snapshot_reports(ws.db, digest)]
    if with_manifest:
        out["manifest"] = load_manifest(ws, digest).body
    return out


def _validation_output(report: ValidationReport) -> CommandResult:
    """The report; a failing one exits 3 naming its first failing check."""
    body = {**as_object(report), "report": report.report_digest}
    if report.ok:
        return CommandResult.of(body, ok=True)
    return CommandResult.rejected(
        body,
        check=str(report.primary_check),
        message=f"snapshot {report.outcome}: {sorted(report.failing)}",
        subject="snapshot",
        digest=report.snapshot,
    )


@command(snapshot, "validate")
@click.argument("digest")
@pass_ctx
def snapshot_validate(ctx: Ctx, digest: str) -> CommandOutput:
    """Recompute from pinned sources; VALIDATED, REJECTED or INCOMPLETE (signed report)."""
    from relgate.catalog.snapshot_table import resolve
    from relgate.snapshot.validate import validate_snapshot

    ws = ctx.ws()
    return _validation_output(validate_snapshot(ws, resolve(ws.db, digest), actor=actor()))


@command(snapshot, "reports")
@click.argument("digest")
@click.option("--kind", type=click.Choice(["validation", "replay"]), default=None)
@click.option("--verify", is_flag=True, help="Open every report: content address and signature.")
@pass_ctx
def snapshot_reports(ctx: Ctx, digest: str, kind: str | None, verify: bool) -> CommandOutput:
    """The snapshot's signed reports; with --verify each is opened (a tampered one: exit 3)."""
    from relgate.catalog.snapshot_table import resolve, snapshot_reports
    from relgate.snapshot.replay import ReplayReport
    from relgate.snapshot.reports import open_report
    from relgate.snapshot.validate import ValidationReport

    ws = ctx.ws()
    digest = resolve(ws.db, digest)
    rows = snapshot_reports(ws.db, digest, kind)
    if not verify:
        return {"snapshot": digest, "reports": [r.to_json() for r in rows]}
    models: dict[str, type[ValidationReport] | type[ReplayReport]] = {
        "validation": ValidationReport,
        "replay": ReplayReport,
    }
    opened = [
        {**r.to_json(), "verified": True, "body": open_report(ws, r, models[r.kind]).to_json()}
        for r in rows
    ]
    return {"snapshot": digest, "reports": opened}


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
    from relgate.snapshot.diff import diff

    ws = ctx.ws()
    result = diff(ws, resolve(ws.db, old), resolve(ws.db, new))
    return CommandResult(result, text=_diff_text(result))


_BAR = 24


def _bar(value: int, top: int) -> str:
    width = 0 if top == 0 else round(_BAR * value / top)
    return ("#" * width).ljust(_BAR)


def _rows_text(title: str, rows: list[tuple[str, int | None, int | None]]) -> list[str]:
    """A titled table of old/new counts with a bar per side."""
    top = max([v or 0 for _, a, b in rows for v in (a, b)] or [0])
    lines = [f"{title}", f"  {'':<14}{'old':>9}{'new':>9}{'delta':>9}  old / new"]
    for name, a, b in rows:
        delta = "" if a is None or b is None else f"{b - a:+d}"
        shown_a = "-" if a is None else str(a)
        shown_b = "-" if b is None else str(b)
        lines.append(
            f"  {name:<14}{shown_a:>9}{shown_b:>9}{delta:>9}"
            f"  |{_bar(a or 0, top)}| |{_bar(b or 0, top)}|"
        )
    return lines


def _diff_text(result: SnapshotDiff) -> str:
    """The diff as readable tables with ASCII bars (without ``--json``)."""
    lines = [
        f"old: {result.old}",
        f"new: {result.new}",
        f"members: {result.counts.old} -> {result.counts.new} (+{result.additions}"
        f" -{result.deletions}, {result.content_changes} content changes)",
    ]
    lines += [f"  split migration {k}: {v}" for k, v in sorted(result.split_migrations.items())]
    dist = result.distributions
    if dist is None:
        lines += _rows_text("by split", [(k, v.old, v.new) for k, v in result.by_split.items()])
        lines += _rows_text("by source", [(k, v.old, v.new) for k, v in result.by_source.items()])
        lines.append("distributions: not available (a snapshot without statistics)")
        return "\n".join(lines)
    lines += _rows_text(
        f"by split (divergence {dist.split_divergence_ppm} ppm)",
        [(r.name, r.old, r.new) for r in dist.by_split],
    )
    lines += _rows_text(
        f"by source (divergence {dist.source_divergence_ppm} ppm)",
        [(r.name, r.old, r.new) for r in dist.by_source],
    )
    for hist in (dist.token_lengths, *dist.token_lengths_by_split):
        used = [b for b in hist.buckets if b.old or b.new]
        lines += _rows_text(
            f"token length, {hist.name} (divergence {hist.divergence_ppm} ppm)",
            [(b.range, b.old, b.new) for b in used],
        )
    if dist.label is not None:
        rows = [(str(r.value), r.old, r.new) for r in dist.label.values]
        rows.append(("(other)", dist.label.other.old, dist.label.other.new))
        lines += _rows_text(
            f"label {dist.label.column} (divergence {dist.label.divergence_ppm} ppm)", rows
        )
    return "\n".join(lines)


@command(snapshot, "replay")
@click.argument("digest")
@click.option(
    "--canary-bp", default=10_000, show_default=True, help="Canary size in basis points of ids."
)
@click.option(
    "--comparator",
    "comparator_name",
    type=click.Choice(["relgate.replay.exact", "relgate.replay.numeric"]),
    default="relgate.replay.exact",
    show_default=True,
)
@click.option(
    "--tolerance", default=None, help="Absolute tolerance for numeric columns (a decimal)."
)
@click.option("--show", is_flag=True, help="Open and verify the newest stored replay report.")
@pass_ctx
def snapshot_replay(
    ctx: Ctx,
    digest: str,
    canary_bp: int,
    comparator_name: str,
    tolerance: str | None,
    show: bool,
) -> CommandOutput:
    """Re-run selection from pinned sources over a canary; sign and store the report.
    The member-id set must match exactly; content by the comparator (exit 3 if not)."""
    from relgate.catalog.snapshot_table import resolve
    from relgate.snapshot.comparator import Comparator
    from relgate.snapshot.replay import REPLAY_CHECK, newest_replay, replay

    ws = ctx.ws()
    digest = resolve(ws.db, digest)
    if show:
        report = newest_replay(ws, digest)
    else:
        comparator = Comparator.of(comparator_name, tolerance)
        report = replay(ws, digest, canary_bp=canary_bp, comparator=comparator, actor=actor())
    body = {**as_object(report), "report": report.report_digest}
    if report.identical:
        return CommandResult.of(body, ok=True)
    return CommandResult.rejected(
        body,
        check=REPLAY_CHECK,
        message="replay from pinned sources does not reproduce the member set",
        subject="snapshot",
        digest=digest,
    )


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
