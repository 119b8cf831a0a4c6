"""The harness itself: each fixture yields a working, private, real resource."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import sqlalchemy as sa
from support import tmpfs
from support.postgres import _admin_execute, _connect_kwargs, fresh_database
from support.procs import kill_pid, pid_alive
from support.tmpfs import TMPDIR_ENV, fast_temp_root


def test_db_url_is_an_empty_private_database(db_url: str) -> None:
    engine = sa.create_engine(db_url)
    try:
        assert sa.inspect(engine).get_table_names() == []
        with engine.begin() as conn:
            conn.execute(sa.text("CREATE TABLE probe (id INTEGER PRIMARY KEY, v TEXT)"))
            conn.execute(sa.text("INSERT INTO probe (id, v) VALUES (1, 'x')"))
        with engine.connect() as conn:
            assert conn.execute(sa.text("SELECT v FROM probe")).scalar_one() == "x"
        if engine.dialect.name == "postgresql":
            assert engine.url.database is not None
            assert engine.url.database.startswith("relgate_t_")
            assert engine.url.drivername == "postgresql+psycopg"
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_pg_dsn_names_relgate_test_and_fresh_databases_are_dropped(pg_dsn: str) -> None:
    assert pg_dsn.startswith("postgresql+psycopg://")
    engine = sa.create_engine(pg_dsn)
    try:
        with engine.connect() as conn:
            assert (
                conn.execute(sa.text("SELECT current_database()")).scalar_one()
                == (_connect_kwargs(pg_dsn)["dbname"])
            )

        def names() -> set[str]:
            with engine.connect() as conn:
                rows = conn.execute(sa.text("SELECT datname FROM pg_database")).scalars()
                return set(rows)

        with fresh_database(pg_dsn) as url:
            name = sa.engine.make_url(url).database
            leaked = sa.create_engine(url)
            leaked.connect()  # a session left open must not block the drop
            assert name in names()
        assert name not in names()
        leaked.dispose()
    finally:
        engine.dispose()


@pytest.mark.postgres
def test_postgres_is_serializable_capable(pg_dsn: str) -> None:
    """The gate relies on SERIALIZABLE; make sure the harness server grants it."""
    engine = sa.create_engine(pg_dsn, isolation_level="SERIALIZABLE")
    try:
        with engine.connect() as conn:
            level = conn.execute(sa.text("SHOW transaction_isolation")).scalar_one()
            assert level == "serializable"
    finally:
        engine.dispose()
    _admin_execute(pg_dsn, "SELECT 1")


@pytest.mark.s3
def test_moto_endpoint_answers_with_dummy_credentials(moto_s3_endpoint: str) -> None:
    import boto3

    assert moto_s3_endpoint.startswith("http://127.0.0.1:")
    assert os.environ["AWS_ACCESS_KEY_ID"] == "relgate-test"
    client = boto3.client("s3", endpoint_url=moto_s3_endpoint)
    assert "Buckets" in client.list_buckets()


def test_kill_pid_stops_a_process_that_ignores_sigterm() -> None:
    import subprocess
    import sys

    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import signal,time; signal.signal(signal.SIGTERM, signal.SIG_IGN); print(1, flush=True); time.sleep(60)",
        ],
        stdout=subprocess.PIPE,
    )
    assert proc.stdout is not None
    proc.stdout.readline()  # SIGTERM is ignored from here on
    kill_pid(proc.pid, grace=0.2)
    assert not pid_alive(proc.pid)
    proc.wait()


def test_missing_postgres_binaries_fail_loudly(monkeypatch: pytest.MonkeyPatch) -> None:
    """CI has the binaries; a machine without them must fail, never silently skip."""
    from support import postgres

    monkeypatch.setattr(postgres, "PG_BIN_GLOB", "/nonexistent/postgresql/*/bin")
    with pytest.raises(RuntimeError, match="RELGATE_TEST_PG_DSN"):
        postgres.find_pg_bin()


def test_highest_postgres_major_is_chosen(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from support import postgres

    for major in ("9.6", "13", "15", "100-broken"):
        bin_dir = tmp_path / "postgresql" / major / "bin"
        bin_dir.mkdir(parents=True)
        for tool in ("initdb", "pg_ctl"):
            (bin_dir / tool).touch()
    monkeypatch.setattr(postgres, "PG_BIN_GLOB", str(tmp_path / "postgresql" / "*" / "bin"))
    assert postgres.find_pg_bin() == tmp_path / "postgresql" / "15" / "bin"


def _config(policy: str, basetemp: str | None = None) -> pytest.Config:
    fake = SimpleNamespace(option=SimpleNamespace(basetemp=basetemp), getini=lambda _name: policy)
    return fake  # type: ignore[return-value]  # the two attributes fast_temp_root reads


def test_tmpfs_only_when_passed_tests_are_cleaned_and_never_over_explicit_choices(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv(TMPDIR_ENV, raising=False)
    monkeypatch.delenv("PYTEST_DEBUG_TEMPROOT", raising=False)
    shm = tmp_path / "shm"
    shm.mkdir()
    monkeypatch.setattr(tmpfs, "DEFAULT_TMPFS", shm)
    monkeypatch.setattr(tmpfs, "MIN_FREE_BYTES", 0)
    assert fast_temp_root(_config("failed")) == shm
    assert fast_temp_root(_config("all")) is None  # every run's files kept: not in RAM
    assert fast_temp_root(_config("failed", basetemp=str(tmp_path))) is None
    monkeypatch.setattr(tmpfs, "MIN_FREE_BYTES", 1 << 62)
    assert fast_temp_root(_config("failed")) is None  # too little room
    monkeypatch.setattr(tmpfs, "DEFAULT_TMPFS", tmp_path / "absent")
    monkeypatch.setattr(tmpfs, "MIN_FREE_BYTES", 0)
    assert fast_temp_root(_config("failed")) is None
    monkeypatch.setenv(TMPDIR_ENV, str(tmp_path))
    assert fast_temp_root(_config("all")) == tmp_path  # an explicit directory always wins
    monkeypatch.setenv(TMPDIR_ENV, "disk")
    assert fast_temp_root(_config("failed")) is None
    monkeypatch.setenv(TMPDIR_ENV, str(tmp_path))
    monkeypatch.setenv("PYTEST_DEBUG_TEMPROOT", str(tmp_path))
    assert fast_temp_root(_config("failed")) is None
