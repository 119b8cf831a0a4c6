"""The barrier before step 0: every rank of the epoch reported the same root, verified.

Step 0 is decided in the gate transaction: the run is live, its permit open, its root
free of fence hits against the current fences and its stored envelope re-verified.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection

from relgate.catalog import run_table
from relgate.catalog.db import one, rows, utcnow
from relgate.errors import RejectedError
from relgate.gate.transitions import Gate
from relgate.release import metrics as release_metrics
from relgate.runs.records import RunRecord
from relgate.runs.store import read_run, refuse_ended


def start_step0(conn: Connection, gate: Gate, run_id: str, epoch: int) -> None:
    """Step 0, decided in the gate: the run is live, its permit open, its root free of
    fence hits against the current fences and its stored envelope re-verified."""
    run = read_run(conn, run_id)
    refuse_ended(run)
    permit = one(
        conn,
        "SELECT state, closed_reason FROM permits WHERE permit_id = :p",
        {"p": run.permit_id},
    )
    if permit is None or permit["state"] != "OPEN":
        raise RejectedError(
            f"permit closed: {permit['closed_reason'] if permit else 'missing'}",
            object=run_id,
            check="permit-closed",
            digest=run.root_digest,
        )
    gate.check_root(conn, "release", run.root_digest)
    run_table.start(conn, run_id, epoch=epoch, now=utcnow())


@dataclass(frozen=True)
class BarrierState:
    """Where one epoch's barrier stands: the run, how many ranks reported, and the refusal
    (check, message) that ends the wait, if any."""

    run: RunRecord
    reported: int
    world_size: int
    problem: tuple[str, str] | None

    @property
    def complete(self) -> bool:
        return self.problem is None and self.reported == self.world_size


def barrier_state(conn: Connection, run_id: str, epoch: int) -> BarrierState:
    # The permit is read before the run: a fence closes the permit and revokes the run in
    # one transaction, so under READ COMMITTED a closed permit implies the run row read
    # after it already says REVOKED (and names the fence), never the other way round.
    permit = one(
        conn,
        "SELECT p.state, p.closed_reason FROM permits p JOIN runs r ON r.permit_id = p.permit_id"
        " WHERE r.run_id = :r",
        {"r": run_id},
    )
    run = read_run(conn, run_id)
    reports = rows(
        conn,
        "SELECT rank, root_digest, ok FROM run_reports WHERE run_id = :r AND epoch = :e",
        {"r": run_id, "e": epoch},
    )
    problem: tuple[str, str] | None = None
    roots = {r["root_digest"] for r in reports}
    release_metrics.current().root_mismatch(run.root_digest, [r["root_digest"] for r in reports])
    state = run.state
    if state == "REVOKED":
        problem = ("run-revoked", f"run revoked: {run.end_reason}")
    elif state in ("CANCELLED", "FINISHED"):
        problem = ("run-state", f"run is {state}")
    elif any(root != run.root_digest for root in roots):
        problem = ("barrier", f"root mismatch: ranks reported {sorted(roots)}")
    elif any(not r["ok"] for r in reports):
        problem = ("barrier", "a rank failed shard verification")
    elif permit is None or permit["state"] != "OPEN":
        problem = (
            "permit-closed",
            f"permit closed: {permit['closed_reason'] if permit else 'missing'}",
        )
    return BarrierState(run, len(reports), run.world_size, problem)
