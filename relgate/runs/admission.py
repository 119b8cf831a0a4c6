"""Admission: a run on an exact root (or the root an alias names, read exactly once),
inside the gate transaction that also issues its permit."""

from __future__ import annotations

import uuid

from relgate.catalog import run_table
from relgate.catalog.db import utcnow
from relgate.catalog.events import GateOperation, Outcome, record, refusals_recorded
from relgate.catalog.permit_table import NO_GENERATION
from relgate.documents import release_root as rm
from relgate.errors import UsageError
from relgate.gate.permit_issue import acquire
from relgate.gate.transitions import open_gate
from relgate.runs.assignment import write_assignment
from relgate.runs.records import AdmittedRun
from relgate.workspace import Workspace


def admit_run(
    ws: Workspace,
    *,
    purpose: str,
    world_size: int,
    actor: str,
    alias: str | None = None,
    root: str | None = None,
    expected_generation: int | None = None,
) -> AdmittedRun:
    """Admit a run on an exact ``root`` (or the root ``alias`` points at, read once).

    A run that failed, was cancelled or finished does not block a new run on the same
    digest: each run has its own permit.
    """
    if world_size < 1:
        raise UsageError("world size must be at least 1", object="run", check="world-size")
    run_id = "run-" + uuid.uuid4().hex[:12]
    gate = open_gate(ws)
    subject = alias or root or "run"
    with (
        refusals_recorded(ws.db, GateOperation.ADMIT, subject),
        ws.db.admission_tx() as conn,
    ):
        acquired = acquire(
            conn,
            gate,
            purpose=purpose,
            alias=alias,
            root=root,
            expected_generation=expected_generation,
        )
        permit = acquired.permit
        admitted = str(permit.root_digest)
        envelope_version = acquired.release.envelope_version  # the row the gate checked
        now = utcnow()
        run_table.insert_run(
            conn,
            run_id=run_id,
            alias=alias or "",
            root=admitted,
            permit_id=permit.permit_id,
            purpose=purpose,
            world_size=world_size,
            now=now,
        )
        record(conn, GateOperation.ADMIT, Outcome.OK, subject=subject, digest=admitted)
    # The gate re-verified this root against its model inside the admission (verify_row).
    manifest = rm.load(ws.store, ws.trusted_keys, admitted, envelope_version)
    with ws.db.tx() as conn:
        write_assignment(conn, run_id, 0, [s.id for s in manifest.shards], world_size)
    generation = int(permit.generation)
    return AdmittedRun(
        run_id=run_id,
        state="ADMITTED",
        root_digest=admitted,
        permit=str(permit.permit_id),
        world_size=world_size,
        alias=alias,
        generation=None if generation == NO_GENERATION else generation,
        tombstone_watermark=int(permit.tombstone_watermark),
        benchmark_fence=int(permit.benchmark_fence),
        actor=actor,
    )
