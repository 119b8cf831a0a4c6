"""The job's origin budget, shared by its stripe roots (recomputed every sweep).

The rule itself (:func:`relgate_agent.pacing.origin_shares`) is a pure function of the cap
and the bytes each stripe's root still has to read; this module reads those bytes off the
roots' reported bitmaps and keeps the result on the job: per stripe, and per root host for
the reply to its next report (a host roots several stripes in a small fleet).
"""

from __future__ import annotations

from relgate_agent.coordinator.jobstate import JobState
from relgate_agent.pacing import origin_shares


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


def rebalance_origin(job: JobState) -> bool:
    """Recompute the origin shares of ``job``'s stripe roots; True when they changed."""
    cap = job.spec.origin_cap_bytes_per_s
    if cap <= 0:
        return False
    shares = origin_shares(cap, stripe_remaining(job))
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


def origin_rate(job: JobState, stripe: int) -> int:
    """The stripe root's share: this sweep's, or an equal share before the first sweep."""
    cap = job.spec.origin_cap_bytes_per_s
    if len(job.origin_shares) == job.stripes:
        return job.origin_shares[stripe]
    return cap // job.stripes if cap else 0


__all__ = ["origin_rate", "rebalance_origin", "stripe_remaining"]
