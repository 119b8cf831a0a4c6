"""Shard: which jobs a replica leads when coordinators are sharded by job.

Every active job has its own lease (``job:<id>`` in ``dist_lease``, its own epoch); every
replica renews a membership row (:mod:`.replicas`). A replica leads the jobs whose leases
it holds, and takes free or expired ones up to its **bounded share**: ``ceil(active jobs /
live replicas)``. So N jobs over R live replicas end with at most ``ceil(N/R)`` each (6
over 3: exactly 2 each), and a replica's death frees only its own leases: the survivors
take those (each up to its new, larger share) and keep the jobs they led, with the same
epoch. Nothing is moved away from a live replica (no rebalancing when one joins: a move
costs the job a takeover grace, coordinator/failover.py); a joiner takes new and orphaned
jobs only.

Which free job a replica tries first is ordered by a hash of (replica, job), different for
every replica, so replicas racing for a burst of new jobs mostly try different leases; the
lease's compare-and-set decides when two try the same one.
"""

from __future__ import annotations

import hashlib
import math
import time
from collections.abc import Iterable, Mapping

from relgate_agent.coordinator.jobstate import NotLeader
from relgate_agent.coordinator.replicas import JobLease, Replicas
from relgate_agent.coordinator.store import JobStore, LeaseFence


def share(active_jobs: int, live_replicas: int) -> int:
    """The most jobs one replica leads: ``ceil(active / live)`` (all of them when alone)."""
    return math.ceil(active_jobs / max(1, live_replicas))


def free(job_id: str, leases: Mapping[str, JobLease], now_ms: int) -> bool:
    """Nobody holds ``job_id``'s lease now: it has none, or it expired."""
    lease = leases.get(job_id)
    return lease is None or lease.expires_at_ms < now_ms


def candidates(
    replica_id: str,
    active: Iterable[str],
    held: Iterable[str],
    leases: Mapping[str, JobLease],
    live: int,
    now_ms: int,
) -> tuple[list[str], int]:
    """(the free active jobs in the order ``replica_id`` tries them, how many it may take)."""
    active = list(active)
    mine = set(held) & set(active)
    room = share(len(active), live) - len(mine)
    loose = [j for j in active if j not in mine and free(j, leases, now_ms)]
    loose.sort(key=lambda j: hashlib.sha256(f"{replica_id}\0{j}".encode()).digest())
    return loose, max(0, room)


class Shard:
    """One replica's job leases: renewed together, taken up to its share, fenced in the store."""

    def __init__(self, store: JobStore, replica_id: str, ttl_s: float) -> None:
        self.replicas = Replicas(store)
        self.replica_id = replica_id
        self.ttl_s = ttl_s
        self.address = ""  # where clients reach this replica (set by the server)
        self.fence = LeaseFence(replica_id, {})  # job -> epoch of the lease held
        store.fence = self.fence  # job writes only under a held lease, at its epoch
        self.store = store

    @property
    def epochs(self) -> dict[str, int]:
        return self.fence.epochs

    def renew(self) -> dict[str, int]:
        """Beat the membership row and renew every lease held; the jobs held -> epochs."""
        self.replicas.beat(self.replica_id, self.address, self.ttl_s)
        return self.replicas.renew(self.replica_id, self.ttl_s)

    def take_share(self, held: Mapping[str, int]) -> dict[str, int]:
        """Take free leases up to this replica's share; the jobs taken -> their epochs."""
        active = self.replicas.active_jobs()
        loose, room = candidates(
            self.replica_id,
            active,
            held,
            self.replicas.leases(),
            len(self.replicas.live()),
            int(time.time() * 1000),
        )
        taken: dict[str, int] = {}
        for job_id in loose:
            if len(taken) >= room:
                break
            epoch = self.replicas.take(self.replica_id, job_id, self.ttl_s)
            if epoch is not None:
                taken[job_id] = epoch
        return taken

    def claim_new(self, job_id: str, led: int) -> int | None:
        """A job just created here: its lease's epoch when this replica is under its share
        and takes it, else None (another replica takes it at its next renewal)."""
        if led >= share(len(self.replicas.active_jobs()), len(self.replicas.live())):
            return None
        return self.replicas.take(self.replica_id, job_id, self.ttl_s)

    def redirect(self, job_id: str) -> NotLeader | None:
        """Why this replica does not answer for ``job_id``, which it does not lead: led by
        another live replica (NotLeader naming its address), or active with no leader yet
        (NotLeader, no hint: retry); None when the job is not active (finished, unknown)."""
        if job_id not in set(self.replicas.active_jobs()):
            return None
        lease = self.replicas.leases().get(job_id)
        if lease is None or free(job_id, {job_id: lease}, int(time.time() * 1000)):
            return NotLeader(f"job {job_id} has no leader yet; retry shortly")
        if lease.holder == self.replica_id:  # held, not loaded yet (the next renewal loads it)
            return NotLeader(f"replica {self.replica_id} is taking over job {job_id}")
        address = self.replicas.address_of(lease.holder)
        return NotLeader(
            f"job {job_id} is led by replica {lease.holder} (epoch {lease.epoch}) at {address}",
            leader=address,
        )

    def leaders(self) -> dict[str, tuple[str, str, int]]:
        """Job -> (replica, its address, epoch) of every live job lease (``job list``)."""
        now_ms = int(time.time() * 1000)
        addresses = {r.replica_id: r.address for r in self.replicas.live()}
        return {
            j: (lease.holder, addresses.get(lease.holder, ""), lease.epoch)
            for j, lease in self.replicas.leases().items()
            if not free(j, {j: lease}, now_ms)
        }

    def release(self, job_id: str) -> None:
        """Give up ``job_id``'s lease (it finished here)."""
        self.epochs.pop(job_id, None)
        self.replicas.release(self.replica_id, job_id)

    def leave(self) -> None:
        """Shutting down: membership and every lease expire now (the others take the jobs)."""
        self.epochs.clear()
        self.replicas.leave(self.replica_id)


__all__ = ["Shard", "candidates", "free", "share"]
