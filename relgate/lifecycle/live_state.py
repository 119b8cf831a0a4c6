"""What is live at the gate now: every alias's generation and digest, the open permits and
the runs not yet ended, read in one catalog transaction.

The Dagster console observes this (``sensors/gate_sensor.py``), so a change made anywhere,
the command line included (an activation, a rollback, a publication, a permit or run
ending), shows on the alias and permit assets within one sensor interval.  The
:meth:`LiveState.fingerprint` is what the sensor keeps as its cursor: equal fingerprints,
nothing changed.
"""

from __future__ import annotations

from relgate_trust.digests import sha256_digest

from relgate.catalog import alias_table
from relgate.catalog.db import Database, rows
from relgate.catalog.permit_table import Permit
from relgate.catalog.run_table import LIVE_SQL
from relgate.integrity.canonical import canonical_bytes
from relgate.integrity.contract import Contract
from relgate.runs.records import RunRecord


class LiveAlias(Contract):
    """One alias as it stands."""

    alias: str
    kind: str
    generation: int
    active_digest: str | None


class LiveRun(Contract):
    """A run that has not ended, on its exact root."""

    run_id: str
    state: str
    root_digest: str
    permit: str
    alias: str
    purpose: str


class LiveState(Contract):
    """The gate's live state (see the module docstring)."""

    aliases: tuple[LiveAlias, ...]
    open_permits: tuple[Permit, ...]
    live_runs: tuple[LiveRun, ...]

    def fingerprint(self) -> str:
        """A digest of the whole state: it changes exactly when something live changed."""
        return sha256_digest(canonical_bytes(self.to_json()))

    def of_kind(self, kind: str) -> tuple[LiveAlias, ...]:
        return tuple(a for a in self.aliases if a.kind == kind)


def live_state(db: Database) -> LiveState:
    """Aliases, open permits and live runs, read in one transaction."""
    with db.tx() as conn:
        aliases = alias_table.aliases(conn)
        permits = rows(conn, "SELECT * FROM permits WHERE state = 'OPEN' ORDER BY permit_id")
        runs = rows(
            conn,
            f"SELECT * FROM runs WHERE state IN ({LIVE_SQL}) ORDER BY run_id",  # noqa: S608 constant run states
        )
    records = [RunRecord.parse(r, what="run") for r in runs]
    return LiveState(
        aliases=tuple(
            LiveAlias(
                alias=a.name,
                kind=str(a.kind),
                generation=a.generation or 0,
                active_digest=a.active_digest,
            )
            for a in aliases
            if a.kind is not None
        ),
        open_permits=tuple(Permit.model_validate(p) for p in permits),
        live_runs=tuple(
            LiveRun(
                run_id=r.run_id,
                state=r.state,
                root_digest=r.root_digest,
                permit=r.permit_id,
                alias=r.alias,
                purpose=r.purpose,
            )
            for r in records
        ),
    )
