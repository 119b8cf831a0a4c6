"""Origin pacing: the one token bucket, and how one origin budget is shared by stripe roots.

Every byte-rate limit in the agent is a :class:`TokenBucket` (a host's ``--max-rate``, each
stripe root's origin share); the simulator imports the same class, so a simulated root is
paced by the rule a real one is.

A job's origin cap is **one budget** for all its stripe roots. :func:`origin_shares` splits
it by what each stripe's root still has to read: a root that is behind gets more, one that
is ahead gets less, a stripe its root holds whole gets next to nothing (``IDLE``), and the shares never add up
to more than the cap. Shared in proportion to the bytes left, every stripe would finish at
the same moment if each root used its share; a floor (``FLOOR`` x the equal share) keeps a
root that is nearly done from being starved by a small rounding. The coordinator recomputes
the shares every sweep and hands each root its own in the reply to its next report.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence

FLOOR = 0.25  # a stripe with bytes left never gets under this fraction of the equal share
IDLE = 1  # bytes/s of a stripe with nothing left (never 0: a zero-rate bucket is unlimited)
# An origin share's burst, in seconds of the share: also the most one origin range may be
# (stripes.py). An origin bucket starts empty (a new root waits for its share like the
# others), so the roots together exceed the cap in a window by at most this fraction of it
# (plus what is still arriving of the ranges started just before), never by one range each
# of 16-64 MiB at the start or after a splice.
ORIGIN_BURST_S = 1 / 16


class TokenBucket:
    """Byte-rate limiter; ``rate <= 0`` means unlimited. Thread-safe."""

    def __init__(
        self,
        rate_bytes_per_s: float,
        burst: float | None = None,
        burst_s: float = 0.25,
        *,
        full: bool = True,
    ) -> None:
        self.rate = float(rate_bytes_per_s)
        self.burst_s = burst_s  # the burst in seconds of the rate (kept across set_rate)
        self.burst = float(burst if burst is not None else max(self.rate * burst_s, 1.0))
        # full=False: the first bytes wait for the rate too (an origin share: a new root,
        # at the start or after a splice, is no burst on top of the others)
        self.tokens = self.burst if full else 0.0
        self.stamp = time.monotonic()
        self.lock = threading.Lock()

    def set_rate(self, rate_bytes_per_s: float) -> None:
        with self.lock:
            self.rate = float(rate_bytes_per_s)
            self.burst = max(self.rate * self.burst_s, 1.0)

    def take(self, n: int) -> None:
        if self.rate <= 0:
            return
        while True:
            with self.lock:
                now = time.monotonic()
                self.tokens = min(self.burst, self.tokens + (now - self.stamp) * self.rate)
                self.stamp = now
                # A request larger than the burst is let through once the bucket is full;
                # the debt it leaves (negative tokens) keeps the long-run rate at `rate`.
                if self.tokens >= min(n, self.burst):
                    self.tokens -= n
                    return
                wait = (min(n, self.burst) - self.tokens) / self.rate if self.rate > 0 else 0
            time.sleep(min(wait, 0.5))


def origin_shares(cap: int, remaining: Sequence[int], floor: float = FLOOR) -> tuple[int, ...]:
    """Each stripe's share of ``cap`` bytes/s, given the bytes its root still has to read
    from the origin (``remaining[s]``). Shares grow with the bytes left, each stripe with
    bytes left gets at least ``floor`` x ``cap / active``, a stripe with none gets ``IDLE``,
    and ``sum(shares) <= cap``; with ``cap >= 4 x len(remaining)`` no share is 0 (a zero-rate
    bucket is unlimited). ``cap <= 0`` (unlimited): every share is 0 (no bucket)."""
    active = [s for s, r in enumerate(remaining) if r > 0]
    if cap <= 0:
        return (0,) * len(remaining)
    out = [IDLE] * len(remaining)
    budget = cap - IDLE * (len(remaining) - len(active))  # what the active stripes share
    if not active or budget <= 0:
        return tuple(out)
    base = floor * budget / len(active)  # the floor every active stripe gets
    rest = budget - base * len(active)  # the part shared by bytes left
    total = sum(remaining[s] for s in active)
    for s in active:
        out[s] = int(base + rest * remaining[s] / total)  # int() rounds down: sum <= cap
    return tuple(out)


__all__ = ["FLOOR", "IDLE", "ORIGIN_BURST_S", "TokenBucket", "origin_shares"]
