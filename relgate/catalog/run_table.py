"""The ``runs`` table's store: every statement that writes a training run's row.

Admission inserts the row, rescaling moves its assignment epoch, the barrier starts it,
ending or failing it ends it, and a fence hit on its root revokes it.  Those steps run on
three floors (the gate revokes, ``relgate.runs`` does the rest, ``relgate.holds`` reads
live runs as GC roots), so the table's one writer sits below all of them, here.  Each
write is a compare-and-set on the row's state or epoch; those whose caller acts on the
outcome return whether it took.
"""

from __future__ import annotations

from sqlalchemy import Connection

from relgate.catalog.db import execute
from relgate.catalog.states import RUN_LIVE_STATES

#: The live run states spelled for an ``IN (...)`` clause (constants, not user input).
LIVE_SQL = ", ".join(f"'{s}'" for s in RUN_LIVE_STATES)


def insert_run(
    conn: Connection,
    *,
    run_id: str,
    alias: str,
    root: str,
    permit_id: str,
    purpose: str,
    world_size: int,
    now: str,
) -> None:
    """An admitted run at assignment epoch 0, before any barrier."""
    execute(
        conn,
        "INSERT INTO runs (run_id, alias, root_digest, permit_id, purpose, world_size, assignment_epoch,"
        " barrier_epoch, state, created_at, updated_at)"
        " VALUES (:r, :a, :root, :p, :purpose, :w, 0, -1, 'ADMITTED', :now, :now)",
        {
            "r": run_id,
            "a": alias,
            "root": root,
            "p": permit_id,
            "purpose": purpose,
            "w": world_size,
            "now": now,
        },
    )


def move_assignment(
    conn: Connection, run_id: str, *, epoch: int, world_size: int, now: str
) -> bool:
    """Assignment epoch ``epoch - 1`` -> ``epoch`` at ``world_size`` ranks."""
    changed = execute(
        conn,
        "UPDATE runs SET assignment_epoch = :e, world_size = :w, updated_at = :now"
        " WHERE run_id = :r AND assignment_epoch = :prev",
        {"e": epoch, "w": world_size, "now": now, "r": run_id, "prev": epoch - 1},
    )
    return changed == 1


def start(conn: Connection, run_id: str, *, epoch: int, now: str) -> None:
    """A live run passed the barrier of ``epoch``; a run already past that epoch, or no
    longer live, stays as it is (every rank passing the barrier calls this)."""
    execute(
        conn,
        "UPDATE runs SET state = 'RUNNING', barrier_epoch = :e, updated_at = :now"  # noqa: S608 - constant state names
        f" WHERE run_id = :r AND barrier_epoch < :e AND state IN ({LIVE_SQL})",
        {"e": epoch, "now": now, "r": run_id},
    )


def end(
    conn: Connection,
    run_id: str,
    *,
    from_state: str,
    to_state: str,
    actor: str,
    reason: str,
    now: str,
) -> bool:
    """``from_state`` -> ``to_state`` (finished, cancelled), by ``actor`` for ``reason``."""
    changed = execute(
        conn,
        "UPDATE runs SET state = :to, ended_at = :now, ended_by = :who, end_reason = :why,"
        " updated_at = :now WHERE run_id = :r AND state = :from",
        {"to": to_state, "now": now, "who": actor, "why": reason, "r": run_id, "from": from_state},
    )
    return changed == 1


def fail_unstarted(conn: Connection, run_id: str, *, reason: str, now: str) -> bool:
    """An ADMITTED run that never passed a barrier fails (ended by the barrier)."""
    changed = execute(
        conn,
        "UPDATE runs SET state = 'FAILED', failure = :f, end_reason = :f, ended_at = :now,"
        " ended_by = 'barrier', updated_at = :now WHERE run_id = :r AND state = 'ADMITTED'",
        {"f": reason, "now": now, "r": run_id},
    )
    return changed == 1


def revoke_on_root(conn: Connection, root: str, *, reason: str, now: str) -> None:
    """Every live run on ``root`` is REVOKED by the gate."""
    execute(
        conn,
        "UPDATE runs SET state = 'REVOKED', failure = :why, end_reason = :why, ended_at = :now,"  # noqa: S608 constant run states
        f" ended_by = 'gate', updated_at = :now WHERE root_digest = :r AND state IN ({LIVE_SQL})",
        {"why": reason, "now": now, "r": root},
    )
