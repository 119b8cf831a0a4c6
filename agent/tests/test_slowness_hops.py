"""The vectorised hop classifier (slowness._hops) gives exactly what the per-hop rule says.

``rule_hops`` below is the rule written one hop at a time (the form the judge used before
it was vectorised for 4,096 hosts); hypothesis draws topologies (chains, hosts without
rates, upstreams that send none, short rate lists, whole stripes, hostile negative rates,
unjudged upstreams) and the two must agree on every map, read whole.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from hypothesis import given, settings
from hypothesis import strategies as st

from relgate_agent.contracts import STRIPE_DONE
from relgate_agent.coordinator.slowness import ORIGIN_FED, Grouped, _Hops, _hops


def rule_hops(
    rates: Mapping[str, Sequence[int]],
    parents: Sequence[Mapping[str, str | None]],
    fraction: float,
    median: int,
    unjudged: Collection[str] = (),
) -> dict[str, dict[str, object]]:
    slow_ups: dict[str, set[str]] = {}
    slow_kids: dict[str, set[str]] = {}
    fast_kids: dict[str, set[str]] = {}
    fed_well: dict[str, set[str]] = {}
    expected_tx: dict[str, int] = {}
    if median:
        for s, parent in enumerate(parents):
            judged = {h: r[s] for h, r in rates.items() if len(r) > s and r[s] != STRIPE_DONE}
            for child, up in parent.items():
                rc = judged.get(child)
                if rc is None:
                    continue
                well = rc >= fraction * median
                if up is None:
                    if well:
                        fed_well.setdefault(child, set()).add(ORIGIN_FED)
                    continue
                if up in unjudged:
                    continue
                ru = judged.get(up)
                expect = median if ru is None else min(ru, median)
                expected_tx[up] = expected_tx.get(up, 0) + expect
                if rc < fraction * expect:
                    slow_ups.setdefault(child, set()).add(up)
                    slow_kids.setdefault(up, set()).add(child)
                elif well:
                    fast_kids.setdefault(up, set()).add(child)
                    fed_well.setdefault(child, set()).add(up)
    return {
        "slow_ups": slow_ups,
        "slow_kids": slow_kids,
        "fast_kids": fast_kids,
        "fed_well": fed_well,
        "expected_tx": expected_tx,
    }


def whole(m: Mapping[str, object]) -> dict[str, object]:
    return {k: m[k] for k in m}


def read_whole(h: _Hops) -> dict[str, object]:
    """Every map of ``h``, the grouped ones read key by key (as ``rule_hops`` returns)."""
    return {
        "slow_ups": h.slow_ups,
        "slow_kids": h.slow_kids,
        "fast_kids": whole(h.fast_kids),
        "fed_well": whole(h.fed_well),
        "expected_tx": h.expected_tx,
    }


RATE = st.one_of(
    st.integers(0, 2_000_000_000),
    st.just(STRIPE_DONE),
    st.integers(-(2**40), -2),  # hostile: a negative rate that is not STRIPE_DONE
)


@st.composite
def fleets(draw: st.DrawFn) -> tuple[dict[str, list[int]], list[dict[str, str | None]], set[str]]:
    n = draw(st.integers(1, 24))
    k = draw(st.integers(1, 5))
    hosts = [f"h{i:02d}" for i in range(n)]
    parents: list[dict[str, str | None]] = []
    for _ in range(k):
        order = draw(st.permutations(hosts))
        parent: dict[str, str | None] = {}
        for i, h in enumerate(order):
            # a chain, sometimes cut into several, sometimes hung from a host outside it
            if i == 0 or draw(st.integers(0, 9)) == 0:
                parent[h] = draw(st.sampled_from([None, None, "ghost"]))
            else:
                parent[h] = order[draw(st.integers(max(0, i - 3), i - 1))]
        parents.append(parent)
    rates = {
        h: draw(st.lists(RATE, min_size=0, max_size=k + 1))
        for h in hosts
        if draw(st.integers(0, 7)) != 0  # some hosts sent no rates at all
    }
    unjudged = set(draw(st.lists(st.sampled_from([*hosts, "ghost"]), max_size=3)))
    return rates, parents, unjudged


@settings(max_examples=400, deadline=None)
@given(
    fleet=fleets(),
    fraction=st.sampled_from([0.25, 0.5, 0.7, 0.9]),
    median=st.integers(0, 2_000_000_000),
)
def test_vectorised_hops_match_the_per_hop_rule(
    fleet: tuple[dict[str, list[int]], list[dict[str, str | None]], set[str]],
    fraction: float,
    median: int,
) -> None:
    rates, parents, unjudged = fleet
    got = _hops(rates, parents, fraction, median, unjudged)
    want = rule_hops(rates, parents, fraction, median, unjudged)
    assert read_whole(got) == want


def test_grouped_reads_like_a_dict_of_sets() -> None:
    import numpy as np

    names = ["a", "b", "c", "d"]
    g = Grouped(names, np.array([2, 0, 2]), np.array([1, 3, 3]), {"d": ORIGIN_FED})
    assert g["a"] == {"d"} and g["c"] == {"b", "d"} and g["d"] == {ORIGIN_FED}
    assert g.get("b") is None and g.get("zz", set()) == set()
    assert list(g) == ["a", "c", "d"] and len(g) == 3
    assert "b" not in g and "a" in g


def test_a_fleet_past_small_integers_matches_the_rule() -> None:
    """300 hosts, 3 stripes (row numbers past CPython's cached small ints): rotated chains,
    every 10th host slow, a few without rates or whole in a stripe."""
    hosts = [f"h{i:03d}" for i in range(300)]
    parents: list[dict[str, str | None]] = []
    for s in range(3):
        order = hosts[s * 11 :] + hosts[: s * 11]
        parents.append({h: None if i % 50 == 0 else order[i - 1] for i, h in enumerate(order)})
    parents[-1]["late"] = "h000"  # a leaf that sends no rates, named last of all
    rates: dict[str, list[int]] = {}
    for i, h in enumerate(hosts):
        if i % 37 == 5:
            continue  # sent no rates
        rates[h] = [10 if i % 10 == 3 else 1000 + i for _ in range(3)]
        if i % 41 == 7:
            rates[h][1] = STRIPE_DONE
    got = _hops(rates, parents, 0.5, 1000, {"h111"})
    want = rule_hops(rates, parents, 0.5, 1000, {"h111"})
    assert got.slow_ups and got.fast_kids  # both kinds of hop are there
    assert read_whole(got) == want
