"""Training runs on one exact published root.

Run states: ADMITTED -> RUNNING -> FINISHED, or CANCELLED / REVOKED (a fence hit the
root), or FAILED before step 0.  A run in a terminal state has a closed permit and holds
nothing, so garbage collection may reclaim its root once nothing else holds it.
:mod:`~relgate.runs.admission` admits an exact root digest (or resolves the alias
exactly once) inside the gate transaction that also issues the permit; from then on
nothing reads the alias again.  :mod:`~relgate.runs.assignment` deals shards to ranks,
:mod:`~relgate.runs.rank_worker` verifies a rank's shards from their exact object
versions, :mod:`~relgate.runs.barrier` starts step 0 only when every rank of the
current epoch reported the same root with every shard verified and the permit is still
open, :mod:`~relgate.runs.reader` serves verified records of an assignment,
:mod:`~relgate.runs.run_end` ends runs, :mod:`~relgate.runs.records` types what a run's
life produces and :mod:`~relgate.runs.store` owns the ``runs`` table.
"""
