"""``relgate pin|lease|retention|gc|size|lineage``: pins, retention and garbage collection."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from relgate.cli.common import CommandOutput, Ctx, actor, command, pass_ctx
from relgate.cli.params import EXPIRY, JSON_FILE
from relgate.errors import NotFoundError, UsageError

if TYPE_CHECKING:
    from relgate.workspace import Workspace


def _resolve_version(ctx: Ctx, ref: str) -> tuple[Workspace, str]:
    from relgate.catalog.release_table import resolve_release
    from relgate.catalog.snapshot_table import resolve

    ws = ctx.ws()
    for resolver in (resolve_release, resolve):
        try:
            return ws, resolver(ws.db, ref)
        except NotFoundError:
            continue
    raise NotFoundError("no snapshot or release matches", object=ref, check="digest-prefix")


@click.group()
def pin() -> None:
    """Pin versions (explicit or checkpoint pins) through the gate."""


@command(pin, "add")
@click.argument("version")
@click.option("--owner", required=True, help="Who needs the version.")
@click.option("--reason", required=True, help="Why (ticket, audit, checkpoint).")
@click.option(
    "--expires",
    default=None,
    type=EXPIRY,
    help="UTC expiry: 2027-01-31T00:00:00Z, or a duration from now (30d, 12h, 90m, 2w).",
)
@click.option(
    "--checkpoint-position",
    "position",
    default=None,
    type=JSON_FILE,
    help="Saved InputPosition JSON file: makes this a checkpoint pin of the release.",
)
@pass_ctx
def pin_add(
    ctx: Ctx,
    version: str,
    owner: str,
    reason: str,
    expires: str | None,
    position: object,
) -> CommandOutput:
    """Pin VERSION (snapshot or release digest or prefix) for OWNER."""
    from relgate.holds.pins import add_pin
    from relgate.runs.reader import InputPosition

    ws, digest = _resolve_version(ctx, version)
    if position is not None and not isinstance(position, dict):
        raise UsageError(
            "--checkpoint-position must hold a JSON object (a saved InputPosition)",
            object="--checkpoint-position",
            check="checkpoint-position",
        )
    if position is not None:  # refused now, not when a resumed run reads it back
        InputPosition.from_json(position)
    return add_pin(
        ws,
        digest,
        owner=owner,
        reason=reason,
        expires_at=expires,
        kind="checkpoint" if position is not None else "explicit",
        position=position,
    ).to_json()


@command(pin, "remove")
@click.argument("pin_id")
@pass_ctx
def pin_remove(ctx: Ctx, pin_id: str) -> CommandOutput:
    """Release a pin (through the gate)."""
    from relgate.holds.pins import remove_pin

    return remove_pin(ctx.ws(), pin_id, actor=actor())


@command(pin, "list")
@click.option("--all", "include_released", is_flag=True, help="Include released pins.")
@pass_ctx
def pin_list(ctx: Ctx, include_released: bool) -> CommandOutput:
    """Explicit and checkpoint pins."""
    from relgate.holds.pins import list_pins

    return {"pins": [p.to_json() for p in list_pins(ctx.ws(), include_released=include_released)]}


@click.group()
def retention() -> None:
    """Retention policies per alias, and the audit trail's."""


@command(retention, "set")
@click.argument("alias")
@click.option("--keep-last", default=2, show_default=True, type=int)
@click.option("--keep-days", default=7, show_default=True, type=int)
@click.option("--rollback-window", default=1, show_default=True, type=int, help="Generations.")
@click.option("--keep-raw-sources/--no-keep-raw-sources", default=True, show_default=True)
@pass_ctx
def retention_set(
    ctx: Ctx,
    alias: str,
    keep_last: int,
    keep_days: int,
    rollback_window: int,
    keep_raw_sources: bool,
) -> CommandOutput:
    """Set ALIAS's retention policy."""
    from relgate.holds.retention import RetentionPolicy, set_policy

    policy = RetentionPolicy(alias, keep_last, keep_days, rollback_window, keep_raw_sources)
    return set_policy(ctx.ws().db, policy).to_json()


@command(retention, "audit")
@click.option("--keep-days", default=None, type=click.IntRange(min=0), help="Days from creation.")
@click.option("--forever", is_flag=True, help="Keep the audit trail forever (the default).")
@pass_ctx
def retention_audit(ctx: Ctx, keep_days: int | None, forever: bool) -> CommandOutput:
    """Show or set how long a collected version's audit trail is kept: its signed
    manifest, membership table, reports and approvals (default: forever)."""
    from relgate.lifecycle.audit_trail import AuditPolicy, get_audit_policy, set_audit_policy

    ws = ctx.ws()
    if forever and keep_days is not None:
        raise UsageError(
            "give --keep-days or --forever, not both",
            object="retention audit",
            check="audit-policy",
        )
    if forever or keep_days is not None:
        return set_audit_policy(ws.db, AuditPolicy(keep_days=keep_days)).to_json()
    with ws.db.tx() as conn:
        return get_audit_policy(conn).to_json()


@command(retention, "show")
@pass_ctx
def retention_show(ctx: Ctx) -> CommandOutput:
    """Retained versions and who holds each."""
    from relgate.holds.retention import now_utc, retained_versions

    ws = ctx.ws()
    with ws.db.tx() as conn:
        held = retained_versions(conn, now_utc())
    return {
        "retained": [
            {"kind": k, "digest": d, "heldBy": sorted(set(r))} for (k, d), r in sorted(held.items())
        ]
    }


@click.group()
def gc() -> None:
    """Garbage collection: plan (dry run) and sweep."""


_GRACE = click.option(
    "--grace", default="6h", show_default=True, help="Grace period (90s, 15m, 6h, 7d)."
)


@command(gc, "plan")
@_GRACE
@click.option("--limit", default=100, show_default=True, help="Candidates to list.")
@pass_ctx
def gc_plan(ctx: Ctx, grace: str, limit: int) -> CommandOutput:
    """What a sweep would delete and why; deletes nothing.  Fails closed (exit 3)."""
    from relgate.lifecycle.collector import parse_duration, plan_gc

    return plan_gc(ctx.ws(), grace_seconds=parse_duration(grace)).to_json(limit=limit)


@command(gc, "sweep")
@_GRACE
@click.option("--yes", "confirmed", is_flag=True, help="Required: actually delete.")
@pass_ctx
def gc_sweep(ctx: Ctx, grace: str, confirmed: bool) -> CommandOutput:
    """Delete candidates, each re-checked inside the gate; needs --yes."""
    from relgate.lifecycle.collector import parse_duration, sweep

    if not confirmed:
        raise UsageError(
            "gc sweep deletes objects; pass --yes (or run `relgate gc plan`)",
            object="gc",
            check="sweep-confirmed",
        )
    return sweep(ctx.ws(), actor=actor(), grace_seconds=parse_duration(grace))


@command(gc, "log")
@click.option("--run", "run_id", default=None)
@pass_ctx
def gc_log(ctx: Ctx, run_id: str | None) -> CommandOutput:
    """What sweeps deleted, and why."""
    from relgate.lifecycle.collector import deletions

    return {"deletions": [d.to_json() for d in deletions(ctx.ws(), run_id)]}


def register(main: click.Group) -> None:
    for group in (pin, retention, gc):
        main.add_command(group)

    @command(main, "size")
    @click.option("--tokens", required=True, help="Token count, e.g. 120e9.")
    @click.option("--bytes-per-token", default="4", show_default=True)
    @click.option("--shard-mb", default=256, show_default=True, type=int)
    @click.option("--compare-mb", multiple=True, type=int, help="Other sizes (default: half).")
    @click.option("--record-bytes", default=None, type=int, help="Typical record size (bytes).")
    @click.option("--workers", default=None, type=int, help="Reader workers.")
    @click.option("--target-read-mb", default=None, type=int, help="Target read size (MB).")
    def size(
        tokens: str,
        bytes_per_token: str,
        shard_mb: int,
        compare_mb: tuple[int, ...],
        record_bytes: int | None,
        workers: int | None,
        target_read_mb: int | None,
    ) -> CommandOutput:
        """Payload bytes and shard counts for a token-ID payload (decimal units)."""
        from relgate.lifecycle.sizing import parse_count, size_report

        return size_report(
            tokens=parse_count(tokens, name="tokens"),
            bytes_per_token=parse_count(bytes_per_token, name="bytes-per-token"),
            shard_mb=shard_mb,
            compare_mb=compare_mb,
            record_bytes=record_bytes,
            workers=workers,
            target_read_mb=target_read_mb,
        ).to_json()

    @command(main, "lineage")
    @click.argument("sample_id")
    @pass_ctx
    def lineage_cmd(ctx: Ctx, sample_id: str) -> CommandOutput:
        """Every version, pin, permit and run that holds SAMPLE_ID (by membership)."""
        from relgate.gate.standing import standings
        from relgate.integrity.identifiers import validate_id
        from relgate.lifecycle.lineage import lineage

        ws = ctx.ws()
        out = lineage(ws, validate_id(sample_id, where="lineage SAMPLE_ID")).to_json()
        # ACTIVE / PUBLISHED but superseded or fence-hit says so: each printed version's
        # ``state`` is its qualified one, with the marks added.
        listed = [v for v in out["versions"] if v.get("digest") and v.get("state")]
        with ws.db.tx() as conn:
            found = standings(conn, {str(v["digest"]): str(v["state"]) for v in listed})
        for version in listed:
            version.update(found[str(version["digest"])].fields())
        return out
