"""The shipped ``dagster.postgres.yaml``, as it is, on the harness's PostgreSQL.

A Dagster instance whose run, event-log and schedule storage is one PostgreSQL database
(its ``postgres_db`` fields read from DAGSTER_PG_HOST, _PORT, _DB, _USERNAME and _PASSWORD,
the psycopg2 driver written in the file), and a relgate catalog in a second PostgreSQL
database: the snapshot job and the release job run on it end to end, and the runs,
materializations and catalog rows are read back from PostgreSQL itself.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from urllib.parse import quote

import dagster as dg
import psycopg
import pytest
import yaml
from support.postgres import _connect_kwargs, fresh_database
from support.workspaces import make_workspace

from pipelines.definitions import defs
from relgate.catalog.release_table import get_release

ROOT = Path(__file__).resolve().parents[2]
QUIET = {"console": {"config": {"log_level": "ERROR"}}}
#: dagster.postgres.yaml's ``postgres_db`` field -> the variable it reads, as documented
FIELDS = {
    "hostname": "DAGSTER_PG_HOST",
    "port": "DAGSTER_PG_PORT",
    "db_name": "DAGSTER_PG_DB",
    "username": "DAGSTER_PG_USERNAME",
    "password": "DAGSTER_PG_PASSWORD",
}


def _set_fields(monkeypatch: pytest.MonkeyPatch, url: str) -> str:
    """Point the five variables at the database ``url``; the URL Dagster should build."""
    kw = _connect_kwargs(url)
    password = kw.get("password", "")
    for field, value in (
        ("hostname", kw["host"]),
        ("port", kw["port"]),
        ("db_name", kw["dbname"]),
        ("username", kw["user"]),
        ("password", password),
    ):
        monkeypatch.setenv(FIELDS[field], str(value))
    user = f"{quote(kw['user'])}:{quote(password)}" if password else quote(kw["user"])
    return f"postgresql+psycopg2://{user}@{kw['host']}:{kw['port']}/{kw['dbname']}"


def _postgres_home(tmp_path: Path) -> Path:
    home = tmp_path / "dagster"
    home.mkdir()
    shutil.copy(ROOT / "dagster.postgres.yaml", home / "dagster.yaml")
    return home


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
    assert instance.run_coordinator.dequeue_interval_seconds == 1  # type: ignore[attr-defined]


def test_the_embedded_instance_queues_runs(tmp_path: Path) -> None:
    shutil.copy(ROOT / "dagster.yaml", tmp_path / "dagster.yaml")
    with dg.DagsterInstance.from_config(str(tmp_path)) as instance:
        _assert_queued(instance)
    for name in ("dagster.yaml", "dagster.postgres.yaml"):  # no first-visit dialog
        assert "nux:\n  enabled: false" in (ROOT / name).read_text()


def test_the_instance_file_reads_its_connection_from_the_documented_variables() -> None:
    storage = yaml.safe_load((ROOT / "dagster.postgres.yaml").read_text())["storage"]
    db = storage["postgres"]["postgres_db"]
    assert db.pop("scheme") == "postgresql+psycopg2"  # the driver Dagster's NOTIFY needs
    assert db == {field: {"env": var} for field, var in FIELDS.items()}
    for doc in ("docs/dagster.md", "README.md", "Makefile"):
        text = (ROOT / doc).read_text()
        assert "DAGSTER_PG_URL" not in text, doc
        assert "DAGSTER_PG_HOST" in text, doc
    section = (ROOT / "docs/dagster.md").read_text().split("## On PostgreSQL")[1].split("\n## ")[0]
    assert [var for var in FIELDS.values() if var not in section] == []


@pytest.mark.parametrize("missing", list(FIELDS.values()))
def test_an_unset_variable_is_named_before_any_connection(
    missing: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # port 9 (discard) on loopback: nothing would answer, so an error naming the variable
    # can only come from the configuration, before Dagster connects
    _set_fields(monkeypatch, "postgresql://nobody@127.0.0.1:9/nothing")
    monkeypatch.delenv(missing)
    with pytest.raises(Exception, match=f'environment variable "{missing}" which is not set'):
        dg.DagsterInstance.from_config(str(_postgres_home(tmp_path)))


@pytest.mark.postgres
def test_snapshot_and_release_jobs_on_a_postgres_instance_and_catalog(
    pg_dsn: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with fresh_database(pg_dsn) as dagster_db, fresh_database(pg_dsn) as catalog_db:
        home = tmp_path / "relgate"
        make_workspace(home, catalog_db).close()
        monkeypatch.setenv("DAGSTER_HOME", str(_postgres_home(tmp_path)))
        monkeypatch.setenv("RELGATE_HOME", str(home))
        expected_url = _set_fields(monkeypatch, dagster_db)
        with dg.DagsterInstance.get() as instance:
            assert type(instance.run_storage).__name__ == "PostgresRunStorage"
            assert getattr(instance.run_storage, "postgres_url", None) == expected_url
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
