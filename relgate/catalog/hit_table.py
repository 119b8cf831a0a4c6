"""The ``fence_hits`` table's store: the one statement that records a fence hit.

The gate decides which retained versions a fence advance hits
(:mod:`relgate.gate.hits`); the holds read the hits when they compute GC roots, so the
table's one writer sits below both, here.
"""

from __future__ import annotations

from sqlalchemy import Connection

from relgate.catalog.db import execute


def record_hit(
    conn: Connection, *, kind: str, digest: str, fence_kind: str, seq: int, now: str
) -> None:
    """Fence entry ``seq`` of ``fence_kind`` hits the ``kind`` version ``digest``."""
    execute(
        conn,
        "INSERT INTO fence_hits (subject_kind, subject_digest, fence_kind, fence_seq, at)"
        " VALUES (:k, :d, :f, :s, :now)",
        {"k": kind, "d": digest, "f": fence_kind, "s": seq, "now": now},
    )
