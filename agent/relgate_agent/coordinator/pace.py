"""Pace: how long the sweeper waits between two ticks.

A tick's cost grows with the fleet (every host's silence, rates and counters are looked
at: ~50-75 ms at 4,096 hosts on this machine's cores, more while the interpreter is
shared), while what it decides needs no faster cadence than the dead-host limit allows.
So the wait after a tick is the server's tick (0.5 s) or, when the tick's own work took longer
than SWEEP_SHARE of that, long enough that the sweep keeps to SWEEP_SHARE of the
coordinator's time: capped at a quarter of ``--dead-after`` so a dead host is still
spliced within 1.25 x the limit. The reports a tick applied between its phases are
not its own work (batch.py) and do not count.
"""

from __future__ import annotations

SWEEP_SHARE = 0.15  # at most this fraction of the coordinator's time goes to the sweep
DEAD_AFTER_FRACTION = 0.25  # the longest wait, as a fraction of --dead-after


def sweep_wait(tick_s: float, own_s: float, dead_after_s: float) -> float:
    """The wait before the next tick, given the last tick's own seconds."""
    wanted = max(tick_s, own_s / SWEEP_SHARE)
    return min(wanted, max(tick_s, DEAD_AFTER_FRACTION * dead_after_s))


__all__ = ["DEAD_AFTER_FRACTION", "SWEEP_SHARE", "sweep_wait"]
