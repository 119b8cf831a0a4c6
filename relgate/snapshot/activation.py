"""Approve, activate and roll back snapshots; advance the fences.  All through the gate."""

from __future__ import annotations

from typing import Any

from relgate.catalog import audit
from relgate.catalog.snapshot_table import get_snapshot
from relgate.gate.core import FenceAdvance
from relgate.workspace import Workspace


def approve(ws: Workspace, digest: str, *, approver: str, comment: str = "") -> dict[str, Any]:
    """VALIDATED -> APPROVED, bound to this digest and the approver's name."""
    return ws.sign_approval(
        audit.approve(ws.db, "snapshot", digest, approver=approver, comment=comment)
    )


def activate(
    ws: Workspace, digest: str, *, alias: str, actor: str, expected_generation: int | None = None
) -> dict[str, Any]:
    return ws.gate().activate(
        "snapshot", alias, digest, expected_generation=expected_generation, actor=actor
    )


def rollback(
    ws: Workspace, alias: str, digest: str, *, actor: str, expected_generation: int | None = None
) -> dict[str, Any]:
    return ws.gate().rollback(
        "snapshot", alias, digest, expected_generation=expected_generation, actor=actor
    )


def add_tombstones(
    ws: Workspace, sample_ids: list[str], *, reason: str, actor: str
) -> FenceAdvance:
    return ws.gate().add_tombstones(sample_ids, reason=reason, actor=actor)


def add_benchmark_items(
    ws: Workspace, digests: list[str], *, benchmark: str, actor: str
) -> FenceAdvance:
    return ws.gate().add_benchmark_items(digests, benchmark=benchmark, actor=actor)


def describe(ws: Workspace, digest: str) -> dict[str, Any]:
    row = get_snapshot(ws.db, digest)
    gate = ws.gate()
    return {**row, "fenceHits": gate.hits_for(digest)}
