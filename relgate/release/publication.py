"""Approve, publish and roll back shard releases through the gate."""

from __future__ import annotations

from relgate.catalog import audit
from relgate.gate.aliases import AliasChange
from relgate.workspace import Workspace


def approve_release(
    ws: Workspace, root: str, *, approver: str, comment: str = ""
) -> dict[str, str]:
    """VERIFIED -> APPROVED, bound to the root digest (never a directory) and a name."""
    return ws.sign_approval(
        audit.approve(ws.db, "release", root, approver=approver, comment=comment)
    )


def publish(
    ws: Workspace, root: str, *, alias: str, actor: str, expected_generation: int | None = None
) -> AliasChange:
    """CAS ``alias`` to the verified, approved root (publication is an activation)."""
    return ws.gate().activate(
        "release", alias, root, expected_generation=expected_generation, actor=actor
    )


def rollback_release(
    ws: Workspace, alias: str, root: str, *, actor: str, expected_generation: int | None = None
) -> AliasChange:
    """Point ``alias`` back at a root it held before."""
    return ws.gate().rollback(
        "release", alias, root, expected_generation=expected_generation, actor=actor
    )
