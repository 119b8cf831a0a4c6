"""The garbage collector's ledger: the store of ``gc_runs``, ``gc_seen``, ``gc_deletions``
and ``gc_collected``.

The collector (:mod:`relgate.lifecycle.collector`) decides what to delete; the gate
refuses a rollback to a purged version and a pin refuses a version whose objects are
gone, both by reading this ledger, so its one writer sits below all of them, here.
"""

from __future__ import annotations

import json
from collections.abc import Iterable

from sqlalchemy import Connection, text

from relgate.catalog.db import execute, one, utcnow


def start_run(
    conn: Connection, *, run_id: str, mode: str, actor: str, grace_seconds: int, now: str
) -> None:
    """A collector run begins (outcome RUNNING until :func:`finish_run`)."""
    execute(
        conn,
        "INSERT INTO gc_runs (run_id, mode, actor, grace_seconds, outcome, summary, started_at)"
        " VALUES (:r, :m, :a, :g, 'RUNNING', '{}', :t)",
        {"r": run_id, "m": mode, "a": actor, "g": grace_seconds, "t": now},
    )


def finish_run(conn: Connection, run_id: str, outcome: str, summary: object) -> None:
    """A collector run ends with ``outcome`` and its JSON ``summary``."""
    execute(
        conn,
        "UPDATE gc_runs SET outcome = :o, summary = :s, finished_at = :t WHERE run_id = :r",
        {"o": outcome, "s": json.dumps(summary, sort_keys=True), "t": utcnow(), "r": run_id},
    )


def stamp_seen(conn: Connection, versions: Iterable[tuple[str, str]], now: str) -> None:
    """First sight of each (object key, version id): the grace period counts from now."""
    params = [{"k": key, "v": version, "t": now} for key, version in versions]
    if params:
        conn.execute(
            text("INSERT INTO gc_seen (object_key, version_id, first_seen) VALUES (:k, :v, :t)"),
            params,
        )


def record_deletion(
    conn: Connection,
    *,
    run_id: str,
    object_key: str,
    version_id: str,
    size: int,
    reason: str,
    now: str,
) -> None:
    """One object version the run deletes, and why (written before the delete)."""
    execute(
        conn,
        "INSERT INTO gc_deletions (run_id, object_key, version_id, size, reason, at)"
        " VALUES (:r, :k, :v, :s, :why, :t)",
        {"r": run_id, "k": object_key, "v": version_id, "s": size, "why": reason, "t": now},
    )


def record_collected(conn: Connection, *, kind: str, digest: str, run_id: str, now: str) -> None:
    """A version lost bytes it needs to this run (the first run that did so is kept)."""
    execute(
        conn,
        "INSERT INTO gc_collected (kind, digest, run_id, at) VALUES (:k, :d, :r, :t)"
        " ON CONFLICT (digest) DO NOTHING",
        {"k": kind, "d": digest, "r": run_id, "t": now},
    )


def purged(conn: Connection, envelope_key: str, digest: str) -> bool:
    """Whether a sweep deleted the version's envelope or collected the version."""
    return bool(
        one(conn, "SELECT run_id FROM gc_deletions WHERE object_key = :k", {"k": envelope_key})
        or one(conn, "SELECT run_id FROM gc_collected WHERE digest = :d", {"d": digest})
    )
