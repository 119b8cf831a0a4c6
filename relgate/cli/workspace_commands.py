"""``relgate init``: create the workspace."""

from __future__ import annotations

import click

from relgate.cli.common import CommandOutput, Ctx, command, pass_ctx


def register(main: click.Group) -> None:
    @command(main, "init")
    @pass_ctx
    def init_cmd(ctx: Ctx) -> CommandOutput:
        """Create the workspace: config, catalog schema, dev signing keys, transform tags."""
        from relgate.demo.corpus import tag_demo_transforms
        from relgate.workspace import Workspace

        ws = Workspace.init(ctx.home)
        tags = tag_demo_transforms(ws)
        return {
            "home": str(ws.home),
            "schemaVersion": ws.db.schema_version(),
            "keyid": ws.signing_key.keyid,
            "keys": {r: ws.key(r).keyid for r in ("builder", "verifier", "approver", "gate")},
            "transformTags": tags,
        }
