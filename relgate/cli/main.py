"""The ``relgate`` command line.

Every command takes ``--json`` and then prints exactly one JSON object on stdout.  Exit
codes: 0 ok, 1 internal error, 2 usage, 3 rejected, 4 conflict.  Errors name the object,
the failed check and the digest involved.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import click

from relgate.cli.checkpoint_commands import register as register_checkpoint
from relgate.cli.common import Ctx, _actor, command, pass_ctx
from relgate.cli.lifecycle_commands import register as register_lifecycle
from relgate.cli.release_commands import register
from relgate.errors import UsageError


@click.group()
@click.option(
    "--home",
    envvar="RELGATE_HOME",
    default=None,
    help="Workspace directory (default ./var/relgate).",
)
@click.pass_context
def main(ctx: click.Context, home: str | None) -> None:
    """relgate: pinned, signed, verified training-data snapshots behind one gate."""
    ctx.obj = Ctx(home)


@command(main, "init")
@pass_ctx
def init_cmd(ctx: Ctx) -> dict[str, Any]:
    """Create the workspace: config, catalog schema, dev signing keys, transform tags."""
    from relgate.snapshot.transforms import tag_transform
    from relgate.workspace import Workspace

    ws = Workspace.init(ctx.home)
    tags = {
        t: tag_transform(ws.db, t)
        for t in ("registry.local/normalize:v1", "registry.local/identity:v1")
    }
    return {
        "home": str(ws.home),
        "schemaVersion": ws.db.schema_version(),
        "keyid": ws.signing_key.keyid,
        "keys": {r: ws.key(r).keyid for r in ("builder", "verifier", "approver", "gate")},
        "transformTags": tags,
    }


# -- demo ---------------------------------------------------------------------------------------
@main.group()
def demo() -> None:
    """Synthetic demo corpus."""


@command(demo, "seed")
@click.option("--tickets", default=600, show_default=True)
@click.option("--seed", default=7, show_default=True)
@pass_ctx
def demo_seed(ctx: Ctx, tickets: int, seed: int) -> dict[str, Any]:
    """Generate a synthetic corpus into an Iceberg table, an object prefix and a CDC log."""
    from relgate.demo.corpus import seed_demo

    return seed_demo(ctx.ws(), tickets=tickets, seed=seed)


# -- transforms --------------------------------------------------------------------------------
@main.group()
def transform() -> None:
    """Transform image tags."""


@command(transform, "tag")
@click.argument("tag")
@click.option(
    "--digest", default=None, help="Point the tag at this digest (default: the code here)."
)
@pass_ctx
def transform_tag(ctx: Ctx, tag: str, digest: str | None) -> dict[str, Any]:
    from relgate.snapshot.transforms import tag_transform

    return {"tag": tag, "digest": tag_transform(ctx.ws().db, tag, digest)}


# -- snapshots ---------------------------------------------------------------------------------
@main.group()
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
) -> dict[str, Any]:
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
    result = build_snapshot(ws, spec, actor=_actor())
    out: dict[str, Any] = {
        "snapshot": result.digest,
        "members": result.manifest.member_count,
        "counts": result.counts,
    }
    if not no_validate:
        report = validate_snapshot(ws, result.digest, actor=_actor())
        out.update(
            state=report.outcome,
            report=report.report_digest,
            failedChecks={k: v for k, v in report.checks.items() if v},
        )
        out["_ok"] = report.ok
    else:
        out["state"] = "BUILDING"
    return out


@command(snapshot, "list")
@pass_ctx
def snapshot_list(ctx: Ctx) -> dict[str, Any]:
    from relgate.catalog.snapshot_table import list_snapshots

    return {"snapshots": list_snapshots(ctx.ws().db)}


@command(snapshot, "show")
@click.argument("digest")
@click.option("--manifest", "with_manifest", is_flag=True, help="Include the verified manifest.")
@pass_ctx
def snapshot_show(ctx: Ctx, digest: str, with_manifest: bool) -> dict[str, Any]:
    from relgate.catalog.audit import approvals, latest_report
    from relgate.catalog.snapshot_table import resolve, snapshot_history
    from relgate.snapshot.activation import describe
    from relgate.snapshot.compare import load_manifest

    ws = ctx.ws()
    digest = resolve(ws.db, digest)
    out = describe(ws, digest)
    out["history"] = snapshot_history(ws.db, digest)
    out["approvals"] = approvals(ws.db, digest)
    out["latestReport"] = latest_report(ws.db, digest, "snapshot")
    if with_manifest:
        out["manifest"] = load_manifest(ws, digest).body
    return out


@command(snapshot, "validate")
@click.argument("digest")
@pass_ctx
def snapshot_validate(ctx: Ctx, digest: str) -> dict[str, Any]:
    """Recompute from pinned sources; VALIDATED, REJECTED or INCOMPLETE."""
    from relgate.catalog.snapshot_table import resolve
    from relgate.snapshot.validate import validate_snapshot

    ws = ctx.ws()
    report = validate_snapshot(ws, resolve(ws.db, digest), actor=_actor())
    return {**report.to_json(), "report": report.report_digest, "_ok": report.ok}


@command(snapshot, "approve")
@click.argument("digest")
@click.option("--approver", required=True, help="Name of the person approving this exact digest.")
@click.option("--comment", default="")
@pass_ctx
def snapshot_approve(ctx: Ctx, digest: str, approver: str, comment: str) -> dict[str, Any]:
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
) -> dict[str, Any]:
    """Switch the alias by CAS through the gate."""
    from relgate.catalog.snapshot_table import resolve
    from relgate.snapshot.activation import activate

    ws = ctx.ws()
    return activate(
        ws,
        resolve(ws.db, digest),
        alias=alias,
        actor=_actor(),
        expected_generation=expect_generation,
    )


@command(snapshot, "diff")
@click.argument("old")
@click.argument("new")
@pass_ctx
def snapshot_diff(ctx: Ctx, old: str, new: str) -> dict[str, Any]:
    """Additions, deletions, split migrations, per-source and per-split deltas."""
    from relgate.catalog.snapshot_table import resolve
    from relgate.snapshot.compare import diff

    ws = ctx.ws()
    return diff(ws, resolve(ws.db, old), resolve(ws.db, new)).to_json()


@command(snapshot, "replay")
@click.argument("digest")
@click.option(
    "--canary-bp", default=10_000, show_default=True, help="Canary size in basis points of ids."
)
@pass_ctx
def snapshot_replay(ctx: Ctx, digest: str, canary_bp: int) -> dict[str, Any]:
    """Re-run selection from pinned sources; requires the exact same member-id set."""
    from relgate.catalog.snapshot_table import resolve
    from relgate.snapshot.compare import replay

    ws = ctx.ws()
    return replay(ws, resolve(ws.db, digest), canary_bp=canary_bp).to_json()


# -- aliases -----------------------------------------------------------------------------------
@main.group()
def alias() -> None:
    """Aliases: generation-numbered pointers to an active digest."""


@command(alias, "show")
@click.argument("name")
@pass_ctx
def alias_show(ctx: Ctx, name: str) -> dict[str, Any]:

    gate = ctx.ws().gate()
    return {**gate.alias(name).to_json(), "history": gate.alias_history(name)}


@command(alias, "rollback")
@click.argument("name")
@click.option("--to", "digest", required=True, help="A digest the alias held before.")
@click.option("--expect-generation", type=int, default=None)
@pass_ctx
def alias_rollback(
    ctx: Ctx, name: str, digest: str, expect_generation: int | None
) -> dict[str, Any]:
    """Append a higher generation pointing at an older digest (refused if fences hit it)."""
    from relgate.catalog.snapshot_table import resolve
    from relgate.snapshot.activation import rollback

    ws = ctx.ws()
    return rollback(
        ws, name, resolve(ws.db, digest), actor=_actor(), expected_generation=expect_generation
    )


# -- fences ------------------------------------------------------------------------------------
@main.group()
def fence() -> None:
    """Tombstone and benchmark fences."""


@fence.group("tombstone")
def fence_tombstone() -> None:
    """Revoked sample ids."""


@command(fence_tombstone, "add")
@click.argument("sample_ids", nargs=-1, required=True)
@click.option("--reason", required=True)
@pass_ctx
def tombstone_add(ctx: Ctx, sample_ids: tuple[str, ...], reason: str) -> dict[str, Any]:
    from relgate.snapshot.activation import add_tombstones

    return add_tombstones(ctx.ws(), list(sample_ids), reason=reason, actor=_actor()).to_json()


@fence.group("benchmark")
def fence_benchmark() -> None:
    """Benchmark items (by logical content digest) that no training set may contain."""


@command(fence_benchmark, "add")
@click.argument("content_digests", nargs=-1, required=True)
@click.option("--benchmark", required=True, help="Benchmark name.")
@pass_ctx
def benchmark_add(ctx: Ctx, content_digests: tuple[str, ...], benchmark: str) -> dict[str, Any]:
    from relgate.integrity.digests import require_digest
    from relgate.snapshot.activation import add_benchmark_items

    digests = [require_digest(d, what="content digest") for d in content_digests]
    return add_benchmark_items(ctx.ws(), digests, benchmark=benchmark, actor=_actor()).to_json()


@command(fence, "show")
@pass_ctx
def fence_show(ctx: Ctx) -> dict[str, Any]:

    gate = ctx.ws().gate()
    fences = gate.fences()
    return {
        "tombstoneWatermark": fences.tombstone_watermark,
        "benchmarkFence": fences.benchmark_fence,
        "tombstones": len(gate.tombstones()),
        "benchmarkItems": len(gate.benchmark_items()),
    }


# -- proofs and manifests ----------------------------------------------------------------------
def _trusted(ctx: Ctx, trusted: tuple[str, ...]) -> Any:
    """--trusted-key entries (PEM file, directory, or ROLE=PATH), else the workspace's keys."""
    from relgate.integrity.signing import load_trusted

    for entry in trusted:
        path = entry.partition("=")[2] if "=" in entry else entry
        if not Path(path).exists():
            raise UsageError("trusted key path does not exist", object=entry, check="trusted-keys")
    return load_trusted(trusted) if trusted else ctx.ws().trusted_keys


_TRUSTED_HELP = (
    "PEM public key, directory of keys, or ROLE=PATH (default: the workspace's trusted keys). "
    "Role and version come from file names <role>-v<N>-*.pem."
)


@command(main, "prove")
@click.argument("sample_id")
@click.option("--snapshot", "digest", default=None, help="Prove against this snapshot manifest.")
@click.option("--release", "root", default=None, help="Prove against this release root.")
@pass_ctx
def prove_cmd(ctx: Ctx, sample_id: str, digest: str | None, root: str | None) -> dict[str, Any]:
    """Print a proof bundle: the signed envelope plus an inclusion or non-inclusion proof."""
    from relgate.catalog.release_table import resolve_release
    from relgate.catalog.snapshot_table import resolve
    from relgate.release.proofs import bundle

    if (digest is None) == (root is None):
        raise UsageError("give exactly one of --snapshot or --release", check="proof-subject")
    ws = ctx.ws()
    snap = resolve(ws.db, digest) if digest else None
    release = resolve_release(ws.db, root) if root else None
    return bundle(ws, sample_id, snapshot=snap, release=release).to_json()


@command(main, "check-proof")
@click.argument("bundle_file")
@click.option("--trusted-key", "trusted", multiple=True, help=_TRUSTED_HELP)
@pass_ctx
def check_proof_cmd(ctx: Ctx, bundle_file: str, trusted: tuple[str, ...]) -> dict[str, Any]:
    """Verify a proof bundle: builder signature, root and size binding, path (no workspace
    needed with --trusted-key)."""
    from relgate.release.proofs import read_bundle

    proof = read_bundle(bundle_file)
    return proof.check(_trusted(ctx, trusted), subject=bundle_file)


@command(main, "verify-manifest")
@click.argument("envelope_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--trusted-key", "trusted", multiple=True, help=_TRUSTED_HELP)
@pass_ctx
def verify_manifest_cmd(ctx: Ctx, envelope_file: str, trusted: tuple[str, ...]) -> dict[str, Any]:
    """Check a signed relgate document (snapshot manifest, release root, report, provenance):
    trusted signature by a key whose role may sign it, strict canonical payload; for
    manifests also the schema and the recomputed digest."""
    from relgate.integrity.signing import PAYLOAD_ROLES, load_envelope, open_verified, relgate_error
    from relgate.release.root import KIND as RELEASE
    from relgate.snapshot.manifest import KIND as SNAPSHOT
    from relgate_agent import dsse

    data = load_envelope(envelope_file)
    try:
        peek = dsse.parse_json(data, what="envelope", subject=envelope_file)
    except dsse.DsseError as exc:
        raise relgate_error(exc, envelope_file) from None
    ptype = peek.get("payloadType") if isinstance(peek, dict) else None
    keys = _trusted(ctx, trusted)
    verified = open_verified(
        data,
        keys,
        payload_type=ptype if ptype in PAYLOAD_ROLES else SNAPSHOT.payload_type,
        subject=envelope_file,
    )
    out: dict[str, Any] = {
        "valid": True,
        "payloadType": verified.payload_type,
        "signedBy": {
            "keyid": verified.keyid,
            "role": verified.role.value if verified.role else None,
            "version": verified.version,
        },
    }
    for kind in (SNAPSHOT, RELEASE):
        if verified.payload_type == kind.payload_type:
            body = kind.open(data, keys, subject=envelope_file)
            out.update(schema=body["schema"], digest=body[kind.id_field])
    if verified.payload_type == SNAPSHOT.payload_type:
        out.update(snapshot=out["digest"], members=int(body["members"]["count"]))
    return out


# -- keys --------------------------------------------------------------------------------------
@main.group()
def key() -> None:
    """Role keys (builder, verifier, approver, gate): list, rotate, revoke."""


def _key_json(k: Any, revoked: frozenset[str]) -> dict[str, Any]:
    return {
        "keyid": k.keyid,
        "role": k.role.value if k.role else None,
        "version": k.version,
        "revoked": k.keyid in revoked,
    }


@command(key, "list")
@pass_ctx
def key_list(ctx: Ctx) -> dict[str, Any]:
    ws = ctx.ws()
    trusted = ws.trusted_keys
    current = {r: e["version"] for r, e in ws.config["keys"].get("roles", {}).items()}
    keys = sorted(
        (_key_json(k, trusted.revoked) for k in trusted.keys.values()),
        key=lambda k: (str(k["role"]), k["version"]),
    )
    return {"keys": keys, "current": current}


@command(key, "rotate")
@click.argument("role", type=click.Choice(["builder", "verifier", "approver", "gate"]))
@pass_ctx
def key_rotate(ctx: Ctx, role: str) -> dict[str, Any]:
    """Add a new version of ROLE's key; old versions keep verifying until revoked."""
    new = ctx.ws().rotate_key(role)
    return {"role": role, "keyid": new.keyid, "version": new.version}


@command(key, "revoke")
@click.argument("keyid")
@pass_ctx
def key_revoke(ctx: Ctx, keyid: str) -> dict[str, Any]:
    """Refuse every signature by KEYID from now on (check key-revoked)."""
    ws = ctx.ws()
    found = ws.revoke_key(keyid)
    return {**_key_json(found, frozenset({found.keyid}))}


register(main)  # release, run and permit commands
register_checkpoint(main)  # checkpoint and distribute
register_lifecycle(main)  # pin, retention, gc, size, lineage

if __name__ == "__main__":
    main()
