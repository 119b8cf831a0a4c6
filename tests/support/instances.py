"""A temporary Dagster instance for tests, without compute-log capture.

``dg.instance_for_test()`` keeps Dagster's default local compute-log manager, which mirrors
every step's stdout and stderr through a ``tail -F`` process and a Python watcher process
per stream: four process start-ups per step, and tests never read those logs.  This
instance is the same temporary instance with the no-op compute-log manager; runs, events,
asset materializations and checks are stored exactly as before.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import dagster as dg

NO_COMPUTE_LOGS = {
    "compute_logs": {
        "module": "dagster._core.storage.noop_compute_log_manager",
        "class": "NoOpComputeLogManager",
    }
}


@contextmanager
def dagster_instance() -> Iterator[dg.DagsterInstance]:
    """``dg.instance_for_test`` with compute-log capture off."""
    with dg.instance_for_test(overrides=NO_COMPUTE_LOGS) as instance:
        yield instance
