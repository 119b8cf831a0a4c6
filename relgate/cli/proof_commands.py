"""``relgate prove`` and ``relgate check-proof``: inclusion and non-inclusion proof bundles."""

from __future__ import annotations

import click

from relgate.cli.common import TRUSTED_HELP, CommandOutput, Ctx, command, pass_ctx, trusted_keys
from relgate.errors import UsageError


def register(main: click.Group) -> None:
    @command(main, "prove")
    @click.argument("sample_id")
    @click.option(
        "--snapshot", "digest", default=None, help="Prove against this snapshot manifest."
    )
    @click.option("--release", "root", default=None, help="Prove against this release root.")
    @pass_ctx
    def prove_cmd(ctx: Ctx, sample_id: str, digest: str | None, root: str | None) -> CommandOutput:
        """Print a proof bundle: the signed envelope plus an inclusion or non-inclusion proof."""
        from relgate.catalog.release_table import resolve_release
        from relgate.catalog.snapshot_table import resolve
        from relgate.release.proofs import bundle

        if (digest is None) == (root is None):
            raise UsageError("give exactly one of --snapshot or --release", check="proof-subject")
        ws = ctx.ws()
        snap = resolve(ws.db, digest) if digest else None
        release = resolve_release(ws.db, root) if root else None
        return bundle(ws, sample_id, snapshot=snap, release=release)

    @command(main, "check-proof")
    @click.argument("bundle_file")
    @click.option("--trusted-key", "trusted", multiple=True, help=TRUSTED_HELP)
    @pass_ctx
    def check_proof_cmd(ctx: Ctx, bundle_file: str, trusted: tuple[str, ...]) -> CommandOutput:
        """Verify a proof bundle: builder signature, root and size binding, path (no workspace
        needed with --trusted-key)."""
        from relgate.release.proofs import read_bundle

        proof = read_bundle(bundle_file)
        return proof.check(trusted_keys(ctx, trusted), subject=bundle_file)
