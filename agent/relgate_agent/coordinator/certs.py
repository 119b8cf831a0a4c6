"""A host whose certificate expired or was revoked stops being a target.

The server refuses such a caller on every call (``certlife.refusal``); this is what the
coordinator does about it: the host is removed (``removal.remove_host``: ``REMOVED``, with
the check and why, kept in the ledger across a takeover) from
every active job it is a target of and not yet READY in, spliced out of its chains, so
nobody waits for it, feeds it or is fed by it. A READY host keeps its placement (its bytes
were verified when they were placed).
"""

from __future__ import annotations

from relgate_agent.coordinator import removal
from relgate_agent.coordinator.jobstate import ACTIVE_STATES, GONE_STATES
from relgate_agent.coordinator.leader import CoordinatorCore


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
            if removal.remove_host(coord, job, host, f"{check}: {why}"):
                left.append(job.job_id)
    return left


__all__ = ["cut_off"]
