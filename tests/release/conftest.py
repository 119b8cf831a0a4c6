"""A seeded workspace with a validated snapshot per test (SQLite and PostgreSQL)."""

import pytest
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
