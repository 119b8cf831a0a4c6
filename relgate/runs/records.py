"""The records a run's life produces: admission, end and rescale (typed contracts).

Each is a frozen :class:`~relgate.integrity.contract.Contract`; its camelCase JSON is
what the CLI prints and the Dagster layer attaches.
"""

from __future__ import annotations

from relgate.integrity.contract import Contract


class AdmittedRun(Contract):
    """A run admitted on one root, with the permit that admits it."""

    run_id: str
    state: str
    root_digest: str
    permit: str
    world_size: int
    alias: str | None
    generation: int | None
    tombstone_watermark: int
    benchmark_fence: int
    actor: str


class RunEnd(Contract):
    """A run as it ended (or as it already had ended: ``idempotent_retry``)."""

    run_id: str
    state: str
    root_digest: str
    permit: str
    ended_at: str | None
    ended_by: str | None
    reason: str | None
    idempotent_retry: bool


class Rescaled(Contract):
    """A new assignment epoch over the same root."""

    run_id: str
    root_digest: str
    epoch: int
    world_size: int
