"""The ``relgate`` command line: the root group and its command groups.

Every command takes ``--json`` and then prints exactly one JSON object on stdout, with
camelCase keys.  Exit codes: 0 ok, 1 internal error, 2 usage, 3 rejected, 4 conflict.  Errors
name the object, the failed check and the digest involved.  Each command group lives in its
own ``*_commands`` module; those import the core only inside the commands, so ``relgate
--help`` stays fast.
"""

from __future__ import annotations

import click

from relgate.cli import (
    alias_commands,
    checkpoint_commands,
    demo_commands,
    envelope_commands,
    fence_commands,
    gate_commands,
    key_commands,
    lifecycle_commands,
    proof_commands,
    records_commands,
    release_commands,
    snapshot_commands,
    transform_commands,
    workspace_commands,
)
from relgate.cli.common import Ctx

#: Registration order is the order ``relgate --help`` was written in.
GROUPS = (
    workspace_commands,  # init
    demo_commands,
    transform_commands,
    records_commands,
    snapshot_commands,
    alias_commands,
    fence_commands,
    gate_commands,  # gate metrics
    proof_commands,  # prove, check-proof
    envelope_commands,  # verify-manifest
    key_commands,
    release_commands,  # release, run, permit
    checkpoint_commands,  # checkpoint, distribute
    lifecycle_commands,  # pin, retention, gc, size, lineage
)


@click.group()
@click.version_option(package_name="relgate", prog_name="relgate")
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


for _group in GROUPS:
    _group.register(main)

if __name__ == "__main__":
    main()
