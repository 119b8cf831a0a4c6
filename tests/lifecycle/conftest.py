"""A seeded workspace with one validated snapshot and one staged release per test, on
SQLite and PostgreSQL (``db_url``), with the local versioned object store."""

import pytest
from support.lifecycle import release_of
from support.snapshots import build_approved
from support.workspaces import make_workspace


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
