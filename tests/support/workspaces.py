"""A seeded workspace: local versioned store, catalog on ``db_url`` (SQLite by default)."""

from __future__ import annotations

from pathlib import Path

from relgate.demo.corpus import seed_demo
from relgate.snapshot.transform_tags import tag_transform
from relgate.workspace import Workspace, default_config

#: The transform tags every test workspace starts with.
TRANSFORM_TAGS = ("registry.local/normalize:v1", "registry.local/identity:v1")


def make_workspace(home: Path, db_url: str | None = None, *, seed: bool = True) -> Workspace:
    config = default_config(home)
    if db_url:
        config["catalog"]["url"] = db_url
    ws = Workspace.init(home, config)
    for tag in TRANSFORM_TAGS:
        tag_transform(ws.db, tag)
    if seed:
        seed_demo(ws, tickets=120, forum_objects=3, per_object=20, chat_events=60)
    return ws
