"""A host whose certificate expired or was revoked stops being a target.

The server refuses such a caller on every call (``certlife.refusal``); this is what the
coordinator does about it: the host is removed (``REMOVED``, with the check and why) from
every active job it is a target of and not yet READY in, spliced out of its chains, so
nobody waits for it, feeds it or is fed by it. A READY host keeps its placement (its bytes
were verified when they were placed).
"""

from __future__ import annotations

import logging

from relgate_agent.coordinator.jobstate import ACTIVE_STATES, GONE_STATES, REMOVED
from relgate_agent.coordinator.leader import CoordinatorCore
from relgate_agent.coordinator.metrics import SPLICE_REMOVED

log = logging.getLogger(__name__)


def cut_off(coord: CoordinatorCore, host: str, check: str, why: str) -> list[str]:
    """Remove ``host`` from every active job it still waits in; the jobs it left."""
    left: list[str] = []
    with coord.lock:
        if not coord.leader:
            return left
        for job in coord.jobs.values():
            hp = job.hosts.get(host)
            if job.state not in ACTIVE_STATES or hp is None or hp.ready:
                continue
            if hp.state in GONE_STATES:
                continue
            log.warning("job %s: removing %s: %s (%s)", job.job_id, host, why, check)
            hp.errors.append(f"{REMOVED} {check}: {why}")
            hp.state = REMOVED
            if host in job.topology.racks:
                coord._set_topology(job, coord._splice(job, host))
                coord.metrics.splices.labels(SPLICE_REMOVED).inc()
            left.append(job.job_id)
        if left:
            coord.changed.notify_all()
    return left


__all__ = ["cut_off"]
