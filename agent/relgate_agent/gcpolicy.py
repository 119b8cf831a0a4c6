"""The garbage-collector policy of a long-running daemon: thresholds and a frozen start-up heap.

Python's cyclic collector runs generation 0 every 700 net allocations by default and, as
objects survive, full collections over the whole heap. A coordinator holding 4,096 hosts'
state allocates a few hundred objects per report: measured in ``bench coordinator`` (the
``relgate_coordinator_gc_pause_seconds`` histogram), the defaults paused the leader ~57
times a second, 3.5 ms on average, p99.9 about 1 s: a fifth of its time, and every report
in flight waits each pause out. Higher thresholds collect rarely (cyclic garbage lives a
little longer; reference counting still frees everything else at once), and freezing the
start-up heap (modules, gRPC, the store) keeps it out of every later full collection. Too
high is worse for the tail: at 50000,50,100 the same leader paused 39 times in 150 s but
115 ms on average (p99 <= 2.5 s); at 10000,10,100, 343 times, 20 ms on average (p99 <= 250
ms), 4.6 % of its time.
"""

from __future__ import annotations

import gc

import click

PYTHON_DEFAULT = (700, 10, 10)
DAEMON_DEFAULT = "10000,10,100"  # generation 0, 1 and 2 thresholds (gc.set_threshold)


def parse_threshold(text: str) -> tuple[int, int, int]:
    """``"GEN0,GEN1,GEN2"`` (positive integers) or ``"python"`` (Python's own defaults)."""
    if text.strip() == "python":
        return PYTHON_DEFAULT
    parts = text.split(",")
    try:
        values = tuple(int(p) for p in parts)
    except ValueError:
        values = ()
    if len(values) != len(PYTHON_DEFAULT) or min(values) < 1:
        raise click.BadParameter(
            f"{text!r}: want three positive integers GEN0,GEN1,GEN2 (e.g. {DAEMON_DEFAULT})"
            ' or "python"'
        )
    return values[0], values[1], values[2]


def apply(threshold: tuple[int, int, int]) -> None:
    """Set the thresholds and move everything alive now (the start-up heap) out of the
    collector's reach (``gc.freeze``): call once the daemon has started."""
    gc.set_threshold(*threshold)
    gc.collect()
    gc.freeze()


__all__ = ["DAEMON_DEFAULT", "PYTHON_DEFAULT", "apply", "parse_threshold"]
