"""Approve, activate and roll back snapshots; advance the fences.  All through the gate."""

from __future__ import annotations

from typing import Any

from relgate.catalog.audit import latest_report, record_approval
from relgate.errors import RejectedError
from relgate.gate import FenceAdvance
from relgate.snapshot.catalog import get_snapshot
from relgate.states import transition
from relgate.workspace import Workspace


def approve(ws: Workspace, digest: str, *, approver: str, comment: str = "") -> dict[str, Any]:
    """Bind a named approval to exactly this digest (VALIDATED -> APPROVED)."""
    if not approver.strip():
        raise RejectedError(
            "approval needs the approver's name", object="approval", check="approver", digest=digest
        )
    report = latest_report(ws.db, digest, "snapshot")
    if report is None or not report["ok"]:
        raise RejectedError(
            "no passing validation report for this digest",
            object="snapshot",
            check="validation-report",
            digest=digest,
        )
    with ws.db.tx() as conn:
        transition(
            conn, "snapshot", digest, "APPROVED", actor=approver, reason=comment or "approved"
        )
        record_approval(conn, "snapshot", digest, approver, comment)
    return {
        "snapshot": digest,
        "state": "APPROVED",
        "approver": approver,
        "report": report["report_digest"],
    }


def activate(
    ws: Workspace, digest: str, *, alias: str, actor: str, expected_generation: int | None = None
) -> dict[str, Any]:
    gate = ws.gate()
    if expected_generation is None:
        expected_generation = gate.alias(alias, "snapshot").generation
    return gate.activate(
        "snapshot", alias, digest, expected_generation=expected_generation, actor=actor
    )


def rollback(
    ws: Workspace, alias: str, digest: str, *, actor: str, expected_generation: int | None = None
) -> dict[str, Any]:
    gate = ws.gate()
    if expected_generation is None:
        expected_generation = gate.alias(alias, "snapshot").generation
    return gate.rollback(
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
