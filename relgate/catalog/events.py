"""Gate events: one ``gate_events`` row per outcome of a gate operation.

A success is recorded inside the operation's own transaction, so it commits exactly when
the operation does.  A refusal (exit 3) or a lost compare-and-swap (exit 4) rolls its
transaction back, so it is recorded afterwards in a transaction of its own; if even that
fails (the catalog is gone) the refusal is logged and still raised as itself.  The rows
are what the gate's Prometheus metrics count (:mod:`relgate.gate.telemetry`): admissions,
activations, CAS conflicts and fence advances survive the process that made them.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager
from enum import StrEnum

from sqlalchemy import Connection
from sqlalchemy.exc import SQLAlchemyError

from relgate.catalog.db import CatalogUnavailableError, Database, execute, utcnow
from relgate.errors import ConflictError, NotFoundError, RejectedError, RelgateError

log = logging.getLogger(__name__)


class GateOperation(StrEnum):
    ACTIVATE = "activate"
    ROLLBACK = "rollback"
    ADMIT = "admit"
    TOMBSTONE = "tombstone"
    BENCHMARK = "benchmark"
    #: a stored CAS version failed its digest; a new version of the same content was written
    STORAGE_REPAIR = "storage-repair"
    #: a root was audited (read without a run; nothing reaches a training process)
    AUDIT_READ = "audit-read"


class Outcome(StrEnum):
    OK = "ok"
    #: the input was refused (exit 3): a fence hit, a bad envelope, a wrong state
    REFUSED = "refused"
    #: a compare-and-swap was lost or named a stale generation (exit 4)
    CONFLICT = "conflict"


def outcome_of(exc: RelgateError) -> Outcome | None:
    """The outcome a gate error records (None: usage or internal errors are not gate
    decisions and are not counted; neither is a lost catalog connection)."""
    if isinstance(exc, CatalogUnavailableError):
        return None
    if isinstance(exc, ConflictError):
        return Outcome.CONFLICT
    if isinstance(exc, RejectedError | NotFoundError):
        return Outcome.REFUSED
    return None


def record(
    conn: Connection,
    operation: GateOperation,
    outcome: Outcome,
    *,
    subject: str,
    digest: str | None = None,
    check: str | None = None,
) -> None:
    execute(
        conn,
        "INSERT INTO gate_events (operation, outcome, check_name, subject, digest, at)"
        " VALUES (:op, :outcome, :check, :subject, :digest, :at)",
        {
            "op": operation.value,
            "outcome": outcome.value,
            "check": check or "",
            "subject": subject,
            "digest": digest or "",
            "at": utcnow(),
        },
    )


@contextmanager
def refusals_recorded(db: Database, operation: GateOperation, subject: str) -> Iterator[None]:
    """Record a refusal or conflict raised inside the block, then re-raise it."""
    try:
        yield
    except RelgateError as exc:
        outcome = outcome_of(exc)
        if outcome is not None:
            try:
                with db.tx() as conn:
                    record(
                        conn,
                        operation,
                        outcome,
                        subject=exc.object or subject,
                        digest=exc.digest,
                        check=exc.check,
                    )
            except (SQLAlchemyError, CatalogUnavailableError) as db_exc:
                log.warning("gate %s %s not recorded: %s", operation, outcome, db_exc)
        raise
