"""A seeded workspace (SQLite) per test; transforms registered by the tests themselves."""

import pytest
from support.workspaces import make_workspace


@pytest.fixture
def ws(tmp_path):
    workspace = make_workspace(tmp_path / "home")
    yield workspace
    workspace.close()
