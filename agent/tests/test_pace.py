"""The sweeper's pace (coordinator/pace.py): the tick's cadence unless its own work would
take more than SWEEP_SHARE of the coordinator, never past a quarter of --dead-after."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from relgate_agent.coordinator.pace import DEAD_AFTER_FRACTION, SWEEP_SHARE, sweep_wait


def test_a_cheap_tick_keeps_the_cadence() -> None:
    assert sweep_wait(0.5, 0.004, 6.0) == 0.5
    assert sweep_wait(0.5, 0.5 * SWEEP_SHARE, 6.0) == 0.5  # exactly at the share


def test_a_costly_tick_waits_so_the_sweep_keeps_to_its_share() -> None:
    # 4,096 hosts: a 150 ms tick waits 1 s, the sweep 15 % of the coordinator
    assert abs(sweep_wait(0.5, 0.15, 6.0) - 1.0) < 1e-9
    assert abs(sweep_wait(0.5, 0.12, 6.0) - 0.8) < 1e-9


def test_the_wait_never_delays_a_dead_host_past_a_quarter_of_the_limit() -> None:
    assert sweep_wait(0.5, 2.0, 6.0) == 1.5  # would be 13.3 s
    assert sweep_wait(0.5, 2.0, 1.0) == 0.5  # a tight limit keeps the cadence, not less


@given(
    tick=st.floats(0.01, 5.0),
    own=st.floats(0.0, 30.0),
    dead_after=st.floats(0.1, 600.0),
)
def test_the_wait_is_bounded_both_ways(tick: float, own: float, dead_after: float) -> None:
    wait = sweep_wait(tick, own, dead_after)
    cap = max(tick, DEAD_AFTER_FRACTION * dead_after)
    assert tick <= wait <= cap
    if wait < cap:  # not capped: the sweep's own work is at most its share of the time
        assert own <= SWEEP_SHARE * wait + 1e-9
    if own / SWEEP_SHARE <= tick:
        assert wait == tick
