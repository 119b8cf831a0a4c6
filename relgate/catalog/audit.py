"""Approvals and reports: who approved which digest, and which signed report vouches for it.

Shared by every subject kind (snapshot, release, release-provenance).
"""

from __future__ import annotations

from collections.abc import Sequence

from pydantic import model_serializer
from sqlalchemy import Connection

from relgate.catalog.db import Database, execute, one, rows, utcnow
from relgate.catalog.states import transition
from relgate.errors import RejectedError
from relgate.integrity.contract import Record

#: The report that must pass before a subject kind can be approved.
REPORT_CHECK = {"snapshot": "validation-report", "release": "verification-report"}


class ApprovalRecord(Record):
    """An ``approvals`` row: who approved which digest."""

    subject_kind: str
    digest: str
    approver: str
    comment: str
    at: str


class ReportRecord(Record):
    """A ``reports`` row: the signed report (a CAS object) that vouches for a subject."""

    id: int
    subject_kind: str
    subject_digest: str
    report_digest: str
    report_version: str
    ok: int
    at: str


class Approved(Record):
    """An approval as the CLI prints it: ``{<kind>: digest, state, approver, report}``,
    with the signed approval's digest once signed and whether it existed already."""

    kind: str
    digest: str
    state: str
    approver: str
    report: str
    approval: str | None = None
    existing: str | None = None

    @model_serializer(mode="plain")
    def _wire(self) -> dict[str, str]:
        out = {self.kind: self.digest, "state": self.state, "approver": self.approver}
        out["report"] = self.report
        if self.approval is not None:
            out["approval"] = self.approval
        if self.existing is not None:
            out["existing"] = self.existing
        return out


def record_approval(conn: Connection, kind: str, digest: str, approver: str, comment: str) -> None:
    execute(
        conn,
        "INSERT INTO approvals (subject_kind, digest, approver, comment, at) VALUES (:k, :d, :a, :c, :now)",
        {"k": kind, "d": digest, "a": approver, "c": comment, "now": utcnow()},
    )


def approvals(db: Database, digest: str) -> list[ApprovalRecord]:
    with db.tx() as conn:
        found = rows(
            conn,
            "SELECT subject_kind, digest, approver, comment, at FROM approvals WHERE digest = :d ORDER BY id",
            {"d": digest},
        )
    return [ApprovalRecord.parse(r, what=f"approval of {digest}") for r in found]


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


def newest_report(conn: Connection, subject: str, kind: str) -> ReportRecord | None:
    """The newest report of ``kind`` on a subject, read inside the caller's transaction."""
    row = one(
        conn,
        "SELECT * FROM reports WHERE subject_digest = :s AND subject_kind = :k ORDER BY id DESC LIMIT 1",
        {"s": subject, "k": kind},
    )
    return None if row is None else ReportRecord.parse(row, what=f"{kind} report of {subject}")


_NEWEST_SQL = (
    "SELECT * FROM (SELECT * FROM reports WHERE subject_digest = :s{i} AND subject_kind = :k{i}"
    " ORDER BY id DESC LIMIT 1) AS newest_{i}"
)


def newest_reports(
    conn: Connection, wanted: Sequence[tuple[str, str]]
) -> list[ReportRecord | None]:
    """:func:`newest_report` of each (subject, kind) in ``wanted``, in one statement."""
    sql = " UNION ALL ".join(_NEWEST_SQL.format(i=i) for i in range(len(wanted)))
    params = {
        f"{n}{i}": v for i, pair in enumerate(wanted) for n, v in zip("sk", pair, strict=True)
    }
    found = {(r["subject_digest"], r["subject_kind"]): r for r in rows(conn, sql, params)}
    return [
        None if (row := found.get(pair)) is None
        else ReportRecord.parse(row, what=f"{pair[1]} report of {pair[0]}")
        for pair in wanted
    ]  # fmt: skip


def latest_report(db: Database, subject: str, kind: str) -> ReportRecord | None:
    """The newest report of ``kind`` (snapshot, release, release-provenance) on a subject."""
    with db.tx() as conn:
        return newest_report(conn, subject, kind)


def approve(db: Database, kind: str, digest: str, *, approver: str, comment: str = "") -> Approved:
    """Bind a named approval to exactly this digest, after a passing report (-> APPROVED)."""
    if not approver.strip():
        raise RejectedError(
            "approval needs the approver's name", object="approval", check="approver", digest=digest
        )
    report = latest_report(db, digest, kind)
    if report is None or not report.ok:
        raise RejectedError(
            f"no passing {REPORT_CHECK[kind].replace('-', ' ')} for this digest",
            object=kind,
            check=REPORT_CHECK[kind],
            digest=digest,
        )
    with db.tx() as conn:
        transition(conn, kind, digest, "APPROVED", actor=approver, reason=comment or "approved")
        record_approval(conn, kind, digest, approver, comment)
    return Approved(
        kind=kind, digest=digest, state="APPROVED", approver=approver, report=report.report_digest
    )
