"""Approve, publish and roll back shard releases through the gate."""

from __future__ import annotations

from relgate.catalog.audit import Approved
from relgate.catalog.versions import read_release
from relgate.gate.aliases import AliasChange
from relgate.gate.approvals import approve_signed
from relgate.gate.transitions import open_gate
from relgate.release.evolution import require_readable
from relgate.workspace import Workspace


def approve_release(ws: Workspace, root: str, *, approver: str, comment: str = "") -> Approved:
    """VERIFIED -> APPROVED, bound to the root digest (never a directory) and a name.

    Refused (check ``schema-compatibility``) when a declared reader cannot read the root,
    and (check ``approval``) unless its snapshot carries a signed approval.
    An already approved or published root returns its existing approval (``existing``)."""
    require_readable(ws, root)
    with ws.db.gate_tx() as conn:  # its snapshot's approval is re-opened, not its row read
        snapshot = read_release(conn, root).snapshot_digest
        open_gate(ws).require_approved(conn, "snapshot", snapshot)
    return approve_signed(ws, "release", root, approver=approver, comment=comment)


def publish(
    ws: Workspace, root: str, *, alias: str, actor: str, expected_generation: int | None = None
) -> AliasChange:
    """CAS ``alias`` to the verified, approved root (publication is an activation).

    Refused (check ``schema-compatibility``, exit 3) when the root's stored schema-evolution
    report says a declared reader cannot read it, or there is no current report."""
    require_readable(ws, root)
    return open_gate(ws).activate(
        "release", alias, root, expected_generation=expected_generation, actor=actor
    )


def rollback_release(
    ws: Workspace, alias: str, root: str, *, actor: str, expected_generation: int | None = None
) -> AliasChange:
    """Point ``alias`` back at a root it held before (refused, like a publication, when a
    declared reader cannot read it)."""
    require_readable(ws, root)
    return open_gate(ws).rollback(
        "release", alias, root, expected_generation=expected_generation, actor=actor
    )
