"""How a job ends without every target: removed hosts, and host health across jobs.

A job waits for its *remaining* targets: every target but the quarantined and the removed.
A target is removed

- by an operator: ``relgate-agent job evict JOB HOST --reason R`` (``evicted by <operator>:
  R``), at once, whatever its state short of READY;
- by the sweeper: a host DEAD (spliced out for silence) for ``remove_dead_after_s`` is
  removed (``dead since <time> ...``), so a lost host never holds a job short of DONE.

A removed host is spliced out, is never a source again, is told the job ended for it (its
staging is kept) and is refused if it registers again; the job reports it among its
``removed_hosts`` with the reason, and is DONE once every remaining target is READY.

Host health lives in the ledger's host holds, across jobs: a host quarantined for bad data
(or, through :func:`hold_host`, one whose handshakes fail everywhere) is no target of a new
job, nor a late joiner, until an operator clears the hold after a scrub
(``relgate-agent hosts clear HOST --note ...``).
"""

from __future__ import annotations

import logging
import time

from relgate_agent.contracts import RemovedHost
from relgate_agent.coordinator.jobstate import (
    QUARANTINED,
    REMOVED,
    JobState,
    NotFound,
    Rejected,
)
from relgate_agent.coordinator.leader import CoordinatorCore
from relgate_agent.coordinator.ledger import REASON_MAX, HostHold, Ledger
from relgate_agent.coordinator.metrics import SPLICE_REMOVED

log = logging.getLogger(__name__)

HOLD_QUARANTINED = "QUARANTINED"  # BAD_DATA from two downstreams
HOLD_HANDSHAKES = "HANDSHAKES"  # its data-plane handshakes failed with every peer


def remove_host(core: CoordinatorCore, job: JobState, host: str, reason: str) -> bool:
    """Remove ``host`` from ``job`` (caller holds the lock): spliced out, never waited for,
    reported with ``reason`` (an operator's eviction, dead past the bound, NO_SPACE, the
    suspect of its own complaints, a certificate that expired or was revoked). False when it
    is not a target, READY, or already removed or quarantined."""
    hp = job.hosts.get(host)
    if hp is None or host not in job.targets or hp.removed or hp.state == QUARANTINED:
        return False
    if hp.ready:  # a placed copy stays counted (its bytes were verified when placed)
        return False
    gone = RemovedHost(host, reason[:REASON_MAX], int(core.wall()))
    core.ledger.remove(job.job_id, gone)
    hp.removed, hp.removed_at, hp.state, hp.straggler = gone.reason, gone.removed_at, REMOVED, ""
    hp.errors.append(f"{REMOVED}: {reason}")
    job.removals += 1
    log.warning("job %s: %s removed (%s)", job.job_id, host, reason)
    if host in job.topology.racks:
        core._set_topology(job, core._splice(job, host))
        core.metrics.splices.labels(SPLICE_REMOVED).inc()
    core.changed.notify_all()
    return True


def evict(core: CoordinatorCore, job_id: str, host: str, reason: str, by: str) -> bool:
    """The operator's ``job evict``: True when removed now, False when it already was."""
    core.require_leader()
    if not reason.strip():
        raise Rejected("an eviction needs a --reason", check="evict-reason")
    with core.lock:
        core.require_leader()
        job = core._job(job_id)
        hp = job.hosts.get(host)
        if hp is None or host not in job.targets:
            raise NotFound(f"host {host} is not a target of job {job_id}")
        if hp.ready:
            raise Rejected(
                f"host {host} is READY in job {job_id}: nothing to evict", check="evict-ready"
            )
        return remove_host(core, job, host, f"evicted by {by}: {reason.strip()}")


def sweep_dead(core: CoordinatorCore, job: JobState, now: float) -> None:
    """Remove every host DEAD for ``remove_dead_after_s`` (caller holds the lock)."""
    bound = core.config.remove_dead_after_s
    for h, hp in list(job.hosts.items()):
        if hp.state != "DEAD" or hp.ready:
            hp.dead_since = None
            continue
        if hp.dead_since is None:
            hp.dead_since = now
            continue
        if now - hp.dead_since >= bound:
            since = time.strftime(
                "%Y-%m-%dT%H:%M:%SZ", time.gmtime(core.wall() - (now - hp.dead_since))
            )
            remove_host(core, job, h, f"dead since {since}, removed after {bound:g}s")


def removed_hosts(job: JobState) -> tuple[RemovedHost, ...]:
    """Every target the job no longer waits for, with why and when (the quarantined
    included), by host id: what GetJob and the deployer events report."""
    out = [RemovedHost(h, why, job.hosts[h].removed_at) for h, why in job.removed.items()]
    for h in job.quarantined:
        hp = job.hosts[h]
        why = next((e for e in reversed(hp.errors) if e.startswith(QUARANTINED)), QUARANTINED)
        why = why if why.startswith(f"{QUARANTINED}:") else f"{QUARANTINED}: {why}"
        out.append(RemovedHost(h, why, hp.removed_at))
    return tuple(sorted(out, key=lambda r: r.host_id))


def removed_text(job: JobState) -> str:
    """The removed targets and why, on one line (a FAILED job's reason)."""
    return "; ".join(f"{r.host_id}: {r.reason}" for r in removed_hosts(job))


# ---------------------------------------------------------------------- host holds
def hold_host(ledger: Ledger, host: str, kind: str, reason: str, job_id: str) -> None:
    """Keep ``host`` out of new jobs until an operator clears it (the first hold stays)."""
    ledger.hold(host, kind, reason, job_id)
    log.warning("host %s held out of new jobs: %s: %s (job %s)", host, kind, reason, job_id)


def clear_hold(core: CoordinatorCore, host: str, note: str) -> HostHold | None:
    """The operator's ``hosts clear``: the hold it had (None: none)."""
    core.require_leader()
    was = core.ledger.clear_hold(host)
    if was is not None:
        log.warning("host %s cleared by an operator (%s); was %s", host, note, was.describe())
    return was


__all__ = [
    "HOLD_HANDSHAKES",
    "HOLD_QUARANTINED",
    "clear_hold",
    "evict",
    "hold_host",
    "remove_host",
    "removed_hosts",
    "removed_text",
    "sweep_dead",
]
