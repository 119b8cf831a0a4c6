"""Session fixtures: real services for the whole suite, fresh resources per test.

============== ========= ===========================================================
fixture        scope     yields
============== ========= ===========================================================
aws_test_env   session   dummy AWS credentials in ``os.environ`` (undone at the end)
moto_s3_endpoint session ``http://127.0.0.1:<port>`` of a ``moto_server`` subprocess
moto_s3_client session   a boto3 S3 client for that endpoint (standard retries)
pg_dsn         session   SQLAlchemy URL of database ``relgate_test``: from
                         ``RELGATE_TEST_PG_DSN`` or a PostgreSQL started from the
                         installed Debian binaries
db_url         function  ``sqlite:///<tmp>/catalog.db`` or a fresh Postgres database
                         (``relgate_t_<hex>``, dropped afterwards); param ``postgres``
                         is marked ``postgres``
object_store   function  LocalObjectStore on tmp_path, or S3ObjectStore on a fresh
                         versioned bucket in moto; param ``s3`` is marked ``s3``
============== ========= ===========================================================

Every service is started as a subprocess and stopped by PID in the fixture's finalizer,
whether the tests passed or not.  Services start lazily: a run that deselects
``-m "not postgres"`` never starts PostgreSQL.

Temporary files go to a tmpfs (see :mod:`support.tmpfs`) when one is there and pytest
removes passed tests' directories (``tmp_path_retention_policy = "failed"``): the catalog
commits and the object store's fsyncs then cost nothing, and the code paths are the same.
"""

from __future__ import annotations

import os
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

# The harness is imported as the top-level package ``harness`` (tests/ on sys.path), also
# by the processes the race tests spawn, which inherit this sys.path.
_TESTS_DIR = str(Path(__file__).resolve().parent)
if _TESTS_DIR not in sys.path:
    sys.path.insert(0, _TESTS_DIR)

from support.moto_s3 import DUMMY_AWS_ENV, DUMMY_AWS_UNSET, MotoServer  # noqa: E402 - after sys.path
from support.postgres import (  # noqa: E402 - after sys.path
    PG_DSN_ENV,
    PostgresServer,
    fresh_database,
    sqlalchemy_url,
)
from support.tmpfs import use_fast_temp_root  # noqa: E402 - after sys.path

from relgate.objects.local import LocalObjectStore  # noqa: E402 - after sys.path
from relgate.objects.s3 import S3ObjectStore  # noqa: E402 - after sys.path
from relgate.objects.versioned import ObjectStore  # noqa: E402 - after sys.path

if TYPE_CHECKING:
    from mypy_boto3_s3.client import S3Client


def pytest_configure(config: pytest.Config) -> None:
    use_fast_temp_root(config)


@pytest.fixture(scope="session")
def aws_test_env() -> Iterator[None]:
    """Dummy credentials for the session, so boto3 never finds real ones."""
    mp = pytest.MonkeyPatch()
    try:
        for name in DUMMY_AWS_UNSET:
            mp.delenv(name, raising=False)
        for name, value in DUMMY_AWS_ENV.items():
            mp.setenv(name, value)
        yield
    finally:
        mp.undo()


@pytest.fixture(scope="session")
def moto_s3_endpoint(aws_test_env: None) -> Iterator[str]:
    server = MotoServer()
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(scope="session")
def moto_s3_client(moto_s3_endpoint: str) -> S3Client:
    """One boto3 client for the session: building a client costs more than most tests."""
    return S3ObjectStore("unused", endpoint_url=moto_s3_endpoint).client


@pytest.fixture(scope="session")
def pg_dsn() -> Iterator[str]:
    external = os.environ.get(PG_DSN_ENV)
    if external:
        yield sqlalchemy_url(external)
        return
    server = PostgresServer()  # fails loudly if no binaries are installed: never skips
    try:
        yield server.start()
    finally:
        server.stop()


@pytest.fixture(
    params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)],
)
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[str]:
    """A SQLAlchemy URL of an empty catalog database, private to this test."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'catalog.db'}"
        return
    server_url: str = request.getfixturevalue("pg_dsn")
    with fresh_database(server_url) as url:
        yield url


@pytest.fixture(
    params=["local", pytest.param("s3", marks=pytest.mark.s3)],
)
def object_store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[ObjectStore]:
    """An empty versioned object store, private to this test."""
    if request.param == "local":
        yield LocalObjectStore(tmp_path / "objects")
        return
    endpoint: str = request.getfixturevalue("moto_s3_endpoint")
    store = S3ObjectStore(
        f"relgate-t-{uuid.uuid4().hex[:24]}",
        endpoint_url=endpoint,
        client=request.getfixturevalue("moto_s3_client"),
    )
    store.ensure_bucket()
    try:
        yield store
    finally:
        store.destroy_bucket()
