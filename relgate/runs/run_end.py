"""The end of a run: FINISHED, CANCELLED, or FAILED before step 0; the permit closes."""

from __future__ import annotations

from relgate.catalog import run_table
from relgate.catalog.db import Database, one, utcnow
from relgate.catalog.permit_table import close_permit
from relgate.catalog.states import RUN_LIVE_STATES
from relgate.errors import ConflictError, RejectedError, UsageError
from relgate.runs.records import RunEnd, RunRecord
from relgate.runs.store import read_run
from relgate.workspace import Workspace

#: Which states each way of ending a run may start from.
END_FROM: dict[str, tuple[str, ...]] = {
    "FINISHED": ("RUNNING",),
    "CANCELLED": RUN_LIVE_STATES,
}


def end_run(ws: Workspace, run_id: str, to_state: str, *, actor: str, reason: str) -> RunEnd:
    """FINISHED (from RUNNING) or CANCELLED (before or after step 0): close the permit and
    release the run's hold, in one gate transaction (ordered against fence advances).
    Repeating the same end is idempotent; ending a run that ended otherwise is refused."""
    if to_state not in END_FROM:
        raise UsageError(f"a run ends as one of {sorted(END_FROM)}", object=run_id, check="end")
    with ws.db.gate_tx() as conn:
        run = read_run(conn, run_id)
        state = run.state
        if state == to_state:
            return _ended(run, idempotent_retry=True)
        if state not in END_FROM[to_state]:
            raise RejectedError(
                f"run is {state}; {to_state} needs {' or '.join(sorted(END_FROM[to_state]))}",
                object=run_id,
                check="run-revoked" if state == "REVOKED" else "run-state",
                digest=run.root_digest,
                details={"state": state, "reason": run.end_reason or run.failure},
            )
        now = utcnow()
        if not run_table.end(
            conn,
            run_id,
            from_state=state,
            to_state=to_state,
            actor=actor,
            reason=reason,
            now=now,
        ):
            raise ConflictError("run changed concurrently", object=run_id, check="run-state")
        close_permit(conn, run.permit_id, f"run {run_id} {to_state}: {reason}")
        run = run.model_copy(
            update={"state": to_state, "ended_at": now, "ended_by": actor, "end_reason": reason}
        )
    return _ended(run, idempotent_retry=False)


def _ended(run: RunRecord, *, idempotent_retry: bool) -> RunEnd:
    return RunEnd.of(run).model_copy(update={"idempotent_retry": idempotent_retry})


def finish_run(ws: Workspace, run_id: str, *, actor: str, reason: str = "finished") -> RunEnd:
    return end_run(ws, run_id, "FINISHED", actor=actor, reason=reason)


def cancel_run(ws: Workspace, run_id: str, *, actor: str, reason: str = "cancelled") -> RunEnd:
    return end_run(ws, run_id, "CANCELLED", actor=actor, reason=reason)


def fail_run(db: Database, run_id: str, reason: str) -> bool:
    """Fail a run that has not started step 0 and close its permit (returns False if it
    had already started, or ended)."""
    with db.gate_tx() as conn:
        run = one(conn, "SELECT permit_id FROM runs WHERE run_id = :r", {"r": run_id})
        failed = run_table.fail_unstarted(conn, run_id, reason=reason, now=utcnow())
        if failed and run is not None:
            close_permit(conn, str(run["permit_id"]), f"run {run_id} FAILED: {reason}")
        return failed
