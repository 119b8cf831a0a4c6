"""Approve, activate and roll back snapshots; advance the fences.  All through the gate.

What this layer adds to the gate: a snapshot is named by its digest or a unique hex
prefix of one (resolved in the catalog before the gate's CAS), an approval is recorded
and signed as one step, benchmark items must be content digests, and ``describe`` joins
the catalog row with the fence hits recorded against it.
"""

from __future__ import annotations

from collections.abc import Iterable

from relgate.catalog.audit import Approved
from relgate.catalog.snapshot_table import resolve
from relgate.gate.aliases import AliasChange
from relgate.gate.approvals import approve_signed
from relgate.gate.fences import FenceAdvance
from relgate.gate.transitions import open_gate
from relgate.integrity.digests import require_digest
from relgate.workspace import Workspace

#: The gate's name for the kind of version this module moves.
SNAPSHOT = "snapshot"


def approve(ws: Workspace, digest: str, *, approver: str, comment: str = "") -> Approved:
    """VALIDATED -> APPROVED, bound to this digest and the approver's name, then signed
    (an already approved or active snapshot: its existing approval, ``existing: "true"``)."""
    return approve_signed(ws, SNAPSHOT, resolve(ws.db, digest), approver=approver, comment=comment)


def activate(
    ws: Workspace, digest: str, *, alias: str, actor: str, expected_generation: int | None = None
) -> AliasChange:
    """CAS ``alias`` to the snapshot ``digest`` names (full digest or unique prefix)."""
    return open_gate(ws).activate(
        SNAPSHOT,
        alias,
        resolve(ws.db, digest),
        expected_generation=expected_generation,
        actor=actor,
    )


def rollback(
    ws: Workspace, alias: str, digest: str, *, actor: str, expected_generation: int | None = None
) -> AliasChange:
    """Point ``alias`` back at a snapshot it held before (full digest or unique prefix)."""
    return open_gate(ws).rollback(
        SNAPSHOT,
        alias,
        resolve(ws.db, digest),
        expected_generation=expected_generation,
        actor=actor,
    )


def approve_and_activate(
    ws: Workspace,
    digest: str,
    *,
    alias: str,
    approver: str,
    comment: str = "",
    expected_generation: int | None = None,
) -> AliasChange:
    """A named approval of exactly this snapshot, then the alias CAS by the same person."""
    approve(ws, digest, approver=approver, comment=comment)
    return activate(
        ws, digest, alias=alias, actor=approver, expected_generation=expected_generation
    )


def add_tombstones(
    ws: Workspace, sample_ids: Iterable[str], *, reason: str, actor: str
) -> FenceAdvance:
    """Fence sample ids out of every snapshot built at or after the new watermark."""
    return open_gate(ws).add_tombstones(list(sample_ids), reason=reason, actor=actor)


def add_benchmark_items(
    ws: Workspace, digests: Iterable[str], *, benchmark: str, actor: str
) -> FenceAdvance:
    """Fence benchmark content out by ``logicalContentDigest`` (refused unless each item
    is a ``sha256:`` digest: a benchmark item names content, never an id)."""
    items = [require_digest(d, what="content digest") for d in digests]
    return open_gate(ws).add_benchmark_items(items, benchmark=benchmark, actor=actor)
