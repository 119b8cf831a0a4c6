"""``relgate release|run|permit``: shard releases, pinned runs and gate permits."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import click

from relgate.cli.common import CommandOutput, CommandResult, Ctx, actor, command, pass_ctx
from relgate.cli.params import WORLD_SIZE
from relgate.gate.transitions import open_gate

if TYPE_CHECKING:
    from relgate.release.evolution import SchemaEvolutionReport
    from relgate.release.verify.report import ShardFinding, VerificationReport
    from relgate.runs.reader import ReaderLease
    from relgate.workspace import Workspace


@click.group()
def release() -> None:
    """Build, verify, approve, publish and roll back shard releases."""


@command(release, "build")
@click.argument("snapshot")
@click.option(
    "--shard-mb",
    default=256,
    show_default=True,
    type=int,
    help="Target stored size per shard (MB).",
)
@click.option(
    "--records-per-shard",
    default=None,
    type=int,
    help="Fixed record count per shard (overrides --shard-mb).",
)
@click.option(
    "--encrypt-key-file",
    default=None,
    type=click.Path(exists=True, dir_okay=False),
    help="32-byte AES-256-GCM key (raw bytes).",
)
@click.option("--key-version", default=None, help="Key version recorded in the root manifest.")
@pass_ctx
def release_build(
    ctx: Ctx,
    snapshot: str,
    shard_mb: int,
    records_per_shard: int | None,
    encrypt_key_file: str | None,
    key_version: str | None,
) -> CommandOutput:
    """Write parquet shards for SNAPSHOT under digest-addressed keys and sign the root."""
    from relgate.catalog.snapshot_table import resolve
    from relgate.integrity.identifiers import validate_id
    from relgate.release.writer import write_release

    if key_version is not None:
        key_version = validate_id(key_version, kind="key version", where="--key-version")
    ws = ctx.ws()
    key = Path(encrypt_key_file).read_bytes() if encrypt_key_file else None
    manifest = write_release(
        ws,
        resolve(ws.db, snapshot),
        shard_mb=shard_mb,
        records_per_shard=records_per_shard,
        encrypt_key=key,
        key_version=key_version,
        actor=actor(),
    )
    from relgate.catalog.release_table import get_release

    # The printed state is the catalog's: a rebuild that yields a root already recorded
    # (e.g. one proven INVALID) says so and is refused, never "STAGED".
    state = str(get_release(ws.db, manifest.digest).state)
    out: dict[str, object] = {
        "release": manifest.digest,
        "state": state,
        "snapshot": manifest.snapshot,
        "totals": manifest.totals.to_json(),
        "orderedMemberTupleRoot": manifest.ordered_member_tuple_root,
    }
    if state == "INVALID":
        return CommandResult.rejected(
            out,
            check="release-state",
            subject="release",
            digest=manifest.digest,
            message="this root was already proven wrong (INVALID is final)",
        )
    return out


@command(release, "verify")
@click.argument("root")
@click.option("--workers", default=2, show_default=True, help="Verifier processes.")
@click.option(
    "--key", "keys", multiple=True, help="Decryption key ring entry VERSION=PATH (32 raw bytes)."
)
@click.option(
    "--shard",
    "shards",
    multiple=True,
    help="Check only these shard ids (repeatable); records nothing and moves no state.",
)
@pass_ctx
def release_verify(
    ctx: Ctx, root: str, workers: int, keys: tuple[str, ...], shards: tuple[str, ...]
) -> CommandOutput:
    """Independent verification from exact object versions; VERIFIED or INVALID."""
    from relgate.catalog.release_table import resolve_release
    from relgate.release.crypto import key_ring
    from relgate.release.verify.report import failing_shards
    from relgate.release.verify.verifier import verify_release, verify_shards

    ws = ctx.ws()
    digest = resolve_release(ws.db, root)
    if shards:
        subset = verify_shards(ws, digest, shards, workers=workers, keys=key_ring(keys))
        if subset.ok:
            return CommandResult(subset.to_json())
        failed = [s["id"] for s in subset.shards if not s["ok"]] + list(subset.unknown_shards)
        return CommandResult.rejected(
            subset.to_json(),
            check="verification",
            message=f"shards failed their checks or are not in the root: {failed}",
            subject="release",
            digest=digest,
        )
    report = verify_release(ws, digest, workers=workers, keys=key_ring(keys), actor=actor())
    return verify_result(report, failing_shards(ws, report))


#: Catalog states in which a passing verification leaves the release usable.
_GOOD_STATES = ("VERIFIED", "APPROVED", "PUBLISHED")


def verify_result(
    report: VerificationReport, findings: Sequence[ShardFinding] = ()
) -> CommandResult:
    """Exit code and printed state always agree with the catalog row after the attempt;
    each failing shard is listed with its check and the expected and actual values."""
    out: dict[str, object] = {**report.summary(), "counts": report.counts}
    if findings:
        out["failingShards"] = [f.to_json() for f in findings]
    if report.ok and report.state in _GOOD_STATES:
        return CommandResult(out)
    if report.outcome == "UNAVAILABLE":
        check = report.unavailable[0]
        message = (
            f"verification could not complete ({', '.join(report.unavailable)});"
            f" the release stays {report.state} and can be verified again"
        )
    elif report.outcome == "INVALID":
        check = "verification"
        message = f"proven wrong: {sorted(report.failing)}; INVALID is final"
    else:
        check = "release-state"
        message = f"verification passed but the release is {report.state} (final)"
    refused = CommandResult.rejected(
        out, check=check, message=message, subject="release", digest=report.root
    )
    lines = [
        f"release {report.root}: {report.outcome.value} (state {report.state})",
        f"{check}: {message}",
        *(f"  {name} = {count}" for name, count in sorted(report.failing.items())),
        *(f"  {finding.line()}" for finding in findings),
    ]
    return CommandResult(refused.body, refused.exit_code, text="\n".join(lines))


@command(release, "schema-diff")
@click.argument("old")
@click.argument("new")
@pass_ctx
def release_schema_diff(ctx: Ctx, old: str, new: str) -> CommandOutput:
    """Compare the record schemas of two releases (or snapshots) for the declared readers."""
    from relgate.release.evolution import schema_diff

    ws = ctx.ws()
    report = schema_diff(ws, _schema_subject(ws, old), _schema_subject(ws, new))
    return CommandResult(report, text=_evolution_text(report))


def _schema_subject(ws: Workspace, ref: str) -> str:
    """A release root digest (or unique prefix), else a snapshot's."""
    from relgate.catalog.release_table import resolve_release
    from relgate.catalog.snapshot_table import resolve
    from relgate.errors import NotFoundError

    try:
        return resolve_release(ws.db, ref)
    except NotFoundError:
        return resolve(ws.db, ref)


def _evolution_text(report: SchemaEvolutionReport) -> str:
    """The report as a readable listing (without ``--json``)."""
    old = f"{report.old.kind} {report.old.subject}" if report.old else "none (first release)"
    lines = [f"old: {old}", f"new: {report.new.kind} {report.new.subject}"]
    lines += [f"  + {f.name}: {f.type}{'?' if f.nullable else ''}" for f in report.added]
    lines += [f"  - {f.name}: {f.type}{'?' if f.nullable else ''}" for f in report.removed]
    lines += [f"  ~ {r.old_name} -> {r.new_name} (renamed)" for r in report.renamed]
    lines += [
        f"  ~ {c.column}: {c.old_type}{'?' if c.old_nullable else ''} -> "
        f"{c.new_type}{'?' if c.new_nullable else ''} ({c.change})"
        for c in report.type_changes
    ]
    for name, change in (("content", report.content), ("label", report.label)):
        if change.changed:
            lines.append(f"  {name}: {list(change.old)} -> {list(change.new)}")
    if report.token_rule.changed:
        old_rule = report.token_rule.old.kind if report.token_rule.old else None
        lines.append(f"  tokens: {old_rule} -> {report.token_rule.new.kind}")
    lines.append("readers:" if report.readers else "readers: none declared")
    for verdict in report.readers:
        lines.append(f"  {verdict.reader}: {verdict.verdict}")
        lines += [f"    - {reason}" for reason in verdict.reasons]
    return "\n".join(lines)


@command(release, "approve")
@click.argument("root")
@click.option("--approver", required=True)
@click.option("--comment", default="")
@pass_ctx
def release_approve(ctx: Ctx, root: str, approver: str, comment: str) -> CommandOutput:
    """Bind a named approval to the root digest (never a directory)."""
    from relgate.catalog.release_table import resolve_release
    from relgate.release.publication import approve_release

    ws = ctx.ws()
    return approve_release(ws, resolve_release(ws.db, root), approver=approver, comment=comment)


@command(release, "publish")
@click.argument("root")
@click.option("--alias", required=True)
@click.option("--expect-generation", type=int, default=None)
@pass_ctx
def release_publish(
    ctx: Ctx, root: str, alias: str, expect_generation: int | None
) -> CommandOutput:
    """Switch the release alias by CAS through the gate."""
    from relgate.catalog.release_table import resolve_release
    from relgate.release.publication import publish

    ws = ctx.ws()
    return publish(
        ws,
        resolve_release(ws.db, root),
        alias=alias,
        actor=actor(),
        expected_generation=expect_generation,
    )


@command(release, "rollback")
@click.argument("alias")
@click.option("--to", "root", required=True)
@click.option("--expect-generation", type=int, default=None)
@pass_ctx
def release_rollback(
    ctx: Ctx, alias: str, root: str, expect_generation: int | None
) -> CommandOutput:
    """Point the alias at an older root if both its watermarks still satisfy the gate."""
    from relgate.catalog.release_table import resolve_release
    from relgate.release.publication import rollback_release

    ws = ctx.ws()
    return rollback_release(
        ws,
        alias,
        resolve_release(ws.db, root),
        actor=actor(),
        expected_generation=expect_generation,
    )


@command(release, "show")
@click.argument("root")
@click.option("--manifest", "with_manifest", is_flag=True)
@pass_ctx
def release_show(ctx: Ctx, root: str, with_manifest: bool) -> CommandOutput:
    from relgate.catalog.audit import approvals, latest_report
    from relgate.catalog.release_table import get_release, resolve_release
    from relgate.catalog.states import history
    from relgate.documents import release_root as rm
    from relgate.gate.standing import standing_of

    ws = ctx.ws()
    digest = resolve_release(ws.db, root)
    row = get_release(ws.db, digest)
    with ws.db.tx() as conn:
        events = history(conn, "release", digest)
        standing = standing_of(conn, digest, str(row.state))  # PUBLISHED but superseded...
    from relgate.catalog.release_table import verification_attempts

    out: dict[str, object] = {
        **row.to_json(),
        **standing.fields(),
        "history": events,
        "verificationAttempts": verification_attempts(ws.db, digest),
        "approvals": approvals(ws.db, digest),
        "latestReport": latest_report(ws.db, digest, "release"),
        "fenceHits": open_gate(ws).hits_for(digest),
    }
    if with_manifest:
        out["manifest"] = rm.load_document(ws.store, ws.trusted_keys, digest, row.envelope_version)
    return out


@command(release, "audit")
@click.argument("root")
@click.option("--reason", required=True, help="Why this root is looked at (recorded).")
@click.option("--shard", "shards", multiple=True, help="Audit only this shard id (repeatable).")
@click.option("--key", "keys", multiple=True, help="Decryption key ring entry VERSION=PATH.")
@pass_ctx
def release_audit(
    ctx: Ctx, root: str, reason: str, shards: tuple[str, ...], keys: tuple[str, ...]
) -> CommandOutput:
    """Audit a root without a run (any state, INVALID or revoked included): each shard is
    checked from its exact version as the reader checks it and counted; no record is
    printed or handed to training. Recorded as an audit-read gate event; a failing shard
    exits 3 naming its check."""
    from relgate.catalog.release_table import resolve_release
    from relgate.release.crypto import key_ring
    from relgate.runs.reader import audit_root

    ws = ctx.ws()
    digest = resolve_release(ws.db, root)
    found = audit_root(
        ws,
        digest,
        actor=actor(),
        reason=reason,
        shards=list(shards) or None,
        keys=key_ring(keys),
    )
    failing = [s for s in found.shards if not s.ok]
    if not failing:
        return found
    return CommandResult.rejected(
        found,
        check=str(failing[0].check),
        message=f"{len(failing)} of {len(found.shards)} shards failed the audit",
        subject=failing[0].id,
        digest=digest,
    )


@command(release, "provenance")
@click.argument("root")
@pass_ctx
def release_provenance(ctx: Ctx, root: str) -> CommandOutput:
    """Print the release's in-toto/SLSA statement after verifying it: the verifier key's
    signature, subjects equal to the root and every shard, every material with a digest
    and equal to the root's snapshot (exit 3 otherwise)."""
    from relgate.catalog.release_table import resolve_release
    from relgate.release.verify.attest import verify_provenance

    ws = ctx.ws()
    return verify_provenance(ws, resolve_release(ws.db, root))


@command(release, "list")
@pass_ctx
def release_list(ctx: Ctx) -> CommandOutput:
    from relgate.catalog.release_table import list_releases

    return {"releases": list_releases(ctx.ws().db)}


# -- runs ----------------------------------------------------------------------------------
@click.group()
def run() -> None:
    """Training runs pinned to one root digest."""


@command(run, "create")
@click.option("--root", default=None, help="Admit this exact root digest (or unique prefix).")
@click.option("--alias", default=None, help="Resolve this release alias once; record its root.")
@click.option(
    "--expect-generation",
    type=int,
    default=None,
    help="With --alias: refuse (exit 4) unless the alias is still at this generation.",
)
@click.option("--purpose", required=True)
@click.option("--world-size", required=True, type=WORLD_SIZE, help="Ranks (1 to 131072).")
@pass_ctx
def run_create(
    ctx: Ctx,
    root: str | None,
    alias: str | None,
    expect_generation: int | None,
    purpose: str,
    world_size: int,
) -> CommandOutput:
    """Admit a run on an exact root (or the alias's root, read once) and issue its permit."""
    from relgate.catalog.release_table import resolve_release
    from relgate.errors import UsageError
    from relgate.runs.admission import admit_run

    if root is None and alias is None:
        raise UsageError("give --root DIGEST or --alias NAME", object="run", check="root")
    ws = ctx.ws()
    return admit_run(
        ws,
        root=resolve_release(ws.db, root) if root is not None else None,
        alias=alias,
        expected_generation=expect_generation,
        purpose=purpose,
        world_size=world_size,
        actor=actor(),
    )


@command(run, "finish")
@click.argument("run_id")
@click.option("--reason", default="finished")
@pass_ctx
def run_finish(ctx: Ctx, run_id: str, reason: str) -> CommandOutput:
    """RUNNING -> FINISHED: close the permit and release the run's hold on its root."""
    from relgate.runs.run_end import finish_run

    return finish_run(ctx.ws(), run_id, actor=actor(), reason=reason).to_json()


@command(run, "cancel")
@click.argument("run_id")
@click.option("--reason", default="cancelled")
@pass_ctx
def run_cancel(ctx: Ctx, run_id: str, reason: str) -> CommandOutput:
    """ADMITTED or RUNNING -> CANCELLED: close the permit and release the hold."""
    from relgate.runs.run_end import cancel_run

    return cancel_run(ctx.ws(), run_id, actor=actor(), reason=reason).to_json()


@command(run, "list")
@click.option(
    "--state",
    type=click.Choice(["ADMITTED", "RUNNING", "FINISHED", "CANCELLED", "REVOKED", "FAILED"]),
    default=None,
)
@pass_ctx
def run_list(ctx: Ctx, state: str | None) -> CommandOutput:
    from relgate.runs.store import list_runs

    return {"runs": list_runs(ctx.ws().db, state=state)}


class _Readiness:
    """The worker's readiness, as the metrics gauge and the optional /ready probe show it."""

    def __init__(self, root: str, probe_port: int | None) -> None:
        from relgate.release.metrics import Probe, ReleaseMetrics

        self.root = root
        self.metrics = ReleaseMetrics()
        self.probe = Probe(self.metrics, port=probe_port) if probe_port is not None else None

    def set(self, ready: bool) -> None:
        self.metrics.ready.labels(self.root).set(1 if ready else 0)
        if self.probe is not None:
            self.probe.is_ready = ready

    def close(self) -> None:
        if self.probe is not None:
            self.probe.close()


def _hold(
    ws: Workspace, run_id: str, lease: ReaderLease, readiness: _Readiness, hold: tuple[float, float]
) -> str:
    """Stay up until the run ends; its final state, or exit 3 (after lingering) if revoked."""
    import time

    from relgate.errors import RejectedError
    from relgate.runs.store import watch_run

    hold_timeout, linger = hold
    ended = watch_run(ws, run_id, lease=lease, timeout=hold_timeout)
    state = ended.state
    if state in ("FINISHED", "CANCELLED"):
        return state
    readiness.set(False)
    reason = ended.end_reason or "permit closed"
    time.sleep(max(0.0, linger))  # orchestrators see not-ready before the exit
    raise RejectedError(
        f"run revoked after step 0: {reason}",
        object=run_id,
        check="run-revoked",
        digest=readiness.root,
        details={"state": state},
    )


@command(run, "worker")
@click.option("--run", "run_id", required=True)
@click.option("--rank", required=True, type=int)
@click.option("--barrier-timeout", default=60.0, show_default=True)
@click.option(
    "--probe-port", default=None, type=int, help="Serve /ready and /metrics on 127.0.0.1:PORT."
)
@click.option(
    "--hold/--no-hold",
    default=None,
    help="After the barrier, stay up (lease, probe) until the run ends. Default: on with --probe-port.",
)
@click.option(
    "--hold-timeout", default=7 * 24 * 3600.0, show_default=True, help="Bound on --hold (s)."
)
@click.option(
    "--linger",
    default=10.0,
    show_default=True,
    help="On revocation, keep serving not-ready this long before exiting (s).",
)
@click.option("--lease-ttl", default=60, show_default=True, help="Reader lease TTL (s).")
@click.option("--key", "keys", multiple=True, help="Decryption key ring entry VERSION=PATH.")
@pass_ctx
def run_worker_cmd(  # noqa: PLR0913, PLR0917 - one parameter per click option
    ctx: Ctx,
    run_id: str,
    rank: int,
    barrier_timeout: float,
    probe_port: int | None,
    hold: bool | None,
    hold_timeout: float,
    linger: float,
    lease_ttl: int,
    keys: tuple[str, ...],
) -> CommandOutput:
    """Verify this rank's shards, report (runId, rootDigest, shardDigests), wait for the barrier.

    The worker holds a reader lease on the root for its life.  With --hold (the default
    when a probe is served) it stays up after the barrier, serving /ready for the run's
    life: 200 while the run is RUNNING, 503 once it is revoked (exit 3 after --linger),
    exit 0 when the run is finished or cancelled.
    """
    from relgate.release.crypto import key_ring
    from relgate.runs.rank_worker import run_worker
    from relgate.runs.reader import ReaderLease
    from relgate.runs.store import get_run

    ws = ctx.ws()
    root = get_run(ws.db, run_id).root_digest
    readiness = _Readiness(root, probe_port)
    lease: ReaderLease | None = None
    try:
        lease = ReaderLease(ws, root, holder=f"{run_id}/rank-{rank}", ttl_seconds=lease_ttl)
        result = run_worker(
            ws,
            run_id,
            rank,
            keys=key_ring(keys),
            barrier_timeout=barrier_timeout,
            on_verified=lambda _result: readiness.set(True),
            lease=lease,
        )
        readiness.metrics.barrier_wait.labels(root, str(rank)).set(result.barrier_wait_s)
        if hold if hold is not None else probe_port is not None:
            result.state = _hold(ws, run_id, lease, readiness, (hold_timeout, linger))
        return result
    finally:
        if lease is not None:
            lease.close()
        readiness.close()


@command(run, "status")
@click.argument("run_id")
@pass_ctx
def run_status_cmd(ctx: Ctx, run_id: str) -> CommandOutput:
    from relgate.runs.store import run_status

    return run_status(ctx.ws().db, run_id)


@command(run, "rescale")
@click.argument("run_id")
@click.option("--world-size", required=True, type=WORLD_SIZE, help="Ranks (1 to 131072).")
@pass_ctx
def run_rescale(ctx: Ctx, run_id: str, world_size: int) -> CommandOutput:
    """New assignment epoch over the run's root (never rereads the alias)."""
    from relgate.runs.assignment import rescale

    return rescale(ctx.ws(), run_id, world_size).to_json()


# -- permits -------------------------------------------------------------------------------
@click.group()
def permit() -> None:
    """Gate permits."""


@command(permit, "list")
@click.option("--root", default=None)
@click.option("--state", type=click.Choice(["OPEN", "CLOSED"]), default=None)
@pass_ctx
def permit_list(ctx: Ctx, root: str | None, state: str | None) -> CommandOutput:
    from relgate.catalog.permit_table import list_permits

    return {"permits": list_permits(ctx.ws().db, root=root, state=state)}


@command(permit, "show")
@click.argument("permit_id")
@pass_ctx
def permit_show(ctx: Ctx, permit_id: str) -> CommandOutput:
    from relgate.catalog.permit_table import get_permit

    return get_permit(ctx.ws().db, permit_id)


def register(main: click.Group) -> None:
    for group in (release, run, permit):
        main.add_command(group)
