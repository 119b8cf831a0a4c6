"""Training runs pinned to one root: admission, assignment, per-rank workers, the barrier,
and the end of a run.

Run states: ADMITTED -> RUNNING -> FINISHED, or CANCELLED / REVOKED (a fence hit the
root), or FAILED before step 0.  A run in a terminal state has a closed permit and holds
nothing, so garbage collection may reclaim its root once nothing else holds it.

``create_run`` admits an exact root digest (or resolves the alias exactly once), inside
the gate transaction that also issues the permit, and writes the root digest into the
run.  From then on nothing reads
the alias again: workers, scale-out and recovery use the run's root.  Each rank verifies
its assigned shards from their exact object versions and reports
``(runId, rootDigest, shardDigests)``; step 0 begins only when every rank of the current
assignment epoch reported the same root with every shard verified, the permit is still
open, and the barrier did not time out (a timeout fails the run before step 0).
"""

from __future__ import annotations

# The run's nouns live in their own modules; these names stay importable from here.
from relgate.release.admission import create_run
from relgate.release.assignment import assign, assignment, rescale
from relgate.release.barrier import barrier_state, start_step0
from relgate.release.rank_worker import WorkerResult, report, run_worker, shard_checker
from relgate.release.run_end import END_FROM, cancel_run, end_run, fail_run, finish_run
from relgate.release.run_rows import get_run, list_runs, run_state, run_status, watch_run

__all__ = [
    "END_FROM",
    "WorkerResult",
    "assign",
    "assignment",
    "barrier_state",
    "cancel_run",
    "create_run",
    "end_run",
    "fail_run",
    "finish_run",
    "get_run",
    "list_runs",
    "report",
    "rescale",
    "run_state",
    "run_status",
    "run_worker",
    "shard_checker",
    "start_step0",
    "watch_run",
]
