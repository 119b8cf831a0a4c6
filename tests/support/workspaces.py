"""Seeded workspaces: a local versioned store with its catalog on ``db_url`` (SQLite by
default), or the production shape: objects in an S3 bucket, the catalog on PostgreSQL."""

from __future__ import annotations

import uuid
from pathlib import Path

from relgate.demo.corpus import seed_demo
from relgate.objects.s3 import S3ObjectStore
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


def s3_workspace(home: Path, catalog: str, endpoint: str) -> Workspace:
    """A seeded workspace whose objects are in a fresh versioned bucket (moto's S3 server at
    ``endpoint``) and whose catalog is ``catalog``: nothing it stores lives under ``home``."""
    bucket = f"relgate-ws-{uuid.uuid4().hex[:20]}"
    S3ObjectStore(bucket, endpoint_url=endpoint).ensure_bucket()
    config = default_config(home)
    config["catalog"]["url"] = catalog
    config["objectStore"] = {"kind": "s3", "bucket": bucket, "endpointUrl": endpoint}
    ws = Workspace.init(home, config)
    for tag in TRANSFORM_TAGS:
        tag_transform(ws.db, tag)
    seed_demo(ws, tickets=120, forum_objects=3, per_object=20, chat_events=60)
    return ws
