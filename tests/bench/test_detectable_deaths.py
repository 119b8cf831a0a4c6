"""bench/coordinator.py's rule for which dead hosts a leader must have spliced by the end."""

from __future__ import annotations

from bench.coordinator import DEAD_AFTER_S, LEASE_TTL_S, detectable_deaths
from relgate_agent.coordinator.failover import takeover_grace_s
from relgate_agent.coordinator.jobstate import CoordinatorConfig

INTERVAL = 2.0
GRACE = takeover_grace_s(CoordinatorConfig(dead_after_s=DEAD_AFTER_S, report_interval_s=INTERVAL))


def test_the_old_leader_catches_what_died_long_before_the_kill() -> None:
    killed, end = 100.0, 300.0
    margin = 2 * INTERVAL
    died = {"early": killed - DEAD_AFTER_S - margin - 0.1, "at-kill": killed - 1}
    # end far enough: the new leader judges the one it never heard from after its grace
    assert detectable_deaths(died, killed, end, INTERVAL) == {"early", "at-kill"}
    # end before the new leader's grace is over: only the old leader's catch counts
    short_end = killed + LEASE_TTL_S + GRACE + margin - 0.1
    assert detectable_deaths(died, killed, short_end, INTERVAL) == {"early"}


def test_the_new_leader_catches_what_died_after_reaching_it() -> None:
    killed, end = 20.0, 45.0  # too short for the grace: 26 + 27 + 4 > 45
    margin = 2 * INTERVAL
    heard = killed + LEASE_TTL_S + margin + 0.1
    died = {"heard": heard, "late": end - DEAD_AFTER_S - margin, "takeover": killed + 3}
    assert detectable_deaths(died, killed, end, INTERVAL) == {"heard"}
