"""A release job launched as a separate process (what a UI launch or the daemon does) vs
the same job executed in process.

Workload: a fresh demo workspace (seeded corpus, snapshot activated, one release published
first, not timed); then ``release_job`` on unchanged input (write, verify every shard,
publish, permit, a pinned run of ``world_size`` ranks through Pipes) with ``records``
records per shard.  Baseline in the same run: ``execute_in_process`` of that job.  Measured:
``dagster job execute -m pipelines.definitions -j release_job`` in a new process (the
process start and code-location import included, as a launched run pays them).  Ratio:
launched seconds over in-process seconds (issue 26 asks for <= 2).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.record import Comparison, compare

QUICK: dict[str, int] = {"records": 200, "world_size": 2}
TARGET = {"launchedOverInProcess": "<= 2 (issue 26)"}
ROOT = Path(__file__).resolve().parents[1]


def _rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return round(max(own, kids) / 1024, 1)


def _ops(records: int, world_size: int) -> dict[str, Any]:
    permit = {"alias": "default-release", "purpose": "demo-model-training"}
    return {
        "shard_release": {"config": {"records_per_shard": records}},
        "release_alias": {"config": {"alias": "default-release", "approver": "bench"}},
        "gate_permit": {"config": {**permit, "world_size": world_size}},
    }


def main(records: int = 200, world_size: int = 2) -> dict[str, object]:
    import dagster as dg
    import yaml

    from pipelines.definitions import defs
    from relgate.demo.corpus import seed_demo
    from relgate.snapshot.transform_tags import tag_transform
    from relgate.workspace import Workspace

    with tempfile.TemporaryDirectory(prefix="relgate-bench-launch-") as tmp:
        home, dagster_home = Path(tmp) / "relgate", Path(tmp) / "dagster-home"
        dagster_home.mkdir()
        (dagster_home / "dagster.yaml").write_text("telemetry: {enabled: false}\n")
        env = {"RELGATE_HOME": str(home), "DAGSTER_HOME": str(dagster_home)}
        os.environ.update(env)
        ws = Workspace.init(home)
        for tag in ("registry.local/normalize:v1", "registry.local/identity:v1"):
            tag_transform(ws.db, tag)
        seed_demo(ws, tickets=120, forum_objects=3, per_object=20, chat_events=60)
        ws.close()
        ops = _ops(records, world_size)
        snapshot_ops = {"snapshot_alias": {"config": {"alias": "default", "approver": "bench"}}}
        with dg.DagsterInstance.get() as instance:
            job = defs.resolve_job_def("snapshot_release_job")
            assert job.execute_in_process(
                instance=instance, run_config={"ops": snapshot_ops}
            ).success
            release = defs.resolve_job_def("release_job")
            assert release.execute_in_process(instance=instance, run_config={"ops": ops}).success
            started = time.monotonic()
            assert release.execute_in_process(instance=instance, run_config={"ops": ops}).success
            in_process = time.monotonic() - started
        config = Path(tmp) / "run.yaml"
        quiet = {"console": {"config": {"log_level": "ERROR"}}}
        config.write_text(yaml.safe_dump({"ops": ops, "loggers": quiet}))
        command = [sys.executable, "-m", "dagster", "job", "execute"]
        command += ["-m", "pipelines.definitions", "-j", "release_job", "-c", str(config)]
        started = time.monotonic()
        subprocess.run(
            command, cwd=ROOT, env={**os.environ, **env}, check=True, capture_output=True
        )
        launched = time.monotonic() - started
    return {
        "workload": f"release_job on unchanged input: {records} records per shard,"
        f" {world_size} ranks; launched process vs execute_in_process",
        "baseline": {"inProcessSeconds": round(in_process, 2)},
        "launchedSeconds": round(launched, 2),
        "ratio": round(launched / in_process, 2),
        "peakRssMiB": _rss_mb(),
        "target": TARGET,
    }


def comparisons(result: dict[str, Any]) -> list[Comparison]:
    """A launched run's wall time against execute_in_process of the same job."""
    return [
        compare(
            "release_job wall time",
            "s",
            ("launched run", result["launchedSeconds"]),
            ("execute_in_process", result["baseline"]["inProcessSeconds"]),
        )
    ]
