"""Shard assignment: which rank verifies which shards, per assignment epoch."""

from __future__ import annotations

import json

from sqlalchemy import Connection

from relgate.catalog import run_table
from relgate.catalog.db import Database, execute, one, utcnow
from relgate.catalog.release_table import get_release
from relgate.documents import release_root as rm
from relgate.errors import ConflictError, UsageError
from relgate.runs.records import Rescaled
from relgate.runs.store import get_run, refuse_ended
from relgate.workspace import Workspace


def assign(shard_ids: list[str], world_size: int) -> dict[int, list[str]]:
    """Round-robin by shard index: rank k gets shards k, k+W, k+2W, ..."""
    return {rank: shard_ids[rank::world_size] for rank in range(world_size)}


def write_assignment(
    conn: Connection, run_id: str, epoch: int, shard_ids: list[str], world_size: int
) -> None:
    for rank, shards in assign(shard_ids, world_size).items():
        execute(
            conn,
            "INSERT INTO run_assignments (run_id, epoch, rank, shards) VALUES (:r, :e, :k, :s)",
            {"r": run_id, "e": epoch, "k": rank, "s": json.dumps(shards)},
        )


def rescale(ws: Workspace, run_id: str, world_size: int) -> Rescaled:
    """Scale-out or recovery: a new assignment epoch over the same root; the alias is not read."""
    run = get_run(ws.db, run_id)
    refuse_ended(run)
    manifest = rm.load(
        ws.store,
        ws.trusted_keys,
        run.root_digest,
        get_release(ws.db, run.root_digest).envelope_version,
    )
    with ws.db.tx() as conn:
        epoch = run.assignment_epoch + 1
        if not run_table.move_assignment(
            conn, run_id, epoch=epoch, world_size=world_size, now=utcnow()
        ):
            raise ConflictError(
                "run was rescaled concurrently", object=run_id, check="assignment-epoch"
            )
        write_assignment(conn, run_id, epoch, [s.id for s in manifest.shards], world_size)
    return Rescaled(run_id=run_id, root_digest=run.root_digest, epoch=epoch, world_size=world_size)


def assignment(db: Database, run_id: str, epoch: int, rank: int) -> list[str]:
    with db.tx() as conn:
        row = one(
            conn,
            "SELECT shards FROM run_assignments WHERE run_id = :r AND epoch = :e AND rank = :k",
            {"r": run_id, "e": epoch, "k": rank},
        )
    if row is None:
        raise UsageError(
            f"rank {rank} has no assignment in epoch {epoch}", object=run_id, check="rank"
        )
    return list(json.loads(row["shards"]))
