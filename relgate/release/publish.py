"""Approve, publish and roll back shard releases through the gate."""

from __future__ import annotations

from typing import Any

from relgate.catalog.audit import latest_report, record_approval
from relgate.errors import RejectedError
from relgate.states import transition
from relgate.workspace import Workspace


def approve_release(
    ws: Workspace, root: str, *, approver: str, comment: str = ""
) -> dict[str, Any]:
    """Bind a named approval to exactly this root digest (VERIFIED -> APPROVED)."""
    if not approver.strip():
        raise RejectedError(
            "approval needs the approver's name", object="approval", check="approver", digest=root
        )
    report = latest_report(ws.db, root, "release")
    if report is None or not report["ok"]:
        raise RejectedError(
            "no passing verification report for this root",
            object="release",
            check="verification-report",
            digest=root,
        )
    with ws.db.tx() as conn:
        transition(conn, "release", root, "APPROVED", actor=approver, reason=comment or "approved")
        record_approval(conn, "release", root, approver, comment)
    return {
        "release": root,
        "state": "APPROVED",
        "approver": approver,
        "report": report["report_digest"],
    }


def publish(
    ws: Workspace, root: str, *, alias: str, actor: str, expected_generation: int | None = None
) -> dict[str, Any]:
    gate = ws.gate()
    if expected_generation is None:
        expected_generation = gate.alias(alias, "release").generation
    return gate.activate(
        "release", alias, root, expected_generation=expected_generation, actor=actor
    )


def rollback_release(
    ws: Workspace, alias: str, root: str, *, actor: str, expected_generation: int | None = None
) -> dict[str, Any]:
    gate = ws.gate()
    if expected_generation is None:
        expected_generation = gate.alias(alias, "release").generation
    return gate.rollback(
        "release", alias, root, expected_generation=expected_generation, actor=actor
    )
