"""The bypass judge (agent/bypass.py): which upstream a host routes around on its own."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relgate_agent.agent.bypass import (
    AHEAD_MIN,
    FLOOR_BPS,
    REASON_RX,
    REASON_TX,
    RX_HOLD_S,
    TX_HOLD_S,
    WINDOW_S,
    BypassJudge,
    StripeView,
    Verdict,
)
from relgate_agent.agent.job import Assignments
from relgate_agent.proto import distribution_pb2 as pb

TICK = 0.5
FAST = 1_500_000  # bytes/s: a healthy stripe of a 100 Mbit host with k = 8


def run(
    judge: BypassJudge,
    seconds: float,
    rates: dict[int, float],
    view: Callable[[int, int], StripeView],
    start: float = 0.0,
    tick: float = TICK,
    rate_at: Callable[[int, float], float] | None = None,
) -> list[tuple[float, Verdict]]:
    """Tick every ``tick`` for ``seconds``: stripe s receives rates[s] bytes/s (or
    ``rate_at(s, t)``); ``view(s, rx)`` makes its StripeView. Every verdict with its time."""
    out: list[tuple[float, Verdict]] = []
    rx = dict.fromkeys(rates, 0.0)
    i = 0
    while (t := start + i * tick) <= start + seconds + 1e-9:
        views = {s: view(s, int(rx[s])) for s in rates}
        out += [(t, v) for v in judge.observe(t, views)]
        for s, r in rates.items():
            rx[s] += (rate_at(s, t) if rate_at else r) * tick
        i += 1
    return out


def peer(up: str, ahead: int | None, fed: int | None = 0, can: bool = True):
    return lambda s, rx: StripeView(up if s == 0 else f"u{s}", rx, ahead if s == 0 else 0, fed, can)


def test_a_tx_slow_upstream_holding_blocks_ready_is_bypassed_after_the_window_and_hold() -> None:
    verdicts = run(BypassJudge(), 10, {0: 0.3 * FAST, 1: FAST, 2: FAST}, peer("x", AHEAD_MIN))
    t, v = verdicts[0]
    assert (v.stripe, v.upstream, v.reason) == (0, "x", REASON_TX)
    assert t == pytest.approx(WINDOW_S + TX_HOLD_S)  # not a tick earlier
    assert v.ahead == AHEAD_MIN and v.rate == pytest.approx(0.3 * FAST)
    assert v.reference == pytest.approx(FAST)
    assert "upstream x is the slow hop (tx)" in v.describe()


def test_a_victim_whose_upstream_holds_nothing_ready_bypasses_nobody() -> None:
    """Behind a slow chain the upstream forwards what it gets at once: no backlog there."""
    assert run(BypassJudge(), 20, {0: 0.2 * FAST, 1: FAST}, peer("x", AHEAD_MIN - 1)) == []


def test_a_host_whose_own_receive_is_slow_bypasses_nobody() -> None:
    """Every stripe slow alike (this host's NIC): the upstreams' backlogs are its own doing."""
    views = lambda s, rx: StripeView(f"u{s}", rx, AHEAD_MIN * 4, 0, True)  # noqa: E731
    assert run(BypassJudge(), 20, dict.fromkeys(range(4), 0.3 * FAST), views) == []


def test_a_stripe_just_over_half_the_fastest_is_not_slow() -> None:
    views = peer("x", AHEAD_MIN * 4)
    assert run(BypassJudge(), 20, {0: 0.51 * FAST, 1: FAST}, views) == []
    assert run(BypassJudge(), 20, {0: 0.49 * FAST, 1: FAST}, views) != []


def test_under_the_floor_nothing_is_judged() -> None:
    slow, ref = 0.1 * FLOOR_BPS, 0.99 * FLOOR_BPS
    assert run(BypassJudge(), 20, {0: slow, 1: ref}, peer("x", AHEAD_MIN * 4)) == []
    assert run(BypassJudge(), 20, {0: slow, 1: FLOOR_BPS}, peer("x", AHEAD_MIN * 4)) != []


def test_an_upstream_that_cannot_receive_is_bypassed_later_than_a_tx_slow_one() -> None:
    verdicts = run(BypassJudge(), 12, {0: 0.3 * FAST, 1: FAST}, peer("x", 0, fed=AHEAD_MIN))
    t, v = verdicts[0]
    assert (v.stripe, v.upstream, v.reason, v.ahead) == (0, "x", REASON_RX, AHEAD_MIN)
    assert t == pytest.approx(WINDOW_S + RX_HOLD_S)
    # its own upstream held too little for it: a victim too
    assert run(BypassJudge(), 20, {0: 0.3 * FAST, 1: FAST}, peer("x", 0, AHEAD_MIN - 1)) == []


def test_no_bypass_peer_no_verdict_but_the_evidence_is_kept() -> None:
    ticks = iter(range(1000))

    def view(s: int, rx: int) -> StripeView:
        # the first 10 s (20 ticks of two stripes) without a bypass peer, then with one
        return peer("x", 8, can=next(ticks) >= 2 * 20)(s, rx)

    (t, v), *_ = run(BypassJudge(), 12, {0: 0.3 * FAST, 1: FAST}, view)
    assert t == pytest.approx(10.0) and v.reason == REASON_TX  # the hold was met long ago


def test_a_new_upstream_starts_the_evidence_over() -> None:
    judge = BypassJudge()
    assert run(judge, WINDOW_S + TX_HOLD_S - TICK, {0: 0.3 * FAST, 1: FAST}, peer("x", 8)) == []
    verdicts = run(judge, 10, {0: 0.3 * FAST, 1: FAST}, peer("y", 8), start=WINDOW_S + TX_HOLD_S)
    assert verdicts[0][1].upstream == "y"
    assert verdicts[0][0] == pytest.approx(2 * (WINDOW_S + TX_HOLD_S))


def test_a_stripe_not_pulled_from_a_peer_is_neither_judged_nor_a_reference() -> None:
    """The origin, a stripe held whole or paused: upstream "" (a fast origin stripe must
    not make the peer stripes look slow)."""
    views = lambda s, rx: StripeView("" if s == 1 else "x", rx, 8, 0, True)  # noqa: E731
    assert run(BypassJudge(), 20, {0: 0.3 * FAST, 1: 10 * FAST}, views) == []


def test_what_a_host_says_of_its_own_receive() -> None:
    judge = BypassJudge()
    run(judge, 6, {0: 0.3 * FAST, 1: FAST}, peer("x", 8, can=False))
    assert judge.fed(0, 9) == 0  # its stripe 0 is the uneven one: its upstream's doing
    assert judge.fed(1, 9) == 9  # stripe 1 comes in as fast as any: its receive holds it
    assert judge.fed(1, None) == 0


@settings(max_examples=60, deadline=None)
@given(
    base=st.floats(FLOOR_BPS, 50 * FAST),
    jitter=st.lists(st.floats(0.55, 1.0), min_size=2, max_size=8),
    ahead=st.integers(0, 64),
    fed=st.integers(0, 64),
)
def test_stripes_within_a_factor_of_two_of_each_other_are_never_bypassed(
    base: float, jitter: list[float], ahead: int, fed: int
) -> None:
    rates = {s: base * j for s, j in enumerate(jitter)}
    views = lambda s, rx: StripeView(f"u{s}", rx, ahead, fed, True)  # noqa: E731
    assert run(BypassJudge(), 15, rates, views) == []


# ---------------------------------------------------------------------- Assignments


def _assignment(
    version: int, upstream: str, bypass: str | None = "g", port: int = 7480
) -> pb.Assignment:
    sa = pb.StripeAssignment(
        stripe=0,
        upstream=pb.Peer(host_id=upstream, address=f"{upstream}:{port}"),
        resume_block=5,
        compress=True,
        downstreams=[pb.Peer(host_id="d")],
    )
    if bypass is not None:
        sa.bypass.CopyFrom(pb.Peer(host_id=bypass, address=f"{bypass}:7480"))
    other = pb.StripeAssignment(stripe=1, upstream=pb.Peer(host_id="o", address="o:7480"))
    return pb.Assignment(job_id="j", topology_version=version, stripes=[sa, other])


def test_a_bypass_pulls_from_the_bypass_peer_until_the_upstream_changes() -> None:
    a = Assignments()
    a.apply(_assignment(1, "u"))
    first = a.effective(0)
    assert first is not None and first.upstream.host_id == "u"
    assert not a.bypass(0, "x")  # not the upstream it names
    assert a.bypass(0, "u")
    assert not a.bypass(0, "u")  # once
    eff = a.effective(0)
    assert eff is not None
    assert (eff.upstream.host_id, eff.upstream.address) == ("g", "g:7480")
    assert (eff.resume_block, eff.compress, list(eff.downstreams)) == (5, False, [])
    assert a.changed(0, first) and not a.changed(0, eff)
    assert a.bypassed_stripes() == [0]
    assert a.effective(1) == a.by_stripe[1]  # another stripe untouched
    a.apply(_assignment(2, "u"))  # the same upstream in a new version: still bypassed
    assert a.bypassed_stripes() == [0] and a.effective(0).upstream.host_id == "g"  # type: ignore[union-attr]
    a.apply(_assignment(3, "v"))  # the leader rewired the stripe: the bypass ends
    assert a.bypassed_stripes() == [] and a.effective(0).upstream.host_id == "v"  # type: ignore[union-attr]
    a.apply(_assignment(4, "u"))  # back to u: the leader's word, not the old bypass
    assert a.bypassed_stripes() == [] and a.effective(0).upstream.host_id == "u"  # type: ignore[union-attr]
    assert a.bypass(0, "u")


def test_no_bypass_peer_no_bypass() -> None:
    a = Assignments()
    assert not a.bypass(0, "u")  # no assignment yet
    a.apply(_assignment(1, "u", bypass=None))
    assert not a.bypass(0, "u")
    assert a.bypassed_stripes() == [] and a.effective(0).upstream.host_id == "u"  # type: ignore[union-attr]


def test_the_reference_is_any_other_stripe_before_or_after_it() -> None:
    """The slow stripe last in number, its fast reference first (cosmic-ray: 't >= s')."""
    views = lambda s, rx: StripeView("x" if s == 3 else f"u{s}", rx, 8, 0, True)  # noqa: E731
    verdicts = run(BypassJudge(), 6, {0: FAST, 1: 0.3 * FAST, 2: 0.4 * FAST, 3: 0.2 * FAST}, views)
    assert {(v.stripe, v.upstream) for _, v in verdicts} >= {(3, "x")}


def test_host_ids_are_compared_by_value_and_order_means_nothing() -> None:
    """Host ids long enough not to be interned, and rewires to a host that sorts before
    the bypassed one (cosmic-ray: '==' as 'is' or '<=', '!=' as '<')."""
    up, low, grand = "h-0412-upstream", "a-0001-earlier", "h-0007-grandparent"
    a = Assignments()
    a.apply(_assignment(1, up, bypass=grand))
    assert not a.bypass(0, low)  # another host, sorting before the upstream
    assert a.bypass(0, up)
    assert not a.bypass(0, up.encode().decode())  # once, asked with an equal str
    assert a.bypassed_stripes() == [0]
    a.apply(_assignment(2, up, bypass=grand))  # the same upstream, another str
    assert a.bypassed_stripes() == [0]
    a.apply(_assignment(3, low, bypass=grand))  # rewired to a host sorting before it
    assert a.bypassed_stripes() == []
    a.apply(_assignment(4, up, bypass=grand))  # back: the leader's word
    assert a.bypassed_stripes() == []


def test_a_stream_is_changed_by_its_upstream_host_or_address() -> None:
    a = Assignments()
    a.apply(_assignment(1, "h-0412-upstream"))
    first = a.effective(0)
    assert first is not None and not a.changed(0, first)
    a.apply(_assignment(2, "h-0412-upstream", port=7481))  # restarted on another port
    assert a.changed(0, first)
    moved = a.effective(0)
    assert moved is not None
    a.apply(_assignment(3, "a-0001-earlier", port=7481))  # another host, the same port
    assert a.changed(0, moved)
    a.apply(_assignment(4, "z-0001-later", port=7481))
    assert a.changed(0, moved)


def test_another_host_at_the_same_address_is_another_upstream() -> None:
    """A host id re-enrolled on an address another host used (cosmic-ray: the host-id test
    as '<', '>' or 'and')."""
    a = Assignments()

    def at(version: int, host: str) -> pb.Assignment:
        plan = _assignment(version, host)
        plan.stripes[0].upstream.address = "10.0.0.1:7480"
        return plan

    for first, then in (("h-0002", "h-0001"), ("h-0001", "h-0002")):
        a.apply(at(a.topology_version + 1, first))
        held = a.effective(0)
        assert held is not None
        a.apply(at(a.topology_version + 1, then))
        assert a.changed(0, held)


# ---------------------------------------------------------------------- edges (cosmic-ray)


def test_ticks_off_the_window_grid_judge_at_the_first_tick_past_window_and_hold() -> None:
    """0.3 s ticks: the rate needs a sample at or before the window's start (2.1 s), the
    hold is met at the first tick at or past it (tx: 4.2 s; rx: 6.3 s)."""
    tx = run(BypassJudge(), 8, {0: 0.3 * FAST, 1: FAST}, peer("x", 8), tick=0.3)
    assert tx[0][0] == pytest.approx(4.2) and tx[0][1].reason == REASON_TX
    rx = run(BypassJudge(), 9, {0: 0.3 * FAST, 1: FAST}, peer("x", 0, fed=7), tick=0.3)
    assert rx[0][0] == pytest.approx(6.3) and rx[0][1].reason == REASON_RX
    assert rx[0][1].ahead == 7


def test_a_stripe_that_turns_slow_is_judged_on_the_last_window_only() -> None:
    """Fast for 6 s, then slow: its 2 s rate falls under half at 7.5 s (the sample at or
    before the window's start and none older), the hold ends 2 s later."""
    verdicts = run(
        BypassJudge(),
        14,
        {0: FAST, 1: FAST},
        peer("x", 8),
        rate_at=lambda s, t: 0.1 * FAST if s == 0 and t >= 6 else FAST,
    )
    assert verdicts[0][0] == pytest.approx(7.5 + TX_HOLD_S)
    # off the grid (0.3 s ticks): still the last window only (none older kept)
    verdicts = run(
        BypassJudge(),
        14,
        {0: FAST, 1: FAST},
        peer("x", 8),
        tick=0.3,
        rate_at=lambda s, t: 0.1 * FAST if s == 0 and t >= 6 else FAST,
    )
    assert verdicts[0][0] == pytest.approx(9.3)  # slow from 7.2 s: 5.1-7.2 s at 0.486 x


@pytest.mark.parametrize("then", ["y", "a"])  # a name sorting after or before the first
def test_a_new_upstream_in_one_run_starts_the_evidence_over(then: str) -> None:
    ticks = iter(range(1000))

    def view(s: int, rx: int) -> StripeView:
        # stripe 0 from x until 3.5 s (8 ticks of two stripes), then from another
        return peer("x" if next(ticks) < 2 * 8 else then, 8)(s, rx)

    verdicts = run(BypassJudge(), 12, {0: 0.3 * FAST, 1: FAST}, view)
    t, v = verdicts[0]
    assert v.upstream == then and t == pytest.approx(4.0 + WINDOW_S + TX_HOLD_S)


def test_a_stripe_not_pulled_from_a_peer_first_in_number_stops_nobody() -> None:
    views = lambda s, rx: StripeView({0: "", 1: "x"}.get(s, f"u{s}"), rx, 8, 0, True)  # noqa: E731
    verdicts = run(BypassJudge(), 8, {0: FAST, 1: 0.3 * FAST, 2: FAST}, views)
    assert {v.stripe for _, v in verdicts} == {1}


def test_exactly_half_the_fastest_is_not_slow() -> None:
    assert run(BypassJudge(), 12, {0: 0.5 * FAST, 1: FAST}, peer("x", 8)) == []


def test_a_stripe_that_cannot_be_bypassed_does_not_hide_the_next_one() -> None:
    views = lambda s, rx: StripeView(f"u{s}", rx, 8, 0, s != 0)  # noqa: E731
    verdicts = run(BypassJudge(), 8, {0: 0.3 * FAST, 1: 0.3 * FAST, 2: FAST}, views)
    assert {v.stripe for _, v in verdicts} == {1}


def test_a_finished_stripe_stays_the_reference_for_a_while() -> None:
    """The fast stripes finish first: stripe 1 is done at 3 s (upstream ""), and its last
    rate keeps showing stripe 0 slow until REF_HOLD_S after it (not at 14 s)."""

    def views(can_from: float):  # type: ignore[no-untyped-def]
        ticks = iter(range(1000))

        def view(s: int, rx: int) -> StripeView:
            t = next(ticks) // 2 * TICK  # two stripes a tick
            up = "" if s == 1 and t >= 3.0 else ("x" if s == 0 else "u1")
            return StripeView(up, rx, 8, 0, t >= can_from)

        return view

    early = run(BypassJudge(), 8, {0: 0.3 * FAST, 1: FAST}, views(0.0))
    assert early and early[0][0] == pytest.approx(WINDOW_S + TX_HOLD_S)
    assert early[0][1].reference == pytest.approx(FAST)
    assert run(BypassJudge(), 16, {0: 0.3 * FAST, 1: FAST}, views(14.0)) == []
