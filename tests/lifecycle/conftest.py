"""A seeded workspace with one validated snapshot and one staged release per test, on
SQLite and PostgreSQL (``db_url``), with the local versioned object store."""

import pytest

from tests.lifecycle.helpers import release_of
from tests.snapshot.conftest import make_workspace
from tests.snapshot.helpers import build_approved


@pytest.fixture
def ws(tmp_path, db_url):
    workspace = make_workspace(tmp_path / "home", db_url)
    yield workspace
    workspace.close()


@pytest.fixture
def snapshot(ws):
    return build_approved(ws)


@pytest.fixture
def release(ws, snapshot):
    return release_of(ws, snapshot.digest)
