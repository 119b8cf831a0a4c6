"""The shipped ``dagster.postgres.yaml``, as it is, on the harness's PostgreSQL.

A Dagster instance whose run, event-log and schedule storage is one PostgreSQL database
(read from ``DAGSTER_PG_URL`` in the harness's own ``postgresql+psycopg://`` spelling, which
the demo's rule turns into the psycopg2 driver), and a relgate catalog in a second
PostgreSQL database: the snapshot job and the release job run on it end to end, and the
runs, materializations and catalog rows are read back from PostgreSQL itself.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import dagster as dg
import psycopg
import pytest
from click.testing import CliRunner
from support.postgres import _connect_kwargs, fresh_database
from support.workspaces import make_workspace

from pipelines.definitions import defs
from pipelines.pg_instance import PG_URL_ENV, dagster_pg_url, main, use_pg_url
from relgate.catalog.release_table import get_release

ROOT = Path(__file__).resolve().parents[2]
QUIET = {"console": {"config": {"log_level": "ERROR"}}}

pytestmark = pytest.mark.postgres


def _count(url: str, sql: str) -> int:
    with psycopg.connect(**_connect_kwargs(url), connect_timeout=10) as conn:
        row = conn.execute(sql).fetchone()
    assert row is not None
    return int(row[0])


def _run(
    instance: dg.DagsterInstance, job: str, ops: dict[str, object]
) -> dg.ExecuteInProcessResult:
    result = defs.resolve_job_def(job).execute_in_process(
        instance=instance, run_config={"ops": ops, "loggers": QUIET}, raise_on_error=False
    )
    assert result.success, [e.message for e in result.all_events if e.is_failure]
    return result


def _assert_queued(instance: dg.DagsterInstance) -> None:
    """UI, schedule and sensor runs queue: two at a time, a backfill one run at a time."""
    queue = instance.get_concurrency_config().run_queue_config
    assert type(instance.run_coordinator).__name__ == "QueuedRunCoordinator"
    assert queue is not None and queue.max_concurrent_runs == 2
    assert queue.tag_concurrency_limits == [{"key": "dagster/backfill", "limit": 1}]


def test_the_embedded_instance_queues_runs(tmp_path: Path) -> None:
    shutil.copy(ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        _assert_queued(instance)
    for name in ("dagster.yaml", "dagster.postgres.yaml"):  # no first-visit dialog
        assert "nux:\n  enabled: false" in (ROOT / name).read_text()


def test_snapshot_and_release_jobs_on_a_postgres_instance_and_catalog(
    pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with fresh_database(pg_dsn) as dagster_db, fresh_database(pg_dsn) as catalog_db:
        home = tmp_path / "relgate"
        make_workspace(home, catalog_db).close()
        dagster_home = tmp_path / "dagster"
        dagster_home.mkdir()
        shutil.copy(ROOT / "dagster.postgres.yaml", dagster_home / "dagster.yaml")
        monkeypatch.setenv("DAGSTER_HOME", str(dagster_home))
        monkeypatch.setenv("RELGATE_HOME", str(home))
        monkeypatch.setenv(PG_URL_ENV, dagster_db)  # postgresql+psycopg://...: rewritten
        assert use_pg_url() == dagster_pg_url(dagster_db)
        with dg.DagsterInstance.get() as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            assert type(instance.event_log_storage).__name__ == "PostgresEventLogStorage"
            _assert_queued(instance)
            snap = _run(
                instance,
                "snapshot_release_job",
                {"snapshot_alias": {"config": {"alias": "default", "approver": "carol"}}},
            )
            permit = {"alias": "default-release", "purpose": "demo-model-training", "world_size": 2}
            release = _run(
                instance,
                "release_job",
                {
                    "shard_release": {"config": {"records_per_shard": 200}},
                    "release_alias": {"config": {"alias": "default-release", "approver": "dana"}},
                    "gate_permit": {"config": permit},
                },
            )
            root = release.output_for_node("shard_release")
            latest = instance.get_latest_materialization_event(dg.AssetKey("shard_release"))
            assert latest is not None and latest.run_id == release.run_id
        assert snap.output_for_node("snapshot_alias")["generation"] == 1
        assert release.output_for_node("pinned_run")["root"] == root
        # Both runs and their events are rows in the Dagster database...
        assert _count(dagster_db, "SELECT count(*) FROM runs WHERE status = 'SUCCESS'") == 2
        assert (
            _count(
                dagster_db,
                "SELECT count(*) FROM event_logs WHERE dagster_event_type = 'ASSET_MATERIALIZATION'",
            )
            >= 9
        )
        # ... and the release is PUBLISHED in the catalog's database.
        ws = make_workspace(home, catalog_db, seed=False)
        try:
            assert get_release(ws.db, root).state == "PUBLISHED"
        finally:
            ws.close()
        assert _count(catalog_db, "SELECT count(*) FROM releases WHERE state = 'PUBLISHED'") == 1


@pytest.mark.parametrize(
    "url",
    [
        "postgresql://u:p@db:6543/d",
        "postgres://u:p@db:6543/d",
        "postgresql+psycopg://u:p@db:6543/d",
        "postgresql+psycopg2://u:p@db:6543/d",
    ],
)
def test_every_postgres_spelling_becomes_the_psycopg2_driver(url: str) -> None:
    assert dagster_pg_url(url) == "postgresql+psycopg2://u:p@db:6543/d"


def test_a_url_that_is_not_postgres_is_a_usage_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(PG_URL_ENV, "sqlite:///var/dagster.db")
    result = CliRunner().invoke(main, [])
    assert result.exit_code == 2 and "must be a PostgreSQL URL" in result.output
    monkeypatch.setenv(PG_URL_ENV, "postgresql://u@h:1/d")
    result = CliRunner().invoke(main, [])
    assert result.exit_code == 0 and result.output == "postgresql+psycopg2://u@h:1/d\n"
