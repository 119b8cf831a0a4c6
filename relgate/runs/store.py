"""Run rows: a run's stored state, read and listed (the ``runs`` table of the catalog)."""

from __future__ import annotations

import time
from typing import Protocol

from sqlalchemy import Connection

from relgate.catalog.db import Database, one, rows
from relgate.catalog.permit_table import Permit
from relgate.errors import NotFoundError, RejectedError
from relgate.integrity.contract import Record
from relgate.runs.records import RunRecord, RunSummary
from relgate.workspace import Workspace


class HeldLease(Protocol):
    """A lease the waiter keeps alive (``relgate.runs.reader.ReaderLease``): ``check``
    raises once it is lost."""

    def check(self) -> None: ...


class RunReport(Record):
    """One rank's barrier report (a ``run_reports`` row)."""

    epoch: int
    rank: int
    root_digest: str
    ok: int
    detail: str
    reported_at: str


class RunStatus(RunRecord):
    """A run with its rank reports and its permit (``relgate run status``)."""

    reports: tuple[RunReport, ...]
    permit: Permit | None


def refuse_ended(run: RunRecord) -> None:
    if run.ended:
        raise RejectedError(
            f"run is {run.state}: {run.end_reason or run.failure or 'ended'}",
            object=run.run_id,
            check="run-revoked" if run.state == "REVOKED" else "run-state",
            digest=run.root_digest,
            details={"state": run.state},
        )


def list_runs(db: Database, *, state: str | None = None) -> list[RunSummary]:
    with db.tx() as conn:
        found = rows(conn, "SELECT * FROM runs ORDER BY created_at, run_id")
    return [
        RunSummary.of(r)
        for r in (RunRecord.parse(r, what="run") for r in found)
        if state in (None, r.state)
    ]


def read_run(conn: Connection, run_id: str) -> RunRecord:
    """The run's row read on ``conn`` (inside the caller's transaction); unknown: exit 3."""
    row = one(conn, "SELECT * FROM runs WHERE run_id = :r", {"r": run_id})
    if row is None:
        raise NotFoundError("unknown run", object=run_id, check="exists")
    return RunRecord.parse(row, what=f"run {run_id}")


def get_run(db: Database, run_id: str) -> RunRecord:
    with db.tx() as conn:
        return read_run(conn, run_id)


def run_status(db: Database, run_id: str) -> RunStatus:
    with db.tx() as conn:
        run = read_run(conn, run_id)
        reports = rows(
            conn,
            "SELECT epoch, rank, root_digest, ok, detail, reported_at FROM run_reports WHERE run_id = :r ORDER BY epoch, rank",
            {"r": run_id},
        )
        permit = one(conn, "SELECT * FROM permits WHERE permit_id = :p", {"p": run.permit_id})
    return RunStatus(
        **run.model_dump(),
        reports=tuple(RunReport.model_validate(r) for r in reports),
        permit=None if permit is None else Permit.model_validate(permit),
    )


def watch_run(
    ws: Workspace,
    run_id: str,
    *,
    lease: HeldLease | None = None,
    poll: float = 0.5,
    timeout: float = 7 * 24 * 3600.0,
) -> RunRecord:
    """Wait (bounded) until the run ends or its permit closes; return the run's record.

    Used by a worker that serves its ready probe for the run's life.
    """
    deadline = time.monotonic() + timeout
    while True:
        if lease is not None:
            lease.check()
        with ws.db.tx() as conn:
            run = read_run(conn, run_id)
            permit = one(
                conn, "SELECT state FROM permits WHERE permit_id = :p", {"p": run.permit_id}
            )
        if run.ended or permit is None or permit["state"] != "OPEN":
            return run
        if time.monotonic() > deadline:
            raise RejectedError(
                f"run did not end within {timeout}s",
                object=run_id,
                check="hold-timeout",
                digest=run.root_digest,
            )
        time.sleep(poll)
