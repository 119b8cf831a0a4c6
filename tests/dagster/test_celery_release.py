"""``release_job_celery``: the release job on two real dagster-celery workers.

Real components only: Debian's ``redis-server`` (the broker and result backend) on a free
port, moto's S3 server (the workspace's object store and the S3 I/O manager's bucket), the
harness's PostgreSQL (the catalog), a Dagster instance under a temporary ``DAGSTER_HOME``,
and two ``celery -A dagster_celery.app worker`` processes; every process is stopped by PID.
The workers share nothing with the test process but the instance directory, the workspace
directory (its configuration and keys) and those servers.

The job is run in process first (the same assets, the same S3 I/O manager), then on the
workers: the root digest, the verification report (timings aside) and the verdict of every
blocking check are the same, and each shard's verify step ran on a celery worker, both
workers taking part.
"""

from __future__ import annotations

import json
import pickle
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg
import pytest
import yaml
from support.celery_workers import CeleryWorker, write_celery_config
from support.instances import NO_COMPUTE_LOGS
from support.moto_s3 import DUMMY_AWS_ENV
from support.postgres import fresh_database
from support.redis_broker import RedisServer
from support.workspaces import s3_workspace

from pipelines.definitions import defs, release_job_celery_def
from relgate.objects.s3 import S3ObjectStore

pytestmark = [pytest.mark.postgres, pytest.mark.s3, pytest.mark.celery]

SHIPPED_CONFIG = Path(__file__).resolve().parents[2] / "pipelines" / "release_job_celery.yaml"
SHARD_STEP = "release_verification.verify_release_shard["


@pytest.fixture
def redis_url() -> Iterator[str]:
    server = RedisServer()
    try:
        yield server.start()
    finally:
        server.stop()


def _comparable(report: dict[str, Any]) -> dict[str, Any]:
    """The report without what differs between two honest runs: timings and signatures."""
    shards = [{k: v for k, v in s.items() if k != "readMicros"} for s in report["shards"]]
    keep = ("root", "outcome", "counts", "facts", "problems", "unavailable")
    return {**{k: report.get(k) for k in keep}, "shards": shards}


def _verdicts(instance: dg.DagsterInstance, run_id: str) -> dict[str, bool]:
    records = instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.ASSET_CHECK_EVALUATION
    ).records
    found = {}
    for record in records:
        event = record.event_log_entry.dagster_event
        assert event is not None
        data = event.event_specific_data
        found[data.check_name] = data.passed  # type: ignore[union-attr]
    return found


def _materialized(instance: dg.DagsterInstance, run_id: str, key: str) -> dict[str, Any]:
    """The metadata of ``key``'s materialization in ``run_id``."""
    for record in instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.ASSET_MATERIALIZATION
    ).records:
        mat = record.event_log_entry.asset_materialization
        if mat is not None and mat.asset_key == dg.AssetKey(key):
            return dict(mat.metadata)
    raise AssertionError(f"run {run_id} did not materialize {key}")


def _celery_steps(instance: dg.DagsterInstance, run_id: str) -> dict[str, str]:
    """step key -> the celery worker that executed it (from the run's engine events)."""
    steps = {}
    for record in instance.get_records_for_run(
        run_id, of_type=dg.DagsterEventType.ENGINE_EVENT
    ).records:
        event = record.event_log_entry.dagster_event
        if event is None or event.step_key is None or event.engine_event_data is None:
            continue
        worker = event.engine_event_data.metadata.get("Celery worker")
        if worker is not None:
            steps[event.step_key] = str(worker.value)
    return steps


def _shipped_config() -> dict[str, Any]:
    """The shipped run config, as docs/deploy.md runs it (smaller shards, so four of them)."""
    config: dict[str, Any] = yaml.safe_load(SHIPPED_CONFIG.read_text())
    config["ops"]["shard_release"]["config"]["records_per_shard"] = 60
    return config


def _stored(endpoint: str, bucket: str, key: str) -> Any:
    """An output the S3 I/O manager pickled (our own bucket, written by the run's step)."""
    body = S3ObjectStore(bucket, endpoint_url=endpoint).client.get_object(Bucket=bucket, Key=key)
    return pickle.loads(body["Body"].read())  # noqa: S301 - see above


def _run_on_workers(
    instance: dg.DagsterInstance, tmp_path: Path, env: dict[str, str], config: dict[str, Any]
) -> str:
    """Start two celery workers, run ``release_job_celery`` through them, stop them."""
    config_dir = write_celery_config(tmp_path / "celery", env["RELGATE_CELERY_BROKER"])
    workers = [
        CeleryWorker(f"relgate-w{i}", config_dir, env, tmp_path / f"worker{i}.log") for i in (1, 2)
    ]
    try:
        for worker in workers:
            worker.start()
        job = dg.reconstructable(release_job_celery_def)
        with dg.execute_job(job, instance, run_config=config) as remote:
            assert remote.success, "\n".join(w.log() for w in workers)
            return remote.run_id
    finally:
        for worker in workers:
            worker.stop()


def test_release_job_on_two_celery_workers_matches_the_in_process_run(
    pg_dsn: str,
    moto_s3_endpoint: str,
    redis_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    home, dagster_home = tmp_path / "relgate", tmp_path / "dagster"
    dagster_home.mkdir()
    instance_yaml = {**NO_COMPUTE_LOGS, "telemetry": {"enabled": False}}
    (dagster_home / "dagster.yaml").write_text(json.dumps(instance_yaml))  # JSON is YAML
    io_bucket = f"relgate-io-{uuid.uuid4().hex[:20]}"
    S3ObjectStore(io_bucket, endpoint_url=moto_s3_endpoint).ensure_bucket()
    env = {
        "DAGSTER_HOME": str(dagster_home),
        "RELGATE_HOME": str(home),
        # what the shipped run config reads, in the test's and each worker's environment
        "RELGATE_CELERY_BROKER": redis_url,
        "RELGATE_IO_BUCKET": io_bucket,
        "RELGATE_S3_ENDPOINT": moto_s3_endpoint,
        **DUMMY_AWS_ENV,
    }
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    config = _shipped_config()
    in_process = {k: v for k, v in config.items() if k != "execution"}
    snapshot_ops = {"snapshot_alias": {"config": {"alias": "default", "approver": "carol"}}}
    with fresh_database(pg_dsn) as catalog:
        s3_workspace(home, catalog, moto_s3_endpoint).close()
        with dg.DagsterInstance.get() as instance:
            snap = defs.resolve_job_def("snapshot_release_job").execute_in_process(
                instance=instance, run_config={**in_process, "ops": snapshot_ops}
            )
            assert snap.success
            local = defs.resolve_job_def("release_job").execute_in_process(
                instance=instance, run_config=in_process
            )
            assert local.success
            local_root = local.output_for_node("shard_release")
            local_report = local.output_for_node("release_verification")
            run_id = _run_on_workers(instance, tmp_path, env, config)
            # what the workers wrote: the root the run materialized, the report in the bucket
            remote_root = _materialized(instance, run_id, "shard_release")["root"].value
            remote_report = _stored(moto_s3_endpoint, io_bucket, "dagster-io/release_verification")
            assert remote_root == local_root
            assert remote_report["outcome"] == local_report["outcome"] == "VERIFIED"
            assert _comparable(remote_report) == _comparable(local_report)
            assert _verdicts(instance, run_id) == _verdicts(instance, local.run_id)
            assert all(_verdicts(instance, run_id).values())
            steps = _celery_steps(instance, run_id)
            shard_steps = {k: v for k, v in steps.items() if k.startswith(SHARD_STEP)}
            assert len(shard_steps) == len(remote_report["shards"]) == 4
            assert {v.split("@")[0] for v in shard_steps.values()} == {"relgate-w1", "relgate-w2"}
            reduce_step = "release_verification.reduce_shard_verification"
            assert {"shard_release", reduce_step, "pinned_run"} <= set(steps)
