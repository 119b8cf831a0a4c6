"""The linearizable gate: aliases (compare-and-swap), fences, approvals, permits, recheck.

Every state change that a training run or a reader can observe goes through one gate
transaction here; callers never open SQL transactions themselves.
"""
