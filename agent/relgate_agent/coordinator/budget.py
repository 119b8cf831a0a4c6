"""The origin budget, shared by the stripe roots of every job reading that origin
(recomputed every sweep).

The rule itself (:func:`relgate_agent.dataplane.pacing.origin_shares`) is a pure function of the cap
and the bytes each stripe's root still has to read; this module reads those bytes off the
roots' reported bitmaps and keeps the result on the job: per stripe, and per root host for
the reply to its next report (a host roots several stripes in a small fleet).

One budget per origin (:func:`origin_key`: an S3 bucket, an HTTP(S) server, a directory),
across all jobs: the cap of an origin is the smallest cap of the active jobs that read it,
and all their stripes share it (two jobs never read one origin at twice its cap). A job that
joins an origin others read gets ``IDLE`` shares for ``JOIN_GRACE_REPORTS`` report
intervals, the time the roots already reading need to be told their smaller shares (in the
replies to their reports): the sum of what the roots run at never exceeds the cap.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable
from urllib.parse import urlparse

from relgate_agent.coordinator.jobstate import ACTIVE_STATES, JobState
from relgate_agent.dataplane.pacing import IDLE, origin_shares

JOIN_GRACE_REPORTS = 2  # report intervals a joining job waits for the others' new shares
_REBALANCES = itertools.count(1)  # numbers each rebalance: jobs joining in one are peers


def origin_key(uri: str) -> str:
    """Which origin a job reads: ``s3://bucket``, ``http(s)://host:port``, else the path."""
    parsed = urlparse(uri)
    if parsed.scheme and parsed.netloc:
        return f"{parsed.scheme}://{parsed.netloc}".lower()
    return parsed.path if parsed.scheme == "file" else uri


def stripe_remaining(job: JobState) -> list[int]:
    """Per stripe, the bytes of that stripe its current root has not verified (0 for a
    stripe with no root); a root that never reported holds nothing yet."""
    chunks, k = job.manifest.chunks, job.stripes
    out = [0] * k
    for s, chain in enumerate(job.topology.stripes):
        root = chain.root()
        if root is None:
            continue
        hp = job.hosts.get(root)
        out[s] = sum(
            chunks[c].size for c in range(s, len(chunks), k) if hp is None or not hp.holds(c)
        )
    return out


def _set_shares(job: JobState, shares: tuple[int, ...]) -> bool:
    if shares == job.origin_shares:
        return False
    job.origin_shares = shares
    by_root: dict[str, list[tuple[int, int]]] = {}
    for s, chain in enumerate(job.topology.stripes):
        root = chain.root()
        if root is not None:
            by_root.setdefault(root, []).append((s, shares[s]))
    job.origin_by_root = {h: tuple(v) for h, v in by_root.items()}
    return True


def rebalance_origins(jobs: Iterable[JobState], now: float, report_interval_s: float) -> None:
    """One budget per origin: the shares of every active job's stripe roots, each origin's
    cap split over the stripes of all the jobs that read it (``now``: the coordinator's
    clock)."""
    by_origin: dict[str, list[JobState]] = {}
    call = next(_REBALANCES)
    for job in jobs:
        if job.state in ACTIVE_STATES:
            by_origin.setdefault(origin_key(job.spec.origin_uri), []).append(job)
            job.origin_joined = job.origin_joined or (call, now)
    for group in by_origin.values():
        caps = [j.spec.origin_cap_bytes_per_s for j in group if j.spec.origin_cap_bytes_per_s > 0]
        if not caps:
            continue
        if len(group) == 1:
            _set_shares(group[0], origin_shares(min(caps), stripe_remaining(group[0])))
            continue
        # a job that joined after the others (not with them, as after a takeover) waits
        first = min((j.origin_joined or (call, now))[0] for j in group)
        left = [stripe_remaining(j) for j in group]
        shares = origin_shares(min(caps), [b for per_job in left for b in per_job])
        at = 0
        for job, per_job in zip(group, left, strict=True):
            mine = shares[at : at + len(per_job)]
            at += len(per_job)
            joined_in, joined_at = job.origin_joined or (call, now)
            if joined_in > first and now - joined_at < JOIN_GRACE_REPORTS * report_interval_s:
                mine = (IDLE,) * len(per_job)  # the others are told their new shares first
            _set_shares(job, tuple(mine))


def origin_rate(job: JobState, stripe: int) -> int:
    """The stripe root's share: this sweep's, or an equal share before the first sweep."""
    cap = job.spec.origin_cap_bytes_per_s
    if len(job.origin_shares) == job.stripes:
        return job.origin_shares[stripe]
    return cap // job.stripes if cap else 0


__all__ = [
    "JOIN_GRACE_REPORTS",
    "origin_key",
    "origin_rate",
    "rebalance_origins",
    "stripe_remaining",
]
