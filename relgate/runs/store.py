"""Run rows: a run's stored state, read and listed (the ``runs`` table of the catalog)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from relgate.catalog.db import Database, one, rows
from relgate.catalog.states import RUN_LIVE_STATES, RUN_TERMINAL_STATES
from relgate.errors import NotFoundError, RejectedError
from relgate.workspace import Workspace

if TYPE_CHECKING:  # the reader imports this module (admission reads run rows)
    from relgate.runs.reader import ReaderLease

LIVE_SQL = ", ".join(f"'{s}'" for s in RUN_LIVE_STATES)


def run_state(row: dict[str, Any]) -> str:
    """The stored state of a run row."""
    return str(row["state"])


def refuse_ended(run: dict[str, Any]) -> None:
    state = run_state(run)
    if state in RUN_TERMINAL_STATES:
        raise RejectedError(
            f"run is {state}: {run.get('end_reason') or run.get('failure') or 'ended'}",
            object=str(run["run_id"]),
            check="run-revoked" if state == "REVOKED" else "run-state",
            digest=str(run["root_digest"]),
            details={"state": state},
        )


def run_json(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "runId": run["run_id"],
        "state": run_state(run),
        "rootDigest": run["root_digest"],
        "permit": run["permit_id"],
        "endedAt": run.get("ended_at"),
        "endedBy": run.get("ended_by"),
        "reason": run.get("end_reason"),
    }


def list_runs(db: Database, *, state: str | None = None) -> list[dict[str, Any]]:
    with db.tx() as conn:
        found = rows(conn, "SELECT * FROM runs ORDER BY created_at, run_id")
    out = [run_json(r) for r in found]
    return [r for r in out if state is None or r["state"] == state]


def require_run(row: dict[str, Any] | None, run_id: str) -> dict[str, Any]:
    """A run row read inside a transaction: it exists, or the run is unknown."""
    if row is None:
        raise NotFoundError("unknown run", object=run_id, check="exists")
    return row


def get_run(db: Database, run_id: str) -> dict[str, Any]:
    with db.tx() as conn:
        row = one(conn, "SELECT * FROM runs WHERE run_id = :r", {"r": run_id})
    if row is None:
        raise NotFoundError("unknown run", object=run_id, check="exists")
    return row


def run_status(db: Database, run_id: str) -> dict[str, Any]:
    run = get_run(db, run_id)
    with db.tx() as conn:
        reports = rows(
            conn,
            "SELECT epoch, rank, root_digest, ok, detail, reported_at FROM run_reports WHERE run_id = :r ORDER BY epoch, rank",
            {"r": run_id},
        )
        permit = one(conn, "SELECT * FROM permits WHERE permit_id = :p", {"p": run["permit_id"]})
    return {**run, "state": run_state(run), "reports": reports, "permit": permit}


def watch_run(
    ws: Workspace,
    run_id: str,
    *,
    lease: ReaderLease | None = None,
    poll: float = 0.5,
    timeout: float = 7 * 24 * 3600.0,
) -> dict[str, Any]:
    """Wait (bounded) until the run ends or its permit closes; return the run row.

    Used by a worker that serves its ready probe for the run's life.
    """
    deadline = time.monotonic() + timeout
    while True:
        if lease is not None:
            lease.check()
        with ws.db.tx() as conn:
            run = require_run(
                one(conn, "SELECT * FROM runs WHERE run_id = :r", {"r": run_id}), run_id
            )
            permit = one(
                conn, "SELECT state FROM permits WHERE permit_id = :p", {"p": run["permit_id"]}
            )
        if run_state(run) in RUN_TERMINAL_STATES or permit is None or permit["state"] != "OPEN":
            return run
        if time.monotonic() > deadline:
            raise RejectedError(
                f"run did not end within {timeout}s",
                object=run_id,
                check="hold-timeout",
                digest=str(run["root_digest"]),
            )
        time.sleep(poll)
