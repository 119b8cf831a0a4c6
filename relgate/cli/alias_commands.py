"""``relgate alias``: generation-numbered pointers to an active digest."""

from __future__ import annotations

import click

from relgate.cli.common import CommandOutput, Ctx, actor, as_object, command, pass_ctx
from relgate.gate.transitions import open_gate


@click.group()
def alias() -> None:
    """Aliases: generation-numbered pointers to an active digest."""


@command(alias, "show")
@click.argument("name")
@pass_ctx
def alias_show(ctx: Ctx, name: str) -> CommandOutput:
    """The alias as it stands (a snapshot or a release alias) and its history; every
    digest with its state now (SUPERSEDED, FENCE-HIT: relgate/gate/standing.py)."""
    from relgate.gate.standing import catalog_states, standings

    ws = ctx.ws()
    gate = open_gate(ws)
    kind = gate.alias_kind(name) or "snapshot"
    state = as_object(gate.alias(name, kind))
    history = [as_object(entry) for entry in gate.alias_history(name)]
    with ws.db.tx() as conn:
        digests = [str(e["digest"]) for e in history]
        if state.get("activeDigest"):
            digests.append(str(state["activeDigest"]))
        found = standings(conn, catalog_states(conn, kind, digests))
    for entry in history:
        if str(entry["digest"]) in found:
            standing = found[str(entry["digest"])]
            entry.update(state=standing.state, marks=list(standing.marks))
    active = found.get(str(state.get("activeDigest")))
    if active is not None:
        state.update(activeState=active.state, activeMarks=list(active.marks))
    return {**state, "history": history}


@command(alias, "rollback")
@click.argument("name")
@click.option("--to", "digest", required=True, help="A digest the alias held before.")
@click.option("--expect-generation", type=int, default=None)
@pass_ctx
def alias_rollback(
    ctx: Ctx, name: str, digest: str, expect_generation: int | None
) -> CommandOutput:
    """Append a higher generation pointing at an older digest (refused if fences hit it)."""
    from relgate.catalog.snapshot_table import resolve
    from relgate.snapshot.activation import rollback

    ws = ctx.ws()
    return rollback(
        ws, name, resolve(ws.db, digest), actor=actor(), expected_generation=expect_generation
    )


def register(main: click.Group) -> None:
    main.add_command(alias)
