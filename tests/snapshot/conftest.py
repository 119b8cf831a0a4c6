"""A seeded workspace per test (see :mod:`support.workspaces`); PostgreSQL where a test asks
for the parametrized ``db_url`` fixture."""

import pytest
from support.workspaces import make_workspace


@pytest.fixture
def ws(tmp_path, db_url):
    workspace = make_workspace(tmp_path / "home", db_url)
    yield workspace
    workspace.close()
