"""The linearizable gate: aliases (compare-and-swap), fences, hits, stored-envelope
re-verification, approvals, permits and recheck.

Every state change that a training run or a reader can observe goes through one gate
transaction here; callers never open SQL transactions themselves.  The gate itself is
:class:`relgate.gate.transitions.Gate`, built by :meth:`relgate.workspace.Workspace.gate`.
"""
