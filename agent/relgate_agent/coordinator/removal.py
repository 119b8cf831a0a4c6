"""Removing a target from a job, with its reason.

A target that cannot finish (out of disk, an operator's eviction, ...) is taken out of the
job: it is spliced out of every chain (its downstreams are re-fed by its upstream as for a
dead host), the job no longer waits for it (:attr:`JobState.eligible`), it may not register
again for the job, and the reason is kept with the job (``dist_removed``) so a restarted
coordinator or a new leader keeps it out and reports why.
"""

from __future__ import annotations

import logging
from typing import Protocol

from relgate_agent.coordinator.jobstate import REMOVED, JobState
from relgate_agent.coordinator.store import JobStore
from relgate_agent.coordinator.topology import Topology

log = logging.getLogger(__name__)


class _Core(Protocol):
    """What removal needs of the coordinator (caller holds its lock)."""

    store: JobStore

    def _splice(self, job: JobState, *hosts: str) -> Topology: ...

    def _set_topology(self, job: JobState, topo: Topology) -> None: ...


def remove_target(core: _Core, job: JobState, host: str, reason: str) -> bool:
    """Take ``host`` out of ``job`` for ``reason``; False when it is not a target, already
    removed, or READY (a placed copy stays counted)."""
    hp = job.hosts.get(host)
    if hp is None or host not in job.targets or host in job.removed or hp.ready:
        return False
    job.removed[host] = reason
    hp.state = REMOVED
    hp.errors.append(f"{REMOVED} {reason}")
    log.warning("job %s: %s removed (%s)", job.job_id, host, reason)
    core.store.remove_target(job.job_id, host, reason)
    if host in job.topology.racks:  # its downstreams are fed by its upstream from now on
        core._set_topology(job, core._splice(job, host))
    return True


def restore_removed(store: JobStore, job: JobState) -> None:
    """A loaded job's removed targets, as the store holds them (a new leader, a restart)."""
    for host, reason in store.removed(job.job_id).items():
        hp = job.hosts.get(host)
        if hp is None or hp.ready:
            continue
        job.removed[host] = reason
        hp.state = REMOVED


__all__ = ["remove_target", "restore_removed"]
