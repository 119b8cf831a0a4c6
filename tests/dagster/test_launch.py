"""The demo's run driver (pipelines/launch.py) on a real instance, daemon and code server.

A submission that cannot be queued (a job the code location does not have) is a
``LaunchError`` naming the job, which the demo prints, never a traceback; and closing the
driver stops the daemon it started, by its process group, even after such a refusal.
"""

from __future__ import annotations

import os

import pytest
from support.instances import dagster_instance

from pipelines.launch import CodeLocationRuns, LaunchError


def test_an_unknown_job_is_a_launch_error_and_the_daemon_is_stopped() -> None:
    with dagster_instance() as instance:
        runs = CodeLocationRuns(instance)
        with runs:
            daemon = runs._daemon
            assert daemon is not None and daemon.poll() is None
            with pytest.raises(LaunchError, match="no_such_job: not queued"):
                runs.submit("no_such_job", {})
        assert daemon.poll() is not None  # stopped and reaped
        with pytest.raises(ProcessLookupError):
            os.killpg(daemon.pid, 0)  # nothing of its session is left
