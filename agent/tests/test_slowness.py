"""Per-stripe slowness: who is slow, in which direction (pure rules over real topologies)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from relgate_agent.contracts import STRIPE_DONE
from relgate_agent.coordinator.slowness import (
    REFERENCE_HALF_LIFE_S,
    SENDS_WELL,
    held_reference,
    judge,
    stripe_median,
    total_rate_median,
    victims,
)
from relgate_agent.coordinator.topology import Topology, build_topology

FAST, SLOW = 12_000_000, 4_000_000  # B/s: 100 Mbit vs the 40 Mbit serving host's share
FLOOR = 1_000_000


def fleet(racks: int = 2, per_rack: int = 4) -> dict[str, str]:
    return {f"r{r}-h{i}": f"r{r}" for r in range(racks) for i in range(per_rack)}


def parents(topo: Topology) -> list[dict[str, str | None]]:
    return [c.parent for c in topo.stripes]


def behind(topo: Topology, s: int, host: str) -> set[str]:
    """Every host downstream of ``host`` in stripe ``s`` (children, grandchildren...)."""
    par = topo.stripes[s].parent
    out: set[str] = set()
    for h in topo.stripes[s].order:
        up = par[h]
        while up is not None:
            if up == host:
                out.add(h)
                break
            up = par[up]
    return out


def totals(rates: dict[str, list[int]]) -> dict[str, int]:
    """Each host's total receive rate, as its report carries it (whole stripes add 0)."""
    return {h: sum(max(r, 0) for r in rs) for h, rs in rates.items()}


def rates_with(topo: Topology, slow_edges: dict[int, set[str]]) -> dict[str, list[int]]:
    k = len(topo.stripes)
    return {
        h: [SLOW if h in slow_edges.get(s, set()) else FAST for s in range(k)] for h in topo.racks
    }


def crawl_from(order: list[str], first: int) -> dict[str, list[int]]:
    """One stripe's rates: FAST down the chain, SLOW from ``order[first]`` on."""
    return {h: [SLOW if i >= first else FAST] for i, h in enumerate(order)}


def test_a_slow_uploader_is_blamed_not_the_chain_behind_it() -> None:
    topo = build_topology(fleet(), 4)
    # the serving host: receives at speed, but everyone behind it gets its 40 Mbit
    up = next(h for h in sorted(topo.racks) if any(c.children(h) for c in topo.stripes))
    slow = {s: behind(topo, s, up) for s in range(4)}
    v = judge(rates_with(topo, slow), totals(rates_with(topo, slow)), parents(topo), 0.5, FLOOR)
    assert v.tx_slow == {up} and v.rx_slow == frozenset()
    assert v.median == FAST


def test_a_slow_receiver_is_blamed_itself_not_its_upstreams() -> None:
    topo = build_topology(fleet(), 4)
    host = sorted(topo.racks)[3]
    # slow in every stripe (its own NIC), and so is everyone behind it
    slow = {s: {host} | behind(topo, s, host) for s in range(4)}
    v = judge(rates_with(topo, slow), totals(rates_with(topo, slow)), parents(topo), 0.5, FLOOR)
    assert host in v.rx_slow
    assert v.tx_slow == frozenset()  # its upstreams fed it at speed; it passes on its pace


def test_whole_stripes_and_thin_stripes_are_not_judged() -> None:
    topo = build_topology(fleet(1, 3), 2)
    rates = {h: [STRIPE_DONE, FAST] for h in topo.racks}
    quiet = sorted(topo.racks)[0]
    rates[quiet] = [STRIPE_DONE, STRIPE_DONE]  # holds both stripes: never slow
    assert stripe_median(rates, FLOOR) == 0  # two receivers are too few to judge
    rates[quiet] = [STRIPE_DONE, FAST]
    assert stripe_median(rates, FLOOR) == FAST
    v = judge(rates, totals(rates), parents(topo), 0.5, FLOOR)
    assert v.rx_slow == frozenset() and v.tx_slow == frozenset()
    # fewer than three receivers: no median, nobody judged
    few = {h: [FAST, SLOW] for h in sorted(topo.racks)[:2]}
    assert judge(few, totals(few), parents(topo), 0.5, FLOOR).median == 0
    # a fleet this slow everywhere is under the floor: not judged either
    crawl = {h: [100, 100] for h in topo.racks}
    assert judge(crawl, totals(crawl), parents(topo), 0.5, FLOOR) == judge(
        {}, {}, parents(topo), 0.5, FLOOR
    )


def test_a_ready_upstream_that_serves_slowly_is_blamed() -> None:
    topo = build_topology(fleet(), 4)
    up = next(h for h in sorted(topo.racks) if all(c.children(h) for c in topo.stripes[:1]))
    rates = rates_with(topo, {s: behind(topo, s, up) for s in range(4)})
    del rates[up]  # READY: it no longer receives, it only serves
    assert up in judge(rates, totals(rates), parents(topo), 0.5, FLOOR).tx_slow


@settings(max_examples=80, deadline=None)
@given(racks=st.integers(1, 4), per_rack=st.integers(2, 6), k=st.integers(1, 6), data=st.data())
def test_a_fleet_at_one_speed_has_nobody_slow(racks: int, per_rack: int, k: int, data) -> None:
    topo = build_topology(fleet(racks, per_rack), k)
    rate = data.draw(st.integers(FLOOR, 10**10))
    same = {h: [rate] * k for h in topo.racks}
    v = judge(same, totals(same), parents(topo), 0.5, FLOOR)
    assert v.rx_slow == frozenset() and v.tx_slow == frozenset()


def test_an_rx_capped_host_fast_in_one_stripe_is_still_rx_slow() -> None:
    topo = build_topology(fleet(), 4)
    host = sorted(topo.racks)[5]
    # max-min sharing gave its cap to one stripe; the other three crawl (and so does
    # everyone behind it there)
    slow = {s: {host} | behind(topo, s, host) for s in (1, 2, 3)}
    rates = rates_with(topo, slow)
    rates[host] = [FAST // 2, 300_000, 300_000, 300_000]
    v = judge(rates, totals(rates), parents(topo), 0.5, FLOOR)
    assert v.rx_slow == {host}  # its total is the test, and it is itself a first slow hop
    assert v.tx_slow == frozenset()  # the upstreams that fed it are not to blame


def test_a_tie_blames_the_upstream_until_the_child_has_a_second_witness() -> None:
    """One upstream, one child that receives nowhere else (a host feeds its successor in
    every rotated rack chain): no rate breaks the tie; the upstream is blamed (a leaf loses
    nothing of its own speed) and the child, its victim, is not."""
    topo = build_topology(fleet(1, 5), 1)
    order = topo.stripes[0].order  # one chain, root first
    up, child = order[1], order[2]
    rates = crawl_from(order, 2)  # the child and everyone behind it crawl
    ref = (FAST, FAST)  # the medians of a round when most hosts still received
    v = judge(rates, totals(rates), parents(topo), 0.5, FLOOR, reference=ref)
    assert v.tx_slow == v.tied == {up} and v.rx_slow == frozenset()
    assert v.slow_with == {child: frozenset({up})}  # only the hop it fell behind is evidence
    # the upstream became a leaf; the child stayed slow behind its next upstream: its rx
    v2 = judge(
        rates,
        totals(rates),
        parents(topo),
        0.5,
        FLOOR,
        history={child: {"h-before"}},
        reference=ref,
    )
    assert v2.rx_slow == {child} and v2.tx_slow == frozenset()
    assert v2.slow_with[child] == {up, "h-before"}


def test_a_tx_capped_host_is_blamed_and_its_victims_never_are() -> None:
    """The issue's lab: one host's upload capped. Its children fall behind it where it
    feeds them and receive at speed from everyone else; against the held reference (the
    victims drag this round's medians down) it alone is tx-slow."""
    topo = build_topology(fleet(2, 3), 4)
    up = max(topo.racks, key=lambda h: sum(len(c.children(h)) for c in topo.stripes))
    rates = rates_with(topo, {s: behind(topo, s, up) for s in range(4)})
    for ref in (None, (FAST, 4 * FAST)):
        v = judge(rates, totals(rates), parents(topo), 0.5, FLOOR, reference=ref)
        assert v.tx_slow == {up} and v.rx_slow == v.tied == frozenset()
    # the same victims, with history naming the slow host twice over: still not blamed
    kids = {k for c in topo.stripes for k in c.children(up)}
    v = judge(rates, totals(rates), parents(topo), 0.5, FLOOR, {k: {up, up} for k in kids})
    assert v.rx_slow == frozenset()


def test_a_pipeline_at_its_roots_pace_is_not_slow() -> None:
    """The origin budget sets each root's rate; everyone behind it follows at that pace
    (a pipeline filling, a budget cut): nobody falls behind an upstream, nobody is slow,
    even against a reference held from a faster moment."""
    topo = build_topology(fleet(2, 4), 4)
    budget = [FAST, FAST // 10, FAST // 3, FAST]
    rates = {h: list(budget) for h in topo.racks}
    for ref in (None, (FAST, 4 * FAST)):
        v = judge(rates, totals(rates), parents(topo), 0.5, FLOOR, reference=ref)
        assert v.tx_slow == frozenset() and v.rx_slow == frozenset()


@settings(max_examples=120, deadline=None)
@given(racks=st.integers(1, 4), per_rack=st.integers(2, 6), k=st.integers(1, 6), data=st.data())
def test_hosts_at_their_upstreams_pace_are_never_judged(
    racks: int, per_rack: int, k: int, data
) -> None:
    """Fault-free: any origin shares per stripe, and every hop at 60-100 % of its
    upstream's rate (a pipeline filling, a noisy 1 s rate): 0 verdicts, any reference."""
    topo = build_topology(fleet(racks, per_rack), k)
    rates: dict[str, list[int]] = {h: [0] * k for h in topo.racks}
    for s, chain in enumerate(topo.stripes):
        for h in chain.order:  # upstreams first
            up = chain.parent[h]
            top = data.draw(st.integers(FLOOR, 10**9)) if up is None else rates[up][s]
            rates[h][s] = int(top * data.draw(st.floats(0.6, 1.0)))
    ref = data.draw(st.none() | st.tuples(st.integers(1, 10**9), st.integers(1, 10**10)))
    v = judge(rates, totals(rates), parents(topo), 0.5, FLOOR, reference=ref)
    assert v.rx_slow == frozenset() and v.tx_slow == frozenset()


def test_the_floor_is_per_host_so_eight_thin_stripes_are_still_judged() -> None:
    """8 stripes on 50 Mbit NICs: every stripe moves ~780 KB/s, under the 1 MB/s per-host
    floor; a floor applied per stripe would judge nobody, and a host at 30 % of its NIC
    (behind which the whole chain crawls) would never be caught."""
    topo = build_topology(fleet(4, 4), 8)
    per_stripe = 50_000_000 // 8 // 8
    host = sorted(topo.racks)[5]
    rates = {h: [per_stripe] * 8 for h in topo.racks}
    for s in range(8):
        for h in {host} | behind(topo, s, host):
            rates[h][s] = int(0.3 * per_stripe)
    v = judge(rates, totals(rates), parents(topo), 0.5, FLOOR)
    assert v.median == per_stripe and host in v.rx_slow
    # a fleet whose hosts all move under the per-host floor is still not judged
    crawl = {h: [FLOOR // 8 - 1] * 8 for h in topo.racks}
    assert judge(crawl, totals(crawl), parents(topo), 0.5, FLOOR).median == 0


def test_the_reference_holds_the_peak_while_victims_drag_the_medians_down() -> None:
    peak = (1_000_000, 8_000_000)
    assert held_reference(None, (0, 0), 1.0) is None  # nothing to judge against yet
    assert held_reference(None, peak, 0.0) == peak
    # a slow host's victims pull this round's medians to a tenth: the peak holds
    assert held_reference(peak, (100_000, 800_000), 0.0) == peak
    # ... decaying by half every half-life, so a fleet that slowed as a whole is its own
    # reference again within a minute or two
    assert held_reference(peak, (100_000, 800_000), REFERENCE_HALF_LIFE_S) == (500_000, 4_000_000)
    # nothing measured (too few receivers, or all of them victims): the peak holds as it
    # was, however long (only a measured fleet lowers it)
    assert held_reference(peak, (0, 0), 2 * REFERENCE_HALF_LIFE_S) == peak
    assert held_reference(peak, (0, 800_000), REFERENCE_HALF_LIFE_S) == peak  # half is none
    assert held_reference(peak, (2_000_000, 9_000_000), 1.0) == (2_000_000, 9_000_000)


rates_st = st.tuples(st.integers(1, 10**9), st.integers(1, 10**9))


@settings(max_examples=200, deadline=None)
@given(rates_st, rates_st, st.floats(0, 1e4))
def test_the_held_reference_is_between_now_and_the_peak(
    previous: tuple[int, int], current: tuple[int, int], elapsed: float
) -> None:
    got = held_reference(previous, current, elapsed)
    assert got is not None
    for i in range(2):
        assert current[i] <= got[i] <= max(previous[i], current[i])


def test_an_upload_that_sends_under_half_its_hops_is_tx_slow_by_its_own_rates() -> None:
    """A tbf-capped upload is not shared fairly: one of its children still receives well
    (so it "sends well"), the other crawls and, fed by it alone, looks rx-slow. Its own
    report (it sends under half what its hops carry) names it; the crawling child is its
    victim. The same child slow behind a second upstream is its own problem again."""
    topo = build_topology(fleet(1, 5), 2)
    a, b = topo.stripes[0].order[1], topo.stripes[0].order[2]  # a feeds b in stripe 0
    # b crawls in both stripes, and everyone behind it where it is behind
    rates = rates_with(topo, {s: {b} | behind(topo, s, b) for s in range(2)})
    ref = (FAST, 2 * FAST)
    sent = {h: 2 * FAST for h in topo.racks}
    plain = judge(rates, totals(rates), parents(topo), 0.5, FLOOR, reference=ref, tx=sent)
    sent[a] = FAST // 2  # what it reports sending: under half its hops' FAST each
    v = judge(rates, totals(rates), parents(topo), 0.5, FLOOR, reference=ref, tx=sent)
    assert a in v.tx_slow and a in v.saturated and b not in v.rx_slow
    assert v.saturated <= v.tx_slow and not plain.saturated
    # b was slow behind another upstream before: its own rx follows it, a is not blamed
    v2 = judge(rates, totals(rates), parents(topo), 0.5, FLOOR, {b: {"h-before"}}, ref, tx=sent)
    assert a not in v2.saturated and b in v2.rx_slow


def _uplinks(topo: Topology, host: str) -> set[str]:
    return {u for c in topo.stripes if (u := c.parent.get(host)) is not None}


def test_a_child_behind_several_upstreams_is_no_evidence_against_any_of_them() -> None:
    """The chaos lab's 30 %-NIC host: behind each upstream it is hung from, in the same
    round or lately (history). It is the common factor of its hops: rx-slow itself, and
    none of its upstreams is blamed for it, on a tie, on evidence or on its own rates."""
    topo = build_topology(fleet(2, 4), 4)
    host = next(h for h in sorted(topo.racks) if len(_uplinks(topo, h)) >= 2)
    rates = rates_with(topo, {s: {host} | behind(topo, s, host) for s in range(4)})
    ref = (FAST, 4 * FAST)
    sent = {h: 4 * FAST for h in topo.racks}
    v = judge(rates, totals(rates), parents(topo), 0.5, FLOOR, reference=ref, tx=sent)
    assert v.rx_slow == {host} and v.tx_slow == frozenset()
    assert v.slow_with[host] == _uplinks(topo, host) and v.behind == {}
    # one upstream now, a second one lately: the same (history is the second witness)
    (first, *_) = sorted(_uplinks(topo, host))
    one = {
        h: [
            FAST if h == host and c.parent.get(h) != first else r
            for c, r in zip(topo.stripes, rs, strict=True)
        ]
        for h, rs in rates.items()
    }
    v = judge(one, totals(one), parents(topo), 0.5, FLOOR, {host: {"h-before"}}, ref, sent)
    assert v.tx_slow == frozenset() and host not in v.behind.get(first, ())


def test_a_child_behind_a_guilty_upstream_and_one_more_is_a_tie_with_that_one() -> None:
    """Behind a tx-slow host (blamed on others' evidence too) and one more upstream: the
    guilty one explains its part, the other hop is a plain tie (behind two, the child was
    never judged at all in the simulator's chaos fleet, and everyone waited on it)."""
    topo = build_topology(fleet(1, 5), 1)
    order = topo.stripes[0].order
    guilty, child = order[1], order[2]
    rates = crawl_from(order, 2)
    ref = (FAST, FAST)
    v = judge(rates, totals(rates), parents(topo), 0.5, FLOOR, {child: {"h-x"}}, ref)
    assert v.rx_slow == {child}  # two witnesses, neither guilty by others' evidence
    # h-x was found guilty on others' evidence this round: the child is a tie with `guilty`
    two = [{**parents(topo)[0]}, {order[0]: None, "h-x": order[0], "k": "h-x"}]
    rates2 = {h: [*r, FAST] for h, r in rates.items()} | {
        "h-x": [STRIPE_DONE, FAST],
        "k": [STRIPE_DONE, SLOW],
    }
    sent = {"h-x": FAST // 10}  # its own report: it sends a tenth of its hops' due
    v = judge(rates2, totals(rates2), two, 0.5, FLOOR, {child: {"h-x"}}, ref, sent)
    assert "h-x" in v.saturated and guilty in v.tied and child not in v.rx_slow


def test_hops_from_an_unjudged_upstream_are_no_evidence() -> None:
    """A silent upstream (dead, frozen, not yet heard by a new leader) or a demoted leaf
    starves its children: that is the dead-host sweep's to judge. Its children are not
    slow with it, and it is not tx-slow."""
    topo = build_topology(fleet(), 4)
    up = next(h for h in sorted(topo.racks) if any(c.children(h) for c in topo.stripes))
    rates = rates_with(topo, {s: behind(topo, s, up) for s in range(4)})
    v = judge(rates, totals(rates), parents(topo), 0.5, FLOOR, unjudged={up})
    assert v.tx_slow == v.rx_slow == frozenset()
    assert not any(up in w for w in v.slow_with.values())


def test_an_upstream_whose_own_report_says_it_sends_at_the_fleets_pace_is_not_blamed() -> None:
    """A READY host fed two children in every stripe after a splice: each flow under half
    the per-stripe median, and no other upstream feeds them (a tie). Its own report says
    its upload runs at the fleet's pace: not tx-slow. At 30 % of that, it is."""
    topo = build_topology(fleet(1, 5), 1)
    order = topo.stripes[0].order
    up = order[1]
    rates = crawl_from(order, 2)
    ref = (FAST, FAST)
    v = judge(rates, totals(rates), parents(topo), 0.5, FLOOR, reference=ref, tx={up: FAST})
    assert v.tx_slow == frozenset()
    exactly = {up: int(SENDS_WELL * FAST)}  # at the bound: it sends well
    assert (
        judge(rates, totals(rates), parents(topo), 0.5, FLOOR, reference=ref, tx=exactly).tx_slow
        == frozenset()
    )
    v = judge(rates, totals(rates), parents(topo), 0.5, FLOOR, reference=ref, tx={up: FAST // 4})
    assert up in v.tx_slow


def test_victims_are_every_host_behind_a_slow_one_in_each_stripe() -> None:
    par = {"a": None, "b": "a", "c": "b", "d": "c", "e": "a"}
    assert victims([par], {"b"}) == [{"c", "d"}]
    assert victims([par], {"a"}) == [{"b", "c", "d", "e"}]
    assert victims([par, par], set()) == [set(), set()]
    assert victims([par], {"d"}) == [set()]
    assert victims([{"x": "y", "y": "x"}], {"z"}) == [set()]  # a cycle ends, never loops
    # children listed before their parents: the walk up the chain answers for the path
    rev = {"d": "c", "c": "b", "b": "a", "a": None}
    assert victims([rev], {"a"}) == [{"b", "c", "d"}]
    assert victims([rev], {"b"}) == [{"c", "d"}]


def test_one_slow_host_early_in_every_chain_is_judged_against_the_fleets_total() -> None:
    """Most (host, stripe) pairs behind one slow host: their pace is the per-stripe median,
    and against it the culprit looked fine. A stripe carries 1/k of a host's total: the
    total's median sets the per-stripe reference's floor."""
    par = [
        {"a": None, "x": "a", "b": "x", "c": "x", "d": "x"},
        {"b": None, "c": "b", "d": "b", "a": "b", "x": "b"},
    ]
    slow = FAST // 4
    # x crawls in both stripes (its NIC); b, c, d sit behind it in stripe 0
    rates = {
        "a": [FAST, FAST],
        "x": [slow, slow],
        "b": [slow, STRIPE_DONE],
        "c": [slow, FAST],
        "d": [slow, FAST],
    }
    tot = {h: sum(max(r, 0) for r in rs) for h, rs in rates.items()}
    assert stripe_median(rates, 0) == slow  # the victims' pace is the per-stripe median
    v = judge(rates, tot, par, 0.5, FLOOR)
    assert v.median == total_rate_median(rates, tot) // 2 > 2 * slow
    assert v.rx_slow == {"x"} and v.tx_slow == frozenset()


def test_two_victims_corroborate_a_tx_slow_upstream_however_well_a_third_receives() -> None:
    """A tbf-capped upload is not shared fairly: one child still receives well, two crawl
    behind it and behind nobody else. The two corroborate each other: the upstream is
    tx-slow and neither child is rx-slow "behind an upstream that sends well" (the chaos
    lab demoted four such victims of h06). Its own report at the fleet's pace clears it."""
    par = [
        {"u": None, "a": "u", "b": "u", "c": "u"},
        {"v": None, "a": "v", "b": "v", "c": "v", "u": "v"},
    ]
    slow = FAST // 8
    rates = {
        "u": [STRIPE_DONE, FAST],
        "a": [slow, slow],
        "b": [slow, slow],
        "c": [FAST, FAST],
        "v": [FAST, STRIPE_DONE],
    }
    rates["a"][1] = rates["b"][1] = FAST  # they receive well from v: their NICs work
    ref = (FAST, 2 * FAST)
    tot = {h: sum(max(r, 0) for r in rs) for h, rs in rates.items()}
    # it sends over half what its three hops should carry (not saturated), under the
    # fleet's pace: only the two victims together name it
    sent = {"u": FAST * 155 // 100}
    v = judge(rates, tot, par, 0.5, FLOOR, reference=ref, tx=sent)
    assert v.tx_slow == {"u"} and v.saturated == v.tied == frozenset()
    assert v.rx_slow == frozenset() and v.behind["u"] == {"a", "b"}
    v = judge(rates, tot, par, 0.5, FLOOR, reference=ref, tx={"u": 2 * FAST})
    assert v.tx_slow == v.rx_slow == frozenset()
    one = {**rates, "b": [FAST, FAST]}  # one victim alone: no corroboration, no verdict
    v = judge(one, tot, par, 0.5, FLOOR, reference=ref, tx=sent)
    assert v.tx_slow == frozenset()
    # three victims corroborate as surely as two: u feeds a, b and d, all crawling, whose
    # totals are low (so the evident rule does not apply) and its report is over half
    # its hops' due (4.5 x FAST: not saturated) and under 2.4 x FAST (not sending well)
    par3 = [
        {"u": None, "a": "u", "b": "u", "d": "u"},
        {"v": None, "a": "v", "b": "v", "d": "v", "u": "v"},
    ]
    three = {k: rates[k] for k in ("u", "v", "a", "b")} | {"d": [slow, FAST]}
    tot3 = {h: sum(max(r, 0) for r in rs) for h, rs in three.items()}
    ref3, sent3 = (FAST, 3 * FAST), {"u": FAST * 23 // 10}
    v = judge(three, tot3, par3, 0.5, FLOOR, reference=ref3, tx=sent3)
    assert v.tx_slow == {"u"} and v.saturated == frozenset() and v.behind["u"] == {"a", "b", "d"}


def test_a_child_fed_well_by_another_upstream_is_no_tie() -> None:
    """Behind one upstream in one stripe, fed well by another in the other, its total low
    against the reference: not a tie (another upstream feeds it), not evidence either (its
    total is low), not rx-slow (one witness). Nobody is judged on it."""
    par = [{"u": None, "v": None, "k": "u"}, {"u": None, "v": None, "k": "v"}]
    rates = {"u": [FAST, FAST], "v": [FAST, FAST], "k": [SLOW // 4, FAST]}
    tot = {h: sum(r) for h, r in rates.items()}
    v = judge(rates, tot, par, 0.5, FLOOR, reference=(FAST, 4 * FAST))
    assert v.tx_slow == v.rx_slow == frozenset() and v.slow_with == {"k": frozenset({"u"})}


def test_a_culprit_found_elsewhere_does_not_make_an_unrelated_child_common() -> None:
    """Two independent culprits: g, tx-slow by its own rates (its child a behind it), and
    u, a tie with its child b. g's guilt takes nothing from b's lone witness: both are
    blamed. Three witnesses make a child common as surely as two."""
    par = [{"g": None, "a": "g", "u": None, "b": "u", "w": None}]
    rates = {"g": [FAST], "a": [SLOW // 4], "u": [FAST], "b": [SLOW // 4], "w": [FAST]}
    ref = (FAST, FAST)
    v = judge(rates, totals(rates), par, 0.5, FLOOR, reference=ref, tx={"g": 1})
    assert v.tx_slow == {"g", "u"} and "g" in v.saturated and "u" in v.tied
    v = judge(rates, totals(rates), par, 0.5, FLOOR, {"b": {"x", "y"}}, ref, {"g": 1})
    assert v.rx_slow == {"b"} and v.tx_slow == {"g"}  # b behind u, x, y: its own fault


def test_two_children_behind_the_same_two_upstreams_are_no_evidence_either_way() -> None:
    """A CPU-bound lab's fault-free run: h01 and h13 each crawled "behind h09, h12" and were
    demoted rx-slow on two witnesses. Two children sharing the same two slow upstreams say
    nothing of which end is slow: nobody is judged. One child behind two upstreams whose
    lag shows on it alone is its own problem (rx-slow), as before."""
    par = [
        {"o": None, "p": "o", "q": "o", "x": "o", "a": "p", "b": "p"},
        {"x": None, "o": "x", "p": "x", "q": "x", "a": "q", "b": "q"},
    ]
    rates = {h: [FAST, FAST] for h in ("o", "p", "q", "x")} | {
        "a": [FAST // 4, FAST // 4],
        "b": [FAST // 4, FAST // 4],
    }
    rates["o"][0] = STRIPE_DONE
    rates["x"][1] = STRIPE_DONE
    tot = {h: sum(max(r, 0) for r in rs) for h, rs in rates.items()}
    ref = (FAST, 2 * FAST)
    sent = {"p": FAST // 2, "q": FAST // 2}  # what they pass on: their children's pace
    v = judge(rates, tot, par, 0.5, FLOOR, reference=ref, tx=sent)
    assert v.slow_with == {"a": {"p", "q"}, "b": {"p", "q"}}
    assert v.rx_slow == v.tx_slow == frozenset()
    # b receives at speed: a's lag shows on a alone, behind both of them
    rates["b"] = [FAST, FAST]
    tot["b"] = 2 * FAST
    v = judge(rates, tot, par, 0.5, FLOOR, reference=ref, tx=sent)
    assert v.rx_slow == {"a"} and v.tx_slow == frozenset()


def test_one_fast_flow_of_an_upload_under_half_the_fleets_pace_proves_nothing() -> None:
    """The chaos lab's 30 %-NIC h06 fed its rack-mates h10 and h14 in most stripes; one of
    its flows still counted as fast, and h10 was demoted rx-slow "behind h06 that sends
    well" while h06 was never judged. An upstream whose own report says it sends under
    half the fleet's pace is no proof that its lone victim's receive is the problem: two
    such victims corroborate the upstream's tx verdict instead."""
    par = [
        {"o": None, "x": "o", "y": "o", "u": "o", "a": "u", "b": "u", "c": "u"},
        {"x": None, "o": "x", "y": "x", "u": "x", "a": "u", "b": "u", "c": "x"},
    ]
    rates = {h: [FAST, FAST] for h in ("o", "x", "y", "u", "c")} | {
        "a": [FAST // 8, FAST // 8],
        "b": [FAST // 8, FAST // 8],
    }
    tot = {h: sum(rs) for h, rs in rates.items()}
    ref = (FAST, 2 * FAST)
    weak = {"u": 2 * FAST * 4 // 10}  # 0.4 x the fleet's total: under half its pace
    v = judge(rates, tot, par, 0.5, FLOOR, reference=ref, tx=weak)
    assert v.rx_slow == frozenset() and v.tx_slow == {"u"}
    assert v.behind == {"u": {"a", "b"}}
    # one victim alone: u sends under half what its hops should carry (its own rates)
    rates["b"] = [FAST, FAST]
    tot["b"] = 2 * FAST
    v = judge(rates, tot, par, 0.5, FLOOR, reference=ref, tx=weak)
    assert v.rx_slow == frozenset() and v.tx_slow == v.saturated == {"u"}
    # its upload works (over half the fleet's pace, over half its hops' due): the lone
    # victim is rx-slow, as before
    v = judge(rates, tot, par, 0.5, FLOOR, reference=ref, tx={"u": 3 * FAST})
    assert v.rx_slow == {"a"} and v.tx_slow == frozenset()


def test_a_lone_witness_must_send_at_half_the_fleets_pace_to_prove_rx() -> None:
    """u feeds a and c in one stripe of four and sends over half what those hops carry (not
    saturated), with c fast behind it: a, behind u alone, is rx-slow only when u's own
    report says it sends at ``fraction`` x the fleet's total pace or more (at the bound
    exactly: it does)."""
    done = STRIPE_DONE
    par = [
        {"o": None, "x": "o", "y": "o", "u": "o", "a": "u", "c": "u"},
        *[{"x": None, "o": "x", "y": "x", "u": "x", "a": "x", "c": "x"}] * 3,
    ]
    rates = {h: [FAST] * 4 for h in ("o", "x", "y", "u")} | {
        "c": [FAST, done, done, done],
        "a": [FAST // 8, done, done, done],
    }
    tot = {h: sum(max(r, 0) for r in rs) for h, rs in rates.items()}
    ref = (FAST, 4 * FAST)
    for sent, rx in ((FAST + FAST // 8, frozenset()), (2 * FAST, {"a"}), (2 * FAST - 1, set())):
        v = judge(rates, tot, par, 0.5, FLOOR, reference=ref, tx={"u": sent})
        assert v.rx_slow == rx and v.tx_slow == frozenset(), sent


def test_a_host_reporting_fewer_stripe_rates_is_judged_on_those_only() -> None:
    """A report's stripe rates are bounded to k, not padded: a host that sent rates for
    its first stripes only (an older agent, a job it joined with fewer stripes) is judged
    there and unjudged beyond, never an index past its list."""
    topo = build_topology(fleet(), 4)
    up = next(h for h in sorted(topo.racks) if any(c.children(h) for c in topo.stripes))
    rates = rates_with(topo, {s: behind(topo, s, up) for s in range(4)})
    short = {h: r[:1] for h, r in rates.items()}  # stripe 0's rate only, for everyone
    v = judge(short, totals(rates), parents(topo), 0.5, FLOOR)
    kids0 = set(topo.stripes[0].children(up))
    assert kids0 and set(v.slow_with) <= kids0 | {up}
    assert all(w <= {up} for w in v.slow_with.values())
