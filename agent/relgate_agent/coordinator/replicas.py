"""Replicas: who serves in a sharded coordinator, and which job leases each one holds.

With ``--shard-by-job`` every replica writes a membership row (its id, the address clients
reach it at, when the row expires) and every active job has its own lease row in
``dist_lease`` named ``job:<job_id>``, with its own epoch. This module is that SQL (the
same text SQLite and PostgreSQL accept, on the :class:`JobStore`'s engine); the policy that
decides which replica takes which job is :mod:`relgate_agent.coordinator.shard`.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from sqlalchemy import bindparam, text

from relgate_agent.coordinator.jobstate import ACTIVE_STATES
from relgate_agent.coordinator.store import JOB_LEASE_PREFIX, JobStore, job_lease_name

REPLICAS_SCHEMA = """CREATE TABLE IF NOT EXISTS dist_replicas (
    replica_id TEXT PRIMARY KEY,
    address TEXT NOT NULL,
    expires_at_ms BIGINT NOT NULL
)"""


@dataclass(frozen=True)
class Replica:
    """A live replica: its id and the address clients are redirected to."""

    replica_id: str
    address: str


@dataclass(frozen=True)
class JobLease:
    """One job's lease as the store holds it."""

    job_id: str
    holder: str
    epoch: int
    expires_at_ms: int


def _now_ms() -> int:
    return int(time.time() * 1000)


class Replicas:
    """Membership rows and job leases on ``store`` (created on first use)."""

    def __init__(self, store: JobStore) -> None:
        self.store = store
        with store.tx() as c:
            c.execute(text(REPLICAS_SCHEMA))

    def beat(self, replica_id: str, address: str, ttl_s: float) -> None:
        """This replica is alive for ``ttl_s`` more seconds (insert or renew its row)."""
        exp = _now_ms() + int(ttl_s * 1000)
        with self.store.tx() as c:
            c.execute(
                text(
                    "INSERT INTO dist_replicas (replica_id, address, expires_at_ms) "
                    "VALUES (:r, :a, :e) ON CONFLICT (replica_id) "
                    "DO UPDATE SET address = :a, expires_at_ms = :e"
                ),
                {"r": replica_id, "a": address, "e": exp},
            )

    def leave(self, replica_id: str) -> None:
        """A replica shutting down: its row and its job leases expire now."""
        with self.store.tx() as c:
            c.execute(
                text("UPDATE dist_replicas SET expires_at_ms = 0 WHERE replica_id = :r"),
                {"r": replica_id},
            )
            c.execute(
                text("UPDATE dist_lease SET expires_at_ms = 0 WHERE holder = :r AND name LIKE :p"),
                {"r": replica_id, "p": JOB_LEASE_PREFIX + "%"},
            )

    def live(self) -> list[Replica]:
        """Replicas whose membership row has not expired, by id."""
        with self.store.tx() as c:
            rows = c.execute(
                text(
                    "SELECT replica_id, address FROM dist_replicas WHERE expires_at_ms >= :now "
                    "ORDER BY replica_id"
                ),
                {"now": _now_ms()},
            ).all()
        return [Replica(str(r[0]), str(r[1])) for r in rows]

    def active_jobs(self) -> list[str]:
        """The ids of the jobs in an active state, oldest first (the jobs to lead)."""
        query = text(
            "SELECT job_id FROM dist_jobs WHERE state IN :states ORDER BY created_at, job_id"
        ).bindparams(bindparam("states", expanding=True))
        with self.store.tx() as c:
            rows = c.execute(query, {"states": list(ACTIVE_STATES)}).all()
        return [str(r[0]) for r in rows]

    def address_of(self, replica_id: str) -> str:
        """The address ``replica_id`` last advertised ("" when it never did)."""
        with self.store.tx() as c:
            row = c.execute(
                text("SELECT address FROM dist_replicas WHERE replica_id = :r"),
                {"r": replica_id},
            ).first()
        return str(row[0]) if row else ""

    def leases(self) -> dict[str, JobLease]:
        """Every job lease, expired or not, by job id."""
        with self.store.tx() as c:
            rows = c.execute(
                text(
                    "SELECT name, holder, epoch, expires_at_ms FROM dist_lease WHERE name LIKE :p"
                ),
                {"p": JOB_LEASE_PREFIX + "%"},
            ).all()
        out = {}
        for r in rows:
            job_id = str(r[0])[len(JOB_LEASE_PREFIX) :]
            out[job_id] = JobLease(job_id, str(r[1]), int(r[2]), int(r[3]))
        return out

    def renew(self, replica_id: str, ttl_s: float) -> dict[str, int]:
        """Renew every job lease ``replica_id`` holds; the jobs it holds now -> their epochs.

        A lease another replica took is no longer ``replica_id``'s: it is not renewed and
        not returned (the caller drops that job). An expired one nobody took is renewed:
        no one else led the job meanwhile, so the epoch stands."""
        exp = _now_ms() + int(ttl_s * 1000)
        with self.store.tx() as c:
            c.execute(
                text("UPDATE dist_lease SET expires_at_ms = :e WHERE holder = :r AND name LIKE :p"),
                {"e": exp, "r": replica_id, "p": JOB_LEASE_PREFIX + "%"},
            )
            rows = c.execute(
                text("SELECT name, epoch FROM dist_lease WHERE holder = :r AND name LIKE :p"),
                {"r": replica_id, "p": JOB_LEASE_PREFIX + "%"},
            ).all()
        return {str(r[0])[len(JOB_LEASE_PREFIX) :]: int(r[1]) for r in rows}

    def take(self, replica_id: str, job_id: str, ttl_s: float) -> int | None:
        """Take ``job_id``'s lease if free or expired (the store's compare-and-set); its
        epoch when ``replica_id`` holds it now, else None."""
        return self.store.acquire_lease(replica_id, ttl_s, name=job_lease_name(job_id))

    def release(self, replica_id: str, job_id: str) -> None:
        """Give up ``job_id``'s lease (it finished here)."""
        self.store.release_lease(replica_id, name=job_lease_name(job_id))


__all__ = ["JOB_LEASE_PREFIX", "JobLease", "Replica", "Replicas", "job_lease_name"]
