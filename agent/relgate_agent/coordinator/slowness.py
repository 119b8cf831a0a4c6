"""Slowness: who is slow, per stripe, in which direction (pure functions, no I/O).

Each report carries the host's receive rate per stripe (``STRIPE_DONE`` for a stripe it
holds whole: nothing left to receive, so no rate to judge). A host is *slow in a stripe*
when it receives that stripe under ``fraction`` x the median per-stripe rate of the job
(every stripe carries about 1/k of a host's traffic, so one reference serves them all; a
stripe's own median would hide a slow stripe root, with everyone behind it as slow).

A chain passes slowness on: everyone behind a slow hop is slow too. So blame goes to the
first slow hop: an edge whose upstream receives the stripe at speed (or holds it whole, or
is READY) and whose child does not. Such an edge is either the upstream's upload or the
child's download; stripes rotate who feeds whom, so each host meets several peers. A host
slow with every upstream it has is **rx-slow** (its own NIC or disk); a host whose every
child is slow, where those children are fast with someone else, is **tx-slow**: its upload
holds the chain (the seed's serving host, a 40 Mbit uploader). One slow edge alone blames
nobody. Both become leaves at their rack tails; nobody waits behind them.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from relgate_agent.contracts import STRIPE_DONE

MIN_RATES = 3  # receiving hosts a stripe needs before "slow vs the median" means anything
WITNESSES = 2  # distinct peers a host must be slow with before it alone is blamed


@dataclass(frozen=True)
class Verdicts:
    rx_slow: frozenset[str]
    tx_slow: frozenset[str]
    median: int  # the per-stripe receive rate slowness is judged against (0: not judged)


def stripe_median(rates: Mapping[str, Sequence[int]], floor: int) -> int:
    """The median per-stripe receive rate over every (receiving host, stripe) pair; 0 when
    fewer than ``MIN_RATES`` hosts receive or the fleet is under ``floor``."""
    rs = sorted(r for rr in rates.values() for r in rr if r > 0)
    if sum(1 for rr in rates.values() if any(r > 0 for r in rr)) < MIN_RATES:
        return 0
    median = rs[len(rs) // 2]
    return median if median >= floor else 0


def judge(
    rates: Mapping[str, Sequence[int]],
    totals: Mapping[str, int],
    parents: Sequence[Mapping[str, str | None]],
    fraction: float,
    floor: int,
) -> Verdicts:
    """``rates``: host -> receive rate per stripe (``STRIPE_DONE`` for a whole stripe);
    ``totals``: host -> total receive rate; ``parents``: per stripe, host -> upstream (None:
    the stripe root, fed by the origin)."""
    median = stripe_median(rates, floor)

    def slow(host: str, s: int) -> bool | None:
        r = rates.get(host)
        if r is None or len(r) <= s or r[s] == STRIPE_DONE or not median:
            return None  # not judged: no rate, a whole stripe, or nothing to compare with
        return r[s] < fraction * median

    # first slow hops only: an edge whose upstream receives the stripe at speed (or holds
    # it whole, or is READY); behind a slow hop everyone is slow and proves nothing
    first_slow: dict[str, set[str]] = {}  # child -> upstreams it is slow with
    first_fast: dict[str, set[str]] = {}  # child -> upstreams it is fast with
    kids_fast: dict[str, set[str]] = {}
    kids_slow: dict[str, set[str]] = {}
    for s, parent in enumerate(parents):
        for child, up in parent.items():
            v = slow(child, s)
            if up is None or v is None or slow(up, s):
                continue
            (first_slow if v else first_fast).setdefault(child, set()).add(up)
            (kids_slow if v else kids_fast).setdefault(up, set()).add(child)
    # rx: the host's whole receive rate is low (max-min sharing can leave an rx-capped host
    # fast in a few stripes, so its total is the test) and it is itself a first slow hop
    # (the hosts behind it are slow only where their upstream is: victims, not culprits)
    live = sorted(t for h, t in totals.items() if t > 0 and h in rates)
    total_median = live[len(live) // 2] if len(live) >= MIN_RATES else 0
    rx_slow = {
        h
        for h in first_slow
        if total_median >= floor and 0 <= totals.get(h, 0) < fraction * total_median
    }
    # tx: every child it feeds at a first hop is slow (two of them, or one that is fast
    # with another upstream), and those children are not slow at receiving themselves
    tx_slow = set()
    for up, kids in kids_slow.items():
        culprits = kids - rx_slow
        if up in rx_slow or kids_fast.get(up) or not culprits:
            continue
        if len(culprits) >= WITNESSES or any(first_fast.get(c) for c in culprits):
            tx_slow.add(up)
    return Verdicts(frozenset(rx_slow), frozenset(tx_slow), median)


__all__ = ["MIN_RATES", "Verdicts", "judge", "stripe_median"]
