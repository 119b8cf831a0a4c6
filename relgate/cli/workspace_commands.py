"""``relgate init``: create the workspace; ``relgate migrate``: bring its catalog up to date."""

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

    @command(main, "migrate")
    @pass_ctx
    def migrate_cmd(ctx: Ctx) -> CommandOutput:
        """Apply the catalog migrations this relgate has and the catalog lacks (opening a
        workspace never does: a Dagster step, a sensor or a CLI command refuses a catalog
        that is behind, check ``catalog-schema``)."""
        from relgate.catalog.db import Database
        from relgate.workspace import Workspace

        db = Database(Workspace.open(ctx.home).catalog_url)
        try:
            applied = db.migrate()
            return {"applied": applied, "schemaVersion": db.schema_version()}
        finally:
            db.dispose()
