"""``make demo`` as a new user sees it: what happened, and nothing else.

The demo driver runs as a real process on a fresh SQLite instance and workspace, twice.
Every job is launched through workspace.yaml and the run queue, so each run belongs to the
code location.  The first run prints one line per step and nothing on stderr (no Preview/Beta warnings,
no Pipes notices, no agent or coordinator logging, no ``eta -1s``); its GC summary never
counts more required than stored objects.  The second run, on unchanged input, reports
the same snapshot and release digests at generation 1.
"""

import os
import re
import shutil
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import dagster as dg
import pytest

from assets.table_metadata import METADATA_KEY

ROOT = Path(__file__).resolve().parents[2]
DIGEST = r"sha256:[0-9a-f]{64}"

pytestmark = pytest.mark.slow
DEMO_JOBS = [
    "snapshot_release_job",
    "release_job",
    "distribution_job",
    "nightly_snapshot_job",
    "retention_plan_job",
]


def _demo(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "RELGATE_HOME": str(tmp_path / "relgate"),
        "DAGSTER_HOME": str(tmp_path / "dagster"),
    }
    return subprocess.run(
        [sys.executable, "-m", "pipelines.demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _digest(pattern: str, out: str) -> str:
    found = re.search(pattern + f"({DIGEST})", out)
    assert found, (pattern, out)
    return found.group(1)


def _metadata_keys(instance, runs):
    """(key, where) for every metadata key of every materialization, observation and check
    evaluation the runs recorded."""
    for run in runs:
        for entry in instance.all_logs(run.run_id):
            event = entry.dagster_event
            if event is None:
                continue
            data = event.event_specific_data
            for attr in ("materialization", "asset_observation"):
                reported = getattr(data, attr, None)
                if reported is not None:
                    yield from ((k, reported.asset_key.to_user_string()) for k in reported.metadata)
            if event.event_type == dg.DagsterEventType.ASSET_CHECK_EVALUATION:
                yield from ((k, data.check_name) for k in data.metadata)


def _runs_belong_to_the_code_location(dagster_home: Path) -> None:
    """Every demo run was launched through workspace.yaml (it has the code location's
    origin, so the UI lists it under its job and can re-execute it), succeeded, and the
    nightly run built yesterday's partition; the coordinator's log is in the distribution
    run's compute log."""
    with dg.DagsterInstance.from_config(str(dagster_home)) as instance:
        runs = instance.get_runs()
        assert sorted(r.job_name for r in runs) == sorted(DEMO_JOBS)
        for run in runs:
            assert run.status == dg.DagsterRunStatus.SUCCESS, run.job_name
            assert run.remote_job_origin is not None, run.job_name
            assert run.remote_job_origin.location_name == "relgate"
        (nightly,) = (r for r in runs if r.job_name == "nightly_snapshot_job")
        yesterday = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%d")
        assert nightly.tags["dagster/partition"] == yesterday
        assert not {
            key: where
            for key, where in _metadata_keys(instance, runs)
            if not METADATA_KEY.match(key)
        }, "metadata keys are camelCase (or dagster/...)"
        (dist,) = (r for r in runs if r.job_name == "distribution_job")
        logs = list((dagster_home / "storage" / dist.run_id / "compute_logs").glob("*.err"))
        assert any("coordinator" in log.read_text() for log in logs), logs


def test_the_demo_prints_what_happened_and_reruns_as_a_no_op(tmp_path):
    (tmp_path / "dagster").mkdir()
    shutil.copy(ROOT / "dagster.yaml", tmp_path / "dagster" / "dagster.yaml")
    first = _demo(tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""
    out = first.stdout
    for noise in ("Warning", "[pipes]", "relgate_agent", "eta -1s", "INFO", "DEBUG"):
        assert noise not in out
    snapshot = _digest(r"active snapshot for alias 'default' \(generation 1\): ", out)
    release = _digest(r"published release for alias 'default-release' \(generation 1\): ", out)
    assert "verification VERIFIED" in out and "4 worker processes passed the barrier" in out
    assert "DistributionComplete: demo-lm/v1 ready on 4/4 hosts" in out
    gc = re.search(
        r"GC plan \(dry run, grace 0s\): (\d+) stored objects, (\d+) of them required", out
    )
    assert gc and int(gc.group(2)) <= int(gc.group(1)), out
    _runs_belong_to_the_code_location(tmp_path / "dagster")

    again = _demo(tmp_path)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    rerun = again.stdout
    assert _digest(r"active snapshot for alias 'default' \(generation 1\): ", rerun) == snapshot
    assert (
        _digest(r"published release for alias 'default-release' \(generation 1\): ", rerun)
        == release
    )
    assert rerun.count("(unchanged input: the existing digest)") == 2
