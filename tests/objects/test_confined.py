"""The local store never follows a link or leaves its directory (issue 28, item 9).

Links are planted for real (a key directory, a version directory, a ``data`` file, each
pointing outside the store): listing skips and reports them, reads and deletes refuse them
(``store-symlink``, exit 3), and nothing outside is read, deleted or marked ``purged``;
``gc sweep`` over a workspace with a planted link leaves the outside files as they were.
"""

import os
from pathlib import Path

import pytest
from support.workspaces import make_workspace

from relgate.errors import IntegrityError, NotFoundError
from relgate.lifecycle.collector import sweep
from relgate.objects.cas import key_for
from relgate.objects.local import PLANTED_LINK, LocalObjectStore

OUTSIDE_BYTES = b"outside the store"


def _outside(tmp_path: Path) -> Path:
    """A key-directory look-alike outside the store: <seq>/data."""
    victim = tmp_path / "outside" / "key"
    (victim / "000000000001").mkdir(parents=True)
    (victim / "000000000001" / "data").write_bytes(OUTSIDE_BYTES)
    return victim


def _untouched(victim: Path) -> None:
    assert (victim / "000000000001" / "data").read_bytes() == OUTSIDE_BYTES
    assert not (victim / "000000000001" / "purged").exists()
    assert sorted(p.name for p in (victim / "000000000001").iterdir()) == ["data"]


def _refused(call, relpath: str) -> None:
    with pytest.raises(IntegrityError) as info:
        call()
    assert (info.value.check, info.value.exit_code) == (PLANTED_LINK, 3)
    assert info.value.details["path"] == relpath


def test_a_planted_key_directory_link_is_reported_not_followed(tmp_path):
    store = LocalObjectStore(tmp_path / "store")
    victim = _outside(tmp_path)
    kept = store.put("cas/sha256/kept", b"kept")
    os.symlink(victim, store.root / "keys" / "cas%2Fsha256%2Fplanted")

    assert [v.key for v in store.list_versions("cas/")] == [kept.key]
    assert [v.key for v in store.list("")] == [kept.key]
    assert store.planted == ["keys/cas%2Fsha256%2Fplanted"]
    where = "keys/cas%2Fsha256%2Fplanted"
    _refused(lambda: store.delete_version("cas/sha256/planted", "000000000001"), where)
    _refused(lambda: store.get("cas/sha256/planted", "000000000001"), where)
    _refused(lambda: store.head("cas/sha256/planted", "000000000001"), where)
    _refused(lambda: store.put("cas/sha256/planted", b"new"), where)
    _untouched(victim)


def test_planted_version_and_data_links_are_reported_not_followed(tmp_path):
    store = LocalObjectStore(tmp_path / "store")
    victim = _outside(tmp_path)
    first = store.put("a", b"one")
    second = store.put("a", b"two")
    key_dir = store.root / "keys" / "a"
    # the newer version's data becomes a link out; a third version is a linked directory
    data = key_dir / second.version_id / "data"
    data.unlink()
    os.symlink(victim / "000000000001" / "data", data)
    os.symlink(victim / "000000000001", key_dir / "000000000003")

    assert [(v.version_id, v.size) for v in store.list_versions("a")] == [(first.version_id, 3)]
    assert sorted(store.planted) == [
        f"keys/a/{second.version_id}/data",
        "keys/a/000000000003",
    ]
    _refused(
        lambda: store.get("a", second.version_id, max_size=100),
        f"keys/a/{second.version_id}/data",
    )
    _refused(
        lambda: store.delete_version("a", second.version_id), f"keys/a/{second.version_id}/data"
    )
    _refused(lambda: store.delete_version("a", "000000000003"), "keys/a/000000000003")
    _refused(lambda: store.local_path("a", "000000000003"), "keys/a/000000000003")
    assert store.get("a", first.version_id) == b"one"
    store.delete_version("a", first.version_id)  # a real version is still purged
    with pytest.raises(NotFoundError):
        store.get("a", first.version_id)
    _untouched(victim)


def test_a_fifo_planted_as_data_is_refused_without_blocking(tmp_path):
    store = LocalObjectStore(tmp_path / "store")
    version = store.put("f", b"bytes")
    data = store.root / "keys" / "f" / version.version_id / "data"
    data.unlink()
    os.mkfifo(data)
    _refused(lambda: store.get("f", version.version_id), f"keys/f/{version.version_id}/data")
    assert list(store.list_versions("f")) == []


def test_gc_sweep_never_follows_a_link_out_of_the_store(tmp_path):
    ws = make_workspace(tmp_path / "home", seed=False)
    victim = _outside(tmp_path)
    orphan = ws.store.put(key_for("sha256:" + "a" * 64), b"orphan")
    name = "cas%2Fsha256%2F" + "b" * 64
    os.symlink(victim, ws.store.root / "keys" / name)
    result = sweep(ws, actor="t", grace_seconds=0)
    _untouched(victim)
    assert f"keys/{name}" in ws.store.planted
    assert all(d.key != key_for("sha256:" + "b" * 64) for d in result.deleted), result
    assert orphan.key  # the real orphan is the collector's business, not this test's
    ws.close()
