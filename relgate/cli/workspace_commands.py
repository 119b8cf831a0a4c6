"""``relgate init``: create the workspace."""

from __future__ import annotations

import click

from relgate.cli.common import CommandOutput, Ctx, command, pass_ctx


def register(main: click.Group) -> None:
    @command(main, "init")
    @pass_ctx
    def init_cmd(ctx: Ctx) -> CommandOutput:
        """Create the workspace: config, catalog schema, dev signing keys (``relgate demo
        seed`` registers and tags the demo's pinned transform)."""
        from relgate.catalog.db import rows
        from relgate.workspace import Workspace

        ws = Workspace.init(ctx.home)
        with ws.db.tx() as conn:
            tags = {
                str(r["tag"]): str(r["digest"])
                for r in rows(conn, "SELECT tag, digest FROM transform_tags")
            }
        return {
            "home": str(ws.home),
            "schemaVersion": ws.db.schema_version(),
            "keyid": ws.signing_key.keyid,
            "keys": {r: ws.key(r).keyid for r in ("builder", "verifier", "approver", "gate")},
            "transformTags": tags,
        }
