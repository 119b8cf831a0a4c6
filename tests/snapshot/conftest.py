"""A seeded workspace per test: local versioned store, catalog on ``db_url`` (SQLite by
default; PostgreSQL where a test asks for the parametrized fixture)."""

import pytest

from relgate.demo.corpus import seed_demo
from relgate.snapshot.transforms import tag_transform
from relgate.workspace import Workspace, default_config


def make_workspace(home, db_url=None, *, seed=True):
    config = default_config(home)
    if db_url:
        config["catalog"]["url"] = db_url
    ws = Workspace.init(home, config)
    for tag in ("registry.local/normalize:v1", "registry.local/identity:v1"):
        tag_transform(ws.db, tag)
    if seed:
        seed_demo(ws, tickets=120, forum_objects=3, per_object=20, chat_events=60)
    return ws


@pytest.fixture
def ws(tmp_path, db_url):
    workspace = make_workspace(tmp_path / "home", db_url)
    yield workspace
    workspace.close()
