"""Forward-only lifecycle states with history.

Snapshot: BUILDING -> VALIDATED -> APPROVED -> ACTIVE, or INCOMPLETE / REJECTED.
Release:  STAGED -> VERIFIED -> APPROVED -> PUBLISHED, or INVALID.
Run:      ADMITTED -> RUNNING -> FINISHED, or CANCELLED / REVOKED (a fence hit its root),
          or FAILED before step 0 (barrier timeout, root mismatch, a shard that does not
          verify).
"""

from __future__ import annotations

from relgate_trust.digests import LENGTH, PREFIX
from sqlalchemy import Connection

from relgate.catalog.db import Database, execute, one, rows, utcnow
from relgate.errors import ConflictError, NotFoundError, RejectedError, UsageError
from relgate.integrity.digests import require_digest

SNAPSHOT_TRANSITIONS: dict[str, frozenset[str]] = {
    "BUILDING": frozenset({"VALIDATED", "INCOMPLETE", "REJECTED"}),
    "VALIDATED": frozenset({"APPROVED", "INCOMPLETE", "REJECTED"}),
    "APPROVED": frozenset({"ACTIVE", "INCOMPLETE", "REJECTED"}),
    "ACTIVE": frozenset(),
    "INCOMPLETE": frozenset(),
    "REJECTED": frozenset(),
}

RELEASE_TRANSITIONS: dict[str, frozenset[str]] = {
    "STAGED": frozenset({"VERIFIED", "INVALID"}),
    "VERIFIED": frozenset({"APPROVED", "INVALID"}),
    "APPROVED": frozenset({"PUBLISHED", "INVALID"}),
    "PUBLISHED": frozenset(),
    "INVALID": frozenset(),
}

#: The states a subject reaches only through an approval: approving it again is a no-op.
APPROVED_STATES: dict[str, frozenset[str]] = {
    "snapshot": frozenset({"APPROVED", "ACTIVE"}),
    "release": frozenset({"APPROVED", "PUBLISHED"}),
}

#: A run in one of these states holds its root: its permit is open.
RUN_LIVE_STATES = ("ADMITTED", "RUNNING")
#: A run in one of these states holds nothing: its permit is closed, GC may reclaim.
RUN_TERMINAL_STATES = ("FINISHED", "CANCELLED", "REVOKED", "FAILED")

TABLES = {
    "snapshot": ("snapshots", "snapshot_events", SNAPSHOT_TRANSITIONS),
    "release": ("releases", "release_events", RELEASE_TRANSITIONS),
}


def current_state(conn: Connection, kind: str, digest: str) -> str:
    table, _, _ = TABLES[kind]
    sql = f"SELECT state FROM {table} WHERE digest = :d"  # noqa: S608 constant table names
    row = one(conn, sql, {"d": digest})
    if row is None:
        raise NotFoundError(f"unknown {kind}", object=kind, check="exists", digest=digest)
    return str(row["state"])


def transition(
    conn: Connection,
    kind: str,
    digest: str,
    to_state: str,
    *,
    actor: str,
    reason: str,
    allow_same: bool = False,
) -> str:
    """Move ``digest`` to ``to_state`` if that is a forward step; returns the old state."""
    table, events, transitions = TABLES[kind]
    state = current_state(conn, kind, digest)
    if state == to_state and allow_same:
        return state
    if to_state not in transitions[state]:
        raise RejectedError(
            f"{kind} is {state}; {state} -> {to_state} is not a forward transition",
            object=kind,
            check="state-transition",
            digest=digest,
        )
    now = utcnow()
    changed = execute(
        conn,
        f"UPDATE {table} SET state = :to, updated_at = :now WHERE digest = :d AND state = :from",  # noqa: S608 constant table names
        {"to": to_state, "now": now, "d": digest, "from": state},
    )
    if changed != 1:
        raise ConflictError(
            "state changed concurrently", object=kind, check="state-cas", digest=digest
        )
    execute(
        conn,
        f"INSERT INTO {events} (digest, from_state, to_state, actor, reason, at)"  # noqa: S608 constant table names
        " VALUES (:d, :f, :t, :a, :r, :now)",
        {"d": digest, "f": state, "t": to_state, "a": actor, "r": reason, "now": now},
    )
    return state


def history(conn: Connection, kind: str, digest: str) -> list[dict[str, str]]:
    _, events, _ = TABLES[kind]
    return [
        {k: str(v) if v is not None else "" for k, v in r.items() if k != "id"}
        for r in rows(
            conn,
            f"SELECT * FROM {events} WHERE digest = :d ORDER BY id",  # noqa: S608 constant table names
            {"d": digest},
        )
    ]


#: A prefix shorter than 8 hex digits is refused.
_MIN_PREFIX = 8


def resolve_digest(db: Database, kind: str, ref: str) -> str:
    """A full digest, or a unique hex prefix of one (at least 8 characters), of ``kind``."""
    if ref.startswith(PREFIX) and len(ref) == LENGTH:
        return require_digest(ref)
    prefix = ref.removeprefix(PREFIX)
    if len(prefix) < _MIN_PREFIX or any(c not in "0123456789abcdef" for c in prefix):
        raise UsageError(
            f"give a {kind} digest or a hex prefix of at least 8 characters",
            object=ref,
            check="digest-syntax",
        )
    table = TABLES[kind][0]
    with db.tx() as conn:
        found = rows(
            conn,
            f"SELECT digest FROM {table} WHERE digest LIKE :p",  # noqa: S608 constant table names
            {"p": f"sha256:{prefix}%"},
        )
    if len(found) != 1:
        raise NotFoundError(
            f"{len(found)} {kind}s match {ref!r}", object=kind, check="digest-prefix"
        )
    return str(found[0]["digest"])
