"""``relgate key``: role keys (builder, verifier, approver, gate): list, rotate, revoke."""

from __future__ import annotations

from typing import TYPE_CHECKING

import click

from relgate.cli.common import CommandOutput, Ctx, command, pass_ctx

if TYPE_CHECKING:
    from relgate.integrity.signing import TrustedKey


@click.group()
def key() -> None:
    """Role keys (builder, verifier, approver, gate): list, rotate, revoke."""


def _key_json(k: TrustedKey, revoked: frozenset[str]) -> dict[str, object]:
    return {
        "keyid": k.keyid,
        "role": k.role.value if k.role else None,
        "version": k.version,
        "revoked": k.keyid in revoked,
    }


@command(key, "list")
@pass_ctx
def key_list(ctx: Ctx) -> CommandOutput:
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
def key_rotate(ctx: Ctx, role: str) -> CommandOutput:
    """Add a new version of ROLE's key; old versions keep verifying until revoked."""
    new = ctx.ws().rotate_key(role)
    return {"role": role, "keyid": new.keyid, "version": new.version}


@command(key, "revoke")
@click.argument("keyid")
@pass_ctx
def key_revoke(ctx: Ctx, keyid: str) -> CommandOutput:
    """Refuse every signature by KEYID from now on (check key-revoked)."""
    found = ctx.ws().revoke_key(keyid)
    return _key_json(found, frozenset({found.keyid}))


def register(main: click.Group) -> None:
    main.add_command(key)
