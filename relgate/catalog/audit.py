"""Approvals and reports: who approved which digest, and which signed report vouches for it.

Shared by every subject kind (snapshot, release, release-provenance).
"""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection

from relgate.catalog.db import Database, execute, one, rows, utcnow
from relgate.catalog.states import transition
from relgate.errors import RejectedError

#: The report that must pass before a subject kind can be approved.
REPORT_CHECK = {"snapshot": "validation-report", "release": "verification-report"}


def record_approval(conn: Connection, kind: str, digest: str, approver: str, comment: str) -> None:
    execute(
        conn,
        "INSERT INTO approvals (subject_kind, digest, approver, comment, at) VALUES (:k, :d, :a, :c, :now)",
        {"k": kind, "d": digest, "a": approver, "c": comment, "now": utcnow()},
    )


def approvals(db: Database, digest: str) -> list[dict[str, Any]]:
    with db.tx() as conn:
        return rows(
            conn,
            "SELECT subject_kind, digest, approver, comment, at FROM approvals WHERE digest = :d ORDER BY id",
            {"d": digest},
        )


def record_report(
    conn: Connection, kind: str, subject: str, report_digest: str, report_version: str, ok: bool
) -> None:
    execute(
        conn,
        "INSERT INTO reports (subject_kind, subject_digest, report_digest, report_version, ok, at)"
        " VALUES (:k, :s, :r, :v, :ok, :now)",
        {
            "k": kind,
            "s": subject,
            "r": report_digest,
            "v": report_version,
            "ok": 1 if ok else 0,
            "now": utcnow(),
        },
    )


def newest_report(conn: Connection, subject: str, kind: str) -> dict[str, Any] | None:
    """The newest report of ``kind`` on a subject, read inside the caller's transaction."""
    return one(
        conn,
        "SELECT * FROM reports WHERE subject_digest = :s AND subject_kind = :k ORDER BY id DESC LIMIT 1",
        {"s": subject, "k": kind},
    )


def latest_report(db: Database, subject: str, kind: str) -> dict[str, Any] | None:
    """The newest report of ``kind`` (snapshot, release, release-provenance) on a subject."""
    with db.tx() as conn:
        return newest_report(conn, subject, kind)


def approve(
    db: Database, kind: str, digest: str, *, approver: str, comment: str = ""
) -> dict[str, Any]:
    """Bind a named approval to exactly this digest, after a passing report (-> APPROVED)."""
    if not approver.strip():
        raise RejectedError(
            "approval needs the approver's name", object="approval", check="approver", digest=digest
        )
    report = latest_report(db, digest, kind)
    if report is None or not report["ok"]:
        raise RejectedError(
            f"no passing {REPORT_CHECK[kind].replace('-', ' ')} for this digest",
            object=kind,
            check=REPORT_CHECK[kind],
            digest=digest,
        )
    with db.tx() as conn:
        transition(conn, kind, digest, "APPROVED", actor=approver, reason=comment or "approved")
        record_approval(conn, kind, digest, approver, comment)
    return {
        kind: digest,
        "state": "APPROVED",
        "approver": approver,
        "report": report["report_digest"],
    }
