"""The records a run's life produces: its ``runs`` row, admission, end and rescale.

Each is a frozen :class:`~relgate.integrity.contract.Contract`; its camelCase JSON is
what the CLI prints and the Dagster layer attaches.
"""

from __future__ import annotations

from typing import Self

from relgate.catalog.states import RUN_TERMINAL_STATES
from relgate.integrity.contract import Contract, Record


class RunRecord(Record):
    """One row of the ``runs`` table: a run on one exact root, under one permit."""

    run_id: str
    alias: str
    root_digest: str
    permit_id: str
    purpose: str
    world_size: int
    assignment_epoch: int
    barrier_epoch: int
    state: str
    failure: str | None = None
    created_at: str
    updated_at: str
    ended_at: str | None = None
    ended_by: str | None = None
    end_reason: str | None = None

    @property
    def ended(self) -> bool:
        return self.state in RUN_TERMINAL_STATES


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


class RunSummary(Contract):
    """A run as ``relgate run list`` prints it: its state, root, permit and end."""

    run_id: str
    state: str
    root_digest: str
    permit: str
    ended_at: str | None
    ended_by: str | None
    reason: str | None

    @classmethod
    def of(cls, run: RunRecord) -> Self:
        return cls(
            run_id=run.run_id,
            state=run.state,
            root_digest=run.root_digest,
            permit=run.permit_id,
            ended_at=run.ended_at,
            ended_by=run.ended_by,
            reason=run.end_reason,
        )


class RunEnd(RunSummary):
    """A run as it ended (or as it already had ended: ``idempotent_retry``)."""

    idempotent_retry: bool = False


class Rescaled(Contract):
    """A new assignment epoch over the same root."""

    run_id: str
    root_digest: str
    epoch: int
    world_size: int
