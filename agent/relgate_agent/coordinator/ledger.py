"""The coordinator's durable ledger of facts about a job's hosts, beyond the job row.

Three tables, created by the store's second migration step (``LEDGER_SCHEMA`` in store.py,
which runs every step; the ledger imports the store, never the reverse), written by plain
SQL both SQLite and PostgreSQL accept:

- ``dist_host_bytes``: per (job, host) the cumulative bytes it received from peers, sent,
  and read from the origin, as its agent last reported them (agents journal their counters,
  so a restarted agent reports on from where it was; coordinator/tally.py).
- ``dist_removed``: targets a job no longer waits for, with why (evicted by an operator, dead
  past the bound; coordinator/removal.py) and when (``removed_at``, Unix seconds). Quarantine keeps its own table (``dist_quarantine``).
- ``dist_host_holds``: host health across jobs (quarantined for bad data, failing
  handshakes): a held host is no target of a new job until an operator clears the hold.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import text

from relgate_agent.contracts import RemovedHost
from relgate_agent.coordinator.store import JobStore

REASON_MAX = 500  # characters of a reason kept (an operator's --reason is free text)
# counters only grow: a late write (a deposed leader's) never lowers one; SQL both dialects
# accept (no GREATEST in SQLite, no two-argument max() in PostgreSQL); constant column names
_PUT_BYTES = (
    "INSERT INTO dist_host_bytes (job_id, host_id, rx, tx, origin) "
    "VALUES (:j, :h, :rx, :tx, :o) ON CONFLICT (job_id, host_id) DO UPDATE SET "
    + ", ".join(
        f"{c} = CASE WHEN excluded.{c} > dist_host_bytes.{c} THEN excluded.{c} "
        f"ELSE dist_host_bytes.{c} END"
        for c in ("rx", "tx", "origin")
    )
)


@dataclass(frozen=True)
class HostBytes:
    """A host's cumulative byte counters in one job."""

    rx: int = 0
    tx: int = 0
    origin: int = 0

    def merged(self, other: HostBytes) -> HostBytes:
        """Counters only grow: the larger of each (a report from an agent that lost its
        journal, or the first one after a takeover, never lowers a figure)."""
        return HostBytes(
            max(self.rx, other.rx), max(self.tx, other.tx), max(self.origin, other.origin)
        )


@dataclass(frozen=True)
class HostHold:
    """Why a host is kept out of new jobs, since when (wall seconds), found in which job."""

    host_id: str
    kind: str  # QUARANTINED | HANDSHAKES
    reason: str
    job_id: str
    since: int

    def describe(self) -> str:
        return f"{self.kind}: {self.reason} (job {self.job_id})"


class Ledger:
    def __init__(self, store: JobStore) -> None:
        self.store = store

    # -- bytes --------------------------------------------------------------
    def put_bytes(self, job_id: str, rows: dict[str, HostBytes]) -> None:
        if not rows:
            return
        params = [
            {"j": job_id, "h": host, "rx": b.rx, "tx": b.tx, "o": b.origin}
            for host, b in sorted(rows.items())
        ]
        with self.store.tx() as c:
            c.execute(text(_PUT_BYTES), params)  # one batch (executemany)

    def bytes(self, job_id: str) -> dict[str, HostBytes]:
        with self.store.tx() as c:
            rows = c.execute(
                text("SELECT host_id, rx, tx, origin FROM dist_host_bytes WHERE job_id = :j"),
                {"j": job_id},
            ).all()
        return {str(r[0]): HostBytes(int(r[1]), int(r[2]), int(r[3])) for r in rows}

    # -- removed targets ----------------------------------------------------
    def remove(self, job_id: str, gone: RemovedHost) -> None:
        with self.store.tx() as c:
            c.execute(
                text(
                    "INSERT INTO dist_removed (job_id, host_id, reason, removed_at) "
                    "VALUES (:j, :h, :r, :t) ON CONFLICT (job_id, host_id) DO NOTHING"
                ),
                {
                    "j": job_id,
                    "h": gone.host_id,
                    "r": gone.reason[:REASON_MAX],
                    "t": gone.removed_at,
                },
            )

    def removed(self, job_id: str) -> dict[str, RemovedHost]:
        """The job's removed targets, each with why and when (Unix seconds)."""
        with self.store.tx() as c:
            rows = c.execute(
                text("SELECT host_id, reason, removed_at FROM dist_removed WHERE job_id = :j"),
                {"j": job_id},
            ).all()
        return {str(r[0]): RemovedHost(str(r[0]), str(r[1]), int(r[2])) for r in rows}

    # -- host holds (health across jobs) ------------------------------------
    def hold(self, host_id: str, kind: str, reason: str, job_id: str) -> None:
        """Keep ``host_id`` out of new jobs; the first hold stays until it is cleared."""
        with self.store.tx() as c:
            c.execute(
                text(
                    "INSERT INTO dist_host_holds (host_id, kind, reason, job_id, since) "
                    "VALUES (:h, :k, :r, :j, :t) ON CONFLICT (host_id) DO NOTHING"
                ),
                {
                    "h": host_id,
                    "k": kind,
                    "r": reason[:REASON_MAX],
                    "j": job_id,
                    "t": int(time.time()),
                },
            )

    def holds(self) -> dict[str, HostHold]:
        with self.store.tx() as c:
            rows = c.execute(
                text("SELECT host_id, kind, reason, job_id, since FROM dist_host_holds")
            ).all()
        return {
            str(r[0]): HostHold(str(r[0]), str(r[1]), str(r[2]), str(r[3]), int(r[4])) for r in rows
        }

    def clear_hold(self, host_id: str) -> HostHold | None:
        """Drop the host's hold; the hold it had (None: it had none)."""
        with self.store.tx() as c:
            row = c.execute(
                text(
                    "SELECT host_id, kind, reason, job_id, since FROM dist_host_holds "
                    "WHERE host_id = :h"
                ),
                {"h": host_id},
            ).first()
            if row is None:
                return None
            c.execute(text("DELETE FROM dist_host_holds WHERE host_id = :h"), {"h": host_id})
        return HostHold(str(row[0]), str(row[1]), str(row[2]), str(row[3]), int(row[4]))


__all__ = ["HostBytes", "HostHold", "Ledger"]
