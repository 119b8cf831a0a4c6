"""Slowness: who is slow, per stripe, in which direction (pure functions, no I/O).

Each report carries the host's receive rate per stripe (``STRIPE_DONE`` for a stripe it
holds whole: nothing left to receive, so no rate to judge). A host is *slow in a stripe*
when it receives that stripe under ``fraction`` x the median per-stripe rate of the job
(every stripe carries about 1/k of a host's traffic, so one reference serves them all; a
stripe's own median would hide a slow stripe root, with everyone behind it as slow).

A chain passes slowness on: everyone behind a slow hop is slow too. So blame goes to the
first slow hop: an edge whose upstream receives the stripe at speed (or holds it whole, or
is READY) and whose child does not. Such an edge is either the upstream's upload or the
child's download. A first slow hop whose total receive rate is low, slow with two upstreams
(now or in an earlier topology) or with one that feeds others at speed, is **rx-slow** (its
own NIC or disk); a host whose every first-hop child is slow, those children not rx-slow,
is **tx-slow**: its upload holds the chain (the seed's serving host, a 40 Mbit uploader).
A lone upstream with a lone child is a tie, and a tie blames the upstream: once it is a
leaf, a child that stays slow has its second witness. Both become leaves at their rack
tails; nobody waits behind them.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass

from relgate_agent.contracts import STRIPE_DONE

MIN_RATES = 3  # receiving hosts a stripe needs before "slow vs the median" means anything
WITNESSES = 2  # distinct peers a host must be slow with before it alone is blamed
REFERENCE_HALF_LIFE_S = 30.0  # a held peak rate loses half its weight in this long


@dataclass(frozen=True)
class Verdicts:
    rx_slow: frozenset[str]
    tx_slow: frozenset[str]
    median: int  # the per-stripe receive rate slowness is judged against (0: not judged)
    # child -> the upstreams it was a first slow hop with, this round and before (the
    # caller keeps it while the child stays slow: evidence across topology versions)
    slow_with: Mapping[str, frozenset[str]]


def stripe_median(rates: Mapping[str, Sequence[int]], floor: int) -> int:
    """The median per-stripe receive rate over every (receiving host, stripe) pair; 0 when
    fewer than ``MIN_RATES`` hosts receive or the fleet is under ``floor``."""
    rs = sorted(r for rr in rates.values() for r in rr if r > 0)
    if sum(1 for rr in rates.values() if any(r > 0 for r in rr)) < MIN_RATES:
        return 0
    median = rs[len(rs) // 2]
    return median if median >= floor else 0


def stripe_floor(floor: int, parents: Sequence[object]) -> int:
    """The per-stripe share of the per-host ``floor``: a stripe carries 1/k of a host's
    traffic, so comparing a stripe's rate with the whole floor would stop judging at k x
    the rate meant (8 stripes on 50 Mbit NICs: every stripe under 1 MB/s, nobody judged)."""
    return floor // max(1, len(parents))


def held_reference(
    previous: tuple[int, int] | None,
    current: tuple[int, int],
    elapsed_s: float,
    half_life_s: float = REFERENCE_HALF_LIFE_S,
) -> tuple[int, int] | None:
    """The (per-stripe, total) rates slowness is judged against: this round's medians, or
    the peak held so far decayed by half every ``half_life_s``, whichever is higher (a slow
    host's victims pull the medians down with it, and against them the culprit looks fast;
    the decay lets a fleet that slowed down as a whole set a new reference within a minute).
    A zero in ``current`` (too few receivers, under the floor) holds the decayed peak."""
    decay = 0.5 ** (max(elapsed_s, 0.0) / half_life_s)
    held = (0, 0) if previous is None else (int(previous[0] * decay), int(previous[1] * decay))
    if not (current[0] and current[1]):
        return previous if previous is None else held
    return (max(held[0], current[0]), max(held[1], current[1]))


def total_rate_median(rates: Mapping[str, Sequence[int]], totals: Mapping[str, int]) -> int:
    live = sorted(t for h, t in totals.items() if t > 0 and h in rates)
    return live[len(live) // 2] if len(live) >= MIN_RATES else 0


def judge(
    rates: Mapping[str, Sequence[int]],
    totals: Mapping[str, int],
    parents: Sequence[Mapping[str, str | None]],
    fraction: float,
    floor: int,
    history: Mapping[str, Collection[str]] | None = None,
    reference: tuple[int, int] | None = None,
) -> Verdicts:
    """``rates``: host -> receive rate per stripe (``STRIPE_DONE`` for a whole stripe);
    ``totals``: host -> total receive rate; ``parents``: per stripe, host -> upstream (None:
    the stripe root, fed by the origin); ``history``: ``slow_with`` of the last round;
    ``reference``: (per-stripe, total) rates to judge against instead of this round's
    medians (late in a job the hosts still receiving are mostly the slow ones and their
    victims: their median is no reference); ``floor``: the per-host receive rate under
    which nothing is judged (a stripe's is ``floor`` / k: see :func:`stripe_floor`)."""
    history = history or {}
    median = reference[0] if reference else stripe_median(rates, stripe_floor(floor, parents))

    def slow(host: str, s: int) -> bool | None:
        r = rates.get(host)
        if r is None or len(r) <= s or r[s] == STRIPE_DONE or not median:
            return None  # not judged: no rate, a whole stripe, or nothing to compare with
        return r[s] < fraction * median

    # first slow hops only: an edge whose upstream receives the stripe at speed (or holds
    # it whole, or is READY); behind a slow hop everyone is slow and proves nothing
    first_slow: dict[str, set[str]] = {}  # child -> upstreams it is slow with
    kids_fast: dict[str, set[str]] = {}
    kids_slow: dict[str, set[str]] = {}
    for s, parent in enumerate(parents):
        for child, up in parent.items():
            v = slow(child, s)
            if up is None or v is None or slow(up, s):
                continue
            if v:
                first_slow.setdefault(child, set()).add(up)
            (kids_slow if v else kids_fast).setdefault(up, set()).add(child)
    # rx: the host's whole receive rate is low (max-min sharing can leave an rx-capped host
    # fast in a few stripes, so its total is the test), it is itself a first slow hop (the
    # hosts behind it are slow only where their upstream is: victims, not culprits), and
    # the evidence points at it: it was slow with two upstreams (now or before), or its
    # upstream feeds someone else at speed. A single upstream and a single child is a tie,
    # and a tie blames the upstream: once that one is a leaf, a child that stays slow has a
    # second witness, while blaming the child first would walk the slowness down the rack.
    total_median = reference[1] if reference else total_rate_median(rates, totals)
    slow_with = {h: frozenset(ups | set(history.get(h, ()))) for h, ups in first_slow.items()}
    rx_slow = {
        h
        for h, ups in first_slow.items()
        if total_median >= floor
        and 0 <= totals.get(h, 0) < fraction * total_median
        and (len(slow_with[h]) >= WITNESSES or any(kids_fast.get(u) for u in ups))
    }
    # tx: every child it feeds at a first hop is slow, and those are not rx-slow themselves
    tx_slow = {
        up
        for up, kids in kids_slow.items()
        if up not in rx_slow and not kids_fast.get(up) and kids - rx_slow
    }
    return Verdicts(frozenset(rx_slow), frozenset(tx_slow), median, slow_with)


__all__ = [
    "MIN_RATES",
    "REFERENCE_HALF_LIFE_S",
    "Verdicts",
    "held_reference",
    "judge",
    "stripe_floor",
    "stripe_median",
    "total_rate_median",
]
