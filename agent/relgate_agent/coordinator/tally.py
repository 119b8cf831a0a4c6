"""Progress figures that are facts: byte counters, the ETA, stragglers with their reasons.

Byte counters. Each agent counts, per job, the bytes it received from peers, sent, and read
from the origin (as they came off the wire, every range it read, kept or not), journals the
counters with its verified chunks and reports them cumulatively, so a restarted agent goes on
from its journal. The coordinator keeps each host's counters as the larger of what it holds
and what a report says (a counter never goes down: an agent that lost its journal, or the
first report after a takeover, never lowers a figure), and writes them to the ledger
(``dist_host_bytes``) every ``SAVE_INTERVAL_S``, at once when a host is READY (it stops
reporting) and when the job ends; a new leader restores them. ``bytesMoved`` and
``originBytes`` are the sums over the job's hosts.

ETA. From each remaining host's own rate: its bytes left (chunks not verified, at the
checkpoint's mean chunk size) over its receive rate (peers and origin); the job's ETA is the
largest. A DEAD host counts as the time until it is removed; a live host that has no rate
yet makes the ETA unknown (-1).

Stragglers. A remaining host is a straggler when it is DEAD, was demoted or is being judged
slow, gave up, or holds under ``STRAGGLER_FRACTION`` x the median progress (once the median
holds ``BEHIND_MIN_CHUNKS``: the first moments of a job are no evidence); once listed it
stays listed (its figures refreshed) until it is READY or removed.
"""

from __future__ import annotations

import statistics
import time

from relgate_agent.contracts import HostReason, ProgressReport
from relgate_agent.coordinator.jobstate import (
    GONE_STATES,
    HostProgress,
    JobState,
)
from relgate_agent.coordinator.ledger import HostBytes, Ledger

SAVE_INTERVAL_S = 5.0  # counters of still-reporting hosts: a takeover gets them re-reported
STRAGGLER_FRACTION = 0.5  # of the median progress
BEHIND_MIN_CHUNKS = 4  # the median holds at least this many before "behind" means anything


def merge_report(hp: HostProgress, report: ProgressReport) -> None:
    """A report's cumulative counters into the host's (each only grows: a negative one
    from a hostile report changes nothing)."""
    b = HostBytes(hp.rx, hp.tx, hp.origin).merged(HostBytes(report.rx, report.tx, report.origin))
    hp.rx, hp.tx, hp.origin = b.rx, b.tx, b.origin


def due(job: JobState, now: float, *, hosts: tuple[str, ...] | None = None) -> dict[str, HostBytes]:
    """The counters to write (marked written; caller holds the lock): those of ``hosts``
    that changed, or of every host that changed once per ``SAVE_INTERVAL_S`` (``hosts=None``;
    ``now`` is the coordinator's clock)."""
    if hosts is None:
        if job.tally_saved_at is not None and now - job.tally_saved_at < SAVE_INTERVAL_S:
            return {}
        job.tally_saved_at = now
        hosts = tuple(job.hosts)
    rows: dict[str, HostBytes] = {}
    for h in hosts:
        hp = job.hosts.get(h)
        if hp is not None and (hp.rx, hp.tx, hp.origin) != hp.bytes_saved:
            rows[h] = HostBytes(hp.rx, hp.tx, hp.origin)
            hp.bytes_saved = (hp.rx, hp.tx, hp.origin)
    return rows


def save(
    ledger: Ledger, job: JobState, now: float, *, hosts: tuple[str, ...] | None = None
) -> None:
    """Write :func:`due`'s counters now."""
    ledger.put_bytes(job.job_id, due(job, now, hosts=hosts))


def restore(ledger: Ledger, job: JobState) -> None:
    """A job loaded by a new leader: its hosts' counters as last written."""
    for h, b in ledger.bytes(job.job_id).items():
        hp = job.hosts.get(h)
        if hp is not None:
            hp.rx, hp.tx, hp.origin = b.rx, b.tx, b.origin
            hp.bytes_saved = (b.rx, b.tx, b.origin)


def bytes_moved(job: JobState) -> int:
    return sum(hp.rx for hp in job.hosts.values())


def origin_bytes(job: JobState) -> int:
    return sum(hp.origin for hp in job.hosts.values())


def _bytes_left(job: JobState, hp: HostProgress) -> int:
    n = job.manifest.num_chunks
    if n <= 0 or hp.ready:
        return 0
    return job.manifest.total_size * max(n - hp.verified, 0) // n


def host_eta(job: JobState, hp: HostProgress, now: float, remove_after_s: float) -> float | None:
    """Seconds until ``hp`` is READY (or removed, when DEAD); None: no rate to tell."""
    if hp.state == "DEAD":
        since = hp.dead_since if hp.dead_since is not None else now
        return max(remove_after_s - (now - since), 0.0)
    left = _bytes_left(job, hp)
    if left == 0:
        return 0.0
    return left / hp.rx_bps if hp.rx_bps > 0 else None


def remaining(job: JobState) -> list[HostProgress]:
    """The hosts the job still waits for: remaining targets not READY."""
    return [job.hosts[h] for h in sorted(job.eligible) if h in job.hosts and not job.hosts[h].ready]


def eta_s(job: JobState, now: float, remove_after_s: float) -> int:
    """The job's ETA: the slowest remaining host's own (-1: unknown)."""
    worst = 0.0
    for hp in remaining(job):
        eta = host_eta(job, hp, now, remove_after_s)
        if eta is None:
            return -1
        worst = max(worst, eta)
    return int(worst + 0.999)


def _why(job: JobState, hp: HostProgress, now: float, median: float, eta: float | None) -> str:
    """Why ``hp`` is behind now ("": it is not), with the figures."""
    n = job.manifest.num_chunks or 1
    figures = f"{hp.verified}/{n} chunks, rx {hp.rx_bps} B/s, tx {hp.tx_bps} B/s"
    if hp.state == "DEAD":
        since = now - (hp.dead_since if hp.dead_since is not None else now)
        wall = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(time.time() - since))
        return f"dead since {wall} ({figures})"
    if hp.state == "FAILED":
        return f"gave up ({hp.errors[-1] if hp.errors else 'HOST_FAILED'})"
    demoted = next((e for e in reversed(hp.errors) if e.startswith(("DEMOTED", "LEAF"))), "")
    if hp.demoted and demoted:
        return f"{demoted} ({figures})"
    ref = job.rate_reference[1] if job.rate_reference else 0
    if hp.slow_since is not None:
        return f"slow for {now - hp.slow_since:.0f}s: {figures}; reference rx {ref} B/s"
    if median * n >= BEHIND_MIN_CHUNKS and hp.verified < STRAGGLER_FRACTION * median * n:
        left = f", eta {eta:.0f}s" if eta is not None else ""
        return f"behind: {figures} vs median {median * n:.0f} chunks{left}"
    return ""


def stragglers(job: JobState, now: float, remove_after_s: float) -> tuple[HostReason, ...]:
    """The job's stragglers with their reasons; refreshes the sticky ones (caller holds the
    lock): a host once listed stays until READY or removed."""
    n = job.manifest.num_chunks or 1
    eligible = job.eligible  # a property that builds a set: once, not once per host
    alive = [
        1.0 if hp.ready else hp.verified / n
        for h, hp in job.hosts.items()
        if h in eligible and hp.state not in GONE_STATES
    ]
    median = statistics.median(alive) if alive else 0.0
    out = []
    for hp in remaining(job):
        why = _why(job, hp, now, median, host_eta(job, hp, now, remove_after_s))
        if why:
            hp.straggler = why
            out.append(HostReason(hp.host_id, why))
        elif hp.straggler:  # caught up, not READY yet: still listed, with its figures now
            out.append(
                HostReason(
                    hp.host_id,
                    f"{hp.straggler}; now {hp.verified}/{n} chunks, rx {hp.rx_bps} B/s",
                )
            )
    return tuple(out)


__all__ = [
    "BEHIND_MIN_CHUNKS",
    "SAVE_INTERVAL_S",
    "STRAGGLER_FRACTION",
    "bytes_moved",
    "due",
    "eta_s",
    "host_eta",
    "merge_report",
    "origin_bytes",
    "remaining",
    "restore",
    "save",
    "stragglers",
]
