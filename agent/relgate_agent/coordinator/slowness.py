"""Slowness: who is slow, per stripe, in which direction (pure functions, no I/O).

Each report carries the host's receive rate per stripe (``STRIPE_DONE`` for a stripe it
holds whole: nothing left to receive, so no rate to judge). A host is *slow in a stripe*
when it receives that stripe under ``fraction`` x the median per-stripe rate of the job
(every stripe carries about 1/k of a host's traffic, so one reference serves them all; a
stripe's own median would hide a slow stripe root, with everyone behind it as slow).

A chain passes slowness on: everyone behind a slow hop receives at its pace. So a hop is
judged against what its upstream can pass on: a child is *behind* its upstream in a stripe
when it receives under ``fraction`` x the upstream's own rate there (or x the median when
the upstream holds the stripe whole). A child at its upstream's pace is filling a
pipeline, or held by the origin budget further up: neither is slowness. Origin-fed stripes
(a root's) run at the budget's rate and never count against anyone.

Blame needs evidence from both ends of a hop. An upstream is **tx-slow** when every child
it feeds falls behind it and at least one of those children receives well (at speed,
from another upstream or the origin, with a total at speed): the child can receive, this
upstream does not send (the seed's serving host, a 40 Mbit uploader). Its victims are
never blamed for it. A host is **rx-slow** when its total receive rate is low (max-min
sharing can leave an rx-capped host fast in a few stripes) and it falls behind upstreams
that are not tx-slow, one of which sends well on some hop, or two of them (now or in an
earlier topology: ``slow_with``). A child fed by one upstream alone, behind it in every
stripe it receives (the common case in rotated rack chains: a host feeds its successor), is
a tie no rate can break; a tie blames the upstream, whose demotion costs it nothing of its
own speed: if the child stays slow behind its next upstream, that second witness makes it
rx-slow. An upstream is also tx-slow by **its own rates** (``saturated``): it reports
sending under ``slow_fraction`` x what its judged hops should carry, and a child falls
behind it. A tbf-capped upload is not shared fairly among its flows: one child may still
receive well while another crawls, and that one would look rx-slow behind an upstream that
"sends well" (the issue's lab: 1.5 MiB/s NICs, one upload at 0.5 MiB/s; its victim h05 was
demoted, the healthy hosts finished at 36-56 s vs 15-19 s).
Both verdicts become leaves at their rack tails; nobody waits behind them.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterator, Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np

from relgate_agent.contracts import STRIPE_DONE

MIN_RATES = 3  # receiving hosts a stripe needs before "slow vs the median" means anything
WITNESSES = 2  # distinct peers a host must be slow with before it alone is blamed
# an upload at this fraction of the fleet's median receive rate or more works: a healthy
# one runs at its NIC, about that median; a 30 % one stays under it even against a
# reference its victims dragged to half (the chaos lab: 3.75 MB/s against 5.6 MB/s)
SENDS_WELL = 0.8
ORIGIN_FED = ""  # the origin, as an upstream a host receives well from
REFERENCE_HALF_LIFE_S = 30.0  # a held peak rate loses half its weight in this long


@dataclass(frozen=True)
class Verdicts:
    rx_slow: frozenset[str]
    tx_slow: frozenset[str]
    median: int  # the per-stripe receive rate slowness is judged against (0: not judged)
    # child -> the upstreams it was a first slow hop with, this round and before (the
    # caller keeps it while the child stays slow: evidence across topology versions)
    slow_with: Mapping[str, frozenset[str]]
    # upstream -> the children that fall behind it this round (a tx verdict's evidence)
    behind: Mapping[str, frozenset[str]] = field(default_factory=dict)
    tied: frozenset[str] = frozenset()  # tx-slow on a tie only (see the module's doc)
    # tx-slow by its own rates: it sends under fraction x what its hops should carry
    saturated: frozenset[str] = frozenset()


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
    A zero in ``current`` (too few receivers, under the floor: nothing measured) holds the
    peak as it was: only a measured fleet lowers it (decayed while the hosts still
    receiving were all victims, the chaos lab's 30 %-NIC host came under half the
    reference's rate and was never demoted)."""
    if not (current[0] and current[1]):
        return previous
    decay = 0.5 ** (max(elapsed_s, 0.0) / half_life_s)
    held = (0, 0) if previous is None else (int(previous[0] * decay), int(previous[1] * decay))
    return (max(held[0], current[0]), max(held[1], current[1]))


def victims(parents: Sequence[Mapping[str, str | None]], slow: Collection[str]) -> list[set[str]]:
    """Per stripe, every host downstream of a ``slow`` one: it receives at that host's pace,
    and its rate measures the culprit, not the fleet (it must not lower the reference).
    Linear in the chain: each host's answer is its upstream's, remembered on the way up."""
    out: list[set[str]] = []
    for parent in parents:
        held: dict[str, bool] = {}
        for h in parent:
            path, up = [h], parent.get(h)
            while up is not None and up not in slow and up not in held and up not in path:
                path.append(up)
                up = parent.get(up)
            answer = up is not None and (up in slow or held.get(up, False))
            for p in reversed(path):
                held[p] = answer
                answer = answer or p in slow
        out.append({h for h, v in held.items() if v})
    return out


def total_rate_median(rates: Mapping[str, Sequence[int]], totals: Mapping[str, int]) -> int:
    live = sorted(t for h, t in totals.items() if t > 0 and h in rates)
    return live[len(live) // 2] if len(live) >= MIN_RATES else 0


class Grouped(Mapping[str, set[str]]):
    """key -> the set of values paired with it, over (key, value) pairs held as index
    arrays and grouped only for the keys asked for: a judgment at 4,096 hosts has ~32,000
    hops that are fed well, and asks about the few around a slow one. A key with no pair
    is absent (as a dict of sets filled by ``setdefault(...).add``)."""

    def __init__(
        self,
        names: Sequence[str],
        keys: np.ndarray,
        values: np.ndarray,
        extra: Mapping[str, str] | None = None,
    ) -> None:
        order = np.argsort(keys, kind="stable")
        self._names, self._keys, self._values = names, keys[order], values[order]
        self._index = {n: i for i, n in enumerate(names)}
        self._extra = extra or {}  # key -> one more value (ORIGIN_FED for a root fed well)

    def __getitem__(self, key: str) -> set[str]:
        out = set()
        i = self._index.get(key)
        if i is not None:
            lo, hi = np.searchsorted(self._keys, [i, i + 1])
            out = {self._names[v] for v in self._values[lo:hi].tolist()}
        if key in self._extra:
            out.add(self._extra[key])
        if not out:
            raise KeyError(key)
        return out

    def __iter__(self) -> Iterator[str]:
        keys = {self._names[k] for k in np.unique(self._keys).tolist()} | set(self._extra)
        return iter(sorted(keys))

    def __len__(self) -> int:
        return sum(1 for _ in self)


@dataclass
class _Hops:
    """The judged hops of a topology: child -> upstreams it falls behind (``slow_ups``),
    upstream -> children behind it (``slow_kids``) or fed well (``fast_kids``), child ->
    upstreams (``ORIGIN_FED`` too) it receives well from (``fed_well``)."""

    slow_ups: dict[str, set[str]] = field(default_factory=dict)
    slow_kids: dict[str, set[str]] = field(default_factory=dict)
    fast_kids: Mapping[str, set[str]] = field(default_factory=dict)
    fed_well: Mapping[str, set[str]] = field(default_factory=dict)
    # upstream -> what its judged hops should carry (each at its bound: see bound)
    expected_tx: dict[str, int] = field(default_factory=dict)


def _hops(
    rates: Mapping[str, Sequence[int]],
    parents: Sequence[Mapping[str, str | None]],
    fraction: float,
    median: int,
    unjudged: Collection[str] = (),
) -> _Hops:
    """Every judged hop of the topology, sorted by what it shows. A hop from an
    ``unjudged`` upstream (silent, not yet heard by this leader, or already demoted on
    evidence) shows nothing: a child starved by it is neither slow nor a witness.

    Vectorised over the hops (32,768 a judgment at 4,096 hosts, 8 stripes). A child
    without a judged rate in the stripe (none sent, a short list, ``STRIPE_DONE``) shows
    nothing. A child of the origin (a root) at ``fraction`` x the median or more is fed
    well: the origin's rate is its budget's, evidence of health only. Otherwise the hop's
    bound is what the upstream can pass on in the stripe: its own rate there (a chain runs
    at its slowest hop: a child at its upstream's pace is filling a pipeline, not slow),
    capped at the median, or the median when it holds the stripe whole (READY, or done
    with it). A child under ``fraction`` x that bound falls behind it; one at or over it,
    and at ``fraction`` x the median, is fed well by it."""
    out = _Hops()
    if not median:
        return out  # nothing to compare with: no hop is judged
    stripes = len(parents)
    everyone = list(rates)  # rows: the hosts with rates first, then any other named
    row = {h: i for i, h in enumerate(everyone)}
    kids: list[int] = []
    ups: list[int] = []
    at: list[int] = []
    skip = frozenset(unjudged)
    for s, parent in enumerate(parents):
        for child, up in parent.items():
            if up is None:
                u = -1  # the origin
            elif up in skip:
                continue
            elif (u := row.setdefault(up, len(everyone))) == len(everyone):
                everyone.append(up)  # named, sends no rates
            if (k := row.setdefault(child, len(everyone))) == len(everyone):
                everyone.append(child)
            kids.append(k)
            ups.append(u)
            at.append(s)
    table = np.zeros((len(everyone), stripes), dtype=np.int64)
    judged = np.zeros((len(everyone), stripes), dtype=bool)
    for i, r in enumerate(rates.values()):
        if m := min(len(r), stripes):
            table[i, :m] = r[:m]
            judged[i, :m] = True
    judged &= table != STRIPE_DONE
    kid, upr, stripe = (np.asarray(a, dtype=np.int64) for a in (kids, ups, at))
    rooted = upr == -1
    up_row = np.where(rooted, 0, upr)
    rc, has_c = table[kid, stripe], judged[kid, stripe]
    well = rc >= fraction * median
    fed_by_origin = has_c & rooted & well
    hop = has_c & ~rooted
    ru, has_u = table[up_row, stripe], judged[up_row, stripe] & ~rooted
    expect = np.where(has_u, np.minimum(ru, median), median)
    slow = hop & (rc < fraction * expect)
    fast = hop & ~slow & well
    tx = np.zeros(len(everyone), dtype=np.int64)
    np.add.at(tx, upr[hop], expect[hop])
    out.expected_tx = {everyone[u]: int(tx[u]) for u in np.unique(upr[hop]).tolist()}
    for k, u in zip(kid[slow].tolist(), upr[slow].tolist(), strict=True):
        out.slow_ups.setdefault(everyone[k], set()).add(everyone[u])
        out.slow_kids.setdefault(everyone[u], set()).add(everyone[k])
    out.fast_kids = Grouped(everyone, upr[fast], kid[fast])
    roots = dict.fromkeys((everyone[k] for k in kid[fed_by_origin].tolist()), ORIGIN_FED)
    out.fed_well = Grouped(everyone, kid[fast], upr[fast], roots)
    return out


def _tx_slow(
    hops: _Hops,
    slow_with: Mapping[str, frozenset[str]],
    low_total: Callable[[str], bool],
    tx: Mapping[str, int],
    fraction: float,
    total_median: int,
    guilty: frozenset[str] = frozenset(),
) -> tuple[set[str], set[str], set[str]]:
    """The upstreams slow in transmit: (evident, tied, saturated)."""

    def sends_well(up: str) -> bool:
        """Its own report: it sends at least ``SENDS_WELL`` x the fleet's median receive
        rate (a healthy NIC's pace)."""
        return total_median > 0 and tx.get(up, -1) >= SENDS_WELL * total_median

    slow_kids, fast_kids, fed_well = hops.slow_kids, hops.fast_kids, hops.fed_well

    def tie(k: str, up: str) -> bool:
        """``up`` is the only upstream ``k`` ever fell behind (besides ones found guilty on
        others' evidence) and none feeds it well."""
        return slow_with[k] - guilty == {up} and not fed_well.get(k, set()) - {up}

    # evident: every child it feeds falls behind it, and one of them at least receives
    # well from another upstream with a total at speed: the evidence from both ends (the
    # child can receive; this upstream does not send). A child fed by it alone is a tie,
    # and a tie blames the upstream: a leaf loses nothing of its own speed, and a child
    # that stays slow behind its next upstream has its second witness. Its victims are
    # never blamed for it.
    # An upstream whose own report says it sends at the fleet's pace (``sends_well``) is
    # neither: its children share an upload that is working (a READY host fed two
    # children in four stripes after a splice: each flow under half the per-stripe median,
    # and the tie demoted a healthy host)
    evident = {
        up
        for up, kids in slow_kids.items()
        if not fast_kids.get(up)
        and not sends_well(up)
        and any(fed_well.get(k, set()) - {up} and not low_total(k) for k in kids)
    }
    tied = {
        up
        for up, kids in slow_kids.items()
        if up not in evident
        and not fast_kids.get(up)
        and not sends_well(up)
        and any(tie(k, up) for k in kids)
    }

    # saturated: its own report says it sends under ``fraction`` x what its hops should
    # carry, and a child falls behind it that was never slow behind anyone else: its
    # upload is the limit, whatever its other children show (a tbf-capped upload is not
    # shared fairly: one flow may still run well while another crawls, and that child would
    # look rx-slow behind an upload that "sends well"). A child slow behind this one and
    # another upstream, now or before, is that child's own problem following it (rx)
    def fresh(k: str, up: str) -> bool:
        return slow_with[k] == {up} or bool(fed_well.get(k, set()) - {up} and not low_total(k))

    saturated = {
        up
        for up, kids in slow_kids.items()
        if up in tx
        and tx[up] < fraction * hops.expected_tx.get(up, 0)
        and any(fresh(k, up) for k in kids)
    }
    # corroborated: two children or more fall behind it and behind no other upstream (a
    # child behind two is no evidence: see judge), however well a third one receives. A
    # tbf-capped upload is not shared fairly, so the evident rule's "every child" misses
    # it; alone, each of its victims looked rx-slow "behind h06 that sends well", and the
    # chaos lab demoted four of them while h06 fed everyone behind them at 30 %
    corroborated = {
        up for up, kids in slow_kids.items() if len(kids) >= WITNESSES and not sends_well(up)
    }
    return evident | corroborated, tied - corroborated, saturated


def _rx_slow(
    hops: _Hops,
    slow_with: Mapping[str, frozenset[str]],
    low_total: Callable[[str], bool],
    tx_slow: set[str],
    sends_some: Callable[[str], bool],
) -> set[str]:
    """The hosts slow in receive: their total is low (max-min sharing can leave an rx-capped
    host fast in a few stripes), and they fall behind upstreams that are not tx-slow, at
    least one of which sends well on some hop (to anyone, this host included: its upload
    can) and, by its own report, sends at half the fleet's pace or more (``sends_some``:
    one fast flow of a 30 %-NIC upload proved nothing, and the chaos lab demoted its
    rack-mate h10 "behind h06 that sends well" while h06 itself was never judged), or two
    of them (now or in an earlier topology) whose lag shows on this host alone. Two children behind the same two upstreams are no evidence either way (a
    CPU-bound lab's fault-free run demoted h01 and h13, each "behind h09, h12"): which
    end is slow, no rate tells."""
    rx_slow = set()
    for h, ups in hops.slow_ups.items():
        blamable = ups - tx_slow
        if not blamable or not low_total(h):
            continue  # a victim of a slow upstream, or receiving at speed overall
        sole = {u for u in slow_with[h] - tx_slow if hops.slow_kids.get(u, set()) <= {h}}
        proven = any(hops.fast_kids.get(u) and sends_some(u) for u in blamable)
        if len(sole) >= WITNESSES or proven:
            rx_slow.add(h)
    return rx_slow


def judge(  # noqa: PLR0913, PLR0917 - one parameter per kind of evidence, named at every call
    rates: Mapping[str, Sequence[int]],
    totals: Mapping[str, int],
    parents: Sequence[Mapping[str, str | None]],
    fraction: float,
    floor: int,
    history: Mapping[str, Collection[str]] | None = None,
    reference: tuple[int, int] | None = None,
    tx: Mapping[str, int] | None = None,
    unjudged: Collection[str] = (),
) -> Verdicts:
    """``rates``: host -> receive rate per stripe (``STRIPE_DONE`` for a whole stripe);
    ``totals``: host -> total receive rate; ``parents``: per stripe, host -> upstream (None:
    the stripe root, fed by the origin); ``history``: ``slow_with`` of the last round;
    ``reference``: (per-stripe, total) rates to judge against instead of this round's
    medians (late in a job the hosts still receiving are mostly the slow ones and their
    victims: their median is no reference); ``floor``: the per-host receive rate under
    which nothing is judged (a stripe's is ``floor`` / k: see :func:`stripe_floor`);
    ``tx``: host -> its own reported send rate (the accused's own rates: ``saturated``);
    ``unjudged``: upstreams whose hops are no evidence (see :func:`_hops`; the caller drops
    from ``history`` what no longer witnesses: see ``HandoffService._history``)."""
    history = history or {}
    tx = tx or {}
    median = reference[0] if reference else stripe_median(rates, stripe_floor(floor, parents))
    total_median = reference[1] if reference else total_rate_median(rates, totals)
    if median:
        # a stripe carries 1/k of a host's traffic: the fleet's total median says what that
        # is even when most (host, stripe) pairs sit behind one slow host early in every
        # chain (their pace then *is* the per-stripe median, and the culprit looked fine)
        median = max(median, total_median // max(1, len(parents)))

    hops = _hops(rates, parents, fraction, median, unjudged)

    def low_total(h: str) -> bool:
        return total_median >= floor and 0 <= totals.get(h, 0) < fraction * total_median

    slow_with = {h: frozenset(ups | set(history.get(h, ()))) for h, ups in hops.slow_ups.items()}
    # a child behind two upstreams or more (now, or lately while it stayed slow) is the
    # common factor of its hops: its lag is evidence against none of them. Counted against
    # each upstream alone, the chaos lab's 30 %-NIC host demoted every host it was hung
    # from next, and the fleet lost their uploads (8 of 13 hosts demoted, 6 of them healthy).
    # An upstream found tx-slow on the others' evidence explains its part: a child behind
    # it and one more is a tie with that one (behind two, it would never be judged at all)
    guilty: frozenset[str] = frozenset()
    for _ in range(2):
        common = {h for h, w in slow_with.items() if len(w - guilty) >= WITNESSES}
        evidence = _Hops(
            hops.slow_ups,
            {up: ks - common for up, ks in hops.slow_kids.items() if ks - common},
            hops.fast_kids,
            hops.fed_well,
            hops.expected_tx,
        )
        evident, tied, saturated = _tx_slow(
            evidence, slow_with, low_total, tx, fraction, total_median, guilty
        )
        guilty = frozenset(evident | saturated)

    def sends_some(up: str) -> bool:
        """No report of its own, or it sends at ``fraction`` x the fleet's pace or more."""
        return up not in tx or tx[up] >= fraction * total_median

    rx_slow = _rx_slow(hops, slow_with, low_total, evident | tied | saturated, sends_some)
    tx_slow = evident | tied | saturated
    behind = {up: frozenset(kids) for up, kids in evidence.slow_kids.items()}
    return Verdicts(
        frozenset(rx_slow),
        frozenset(tx_slow - rx_slow),
        median,
        slow_with,
        behind,
        frozenset(tied - rx_slow - saturated),
        frozenset(saturated - rx_slow),
    )


__all__ = [
    "MIN_RATES",
    "ORIGIN_FED",
    "REFERENCE_HALF_LIFE_S",
    "Verdicts",
    "held_reference",
    "judge",
    "stripe_floor",
    "stripe_median",
    "total_rate_median",
    "victims",
]
