"""The Dagster layer on a read-only mount of an initialised workspace.

docs/deploy.md mounts the workspace (``relgate.json`` and keys) read-only into every run
and step pod; its objects are on S3 and its catalog on PostgreSQL.  Here the workspace
directory is bind-mounted read-only onto itself (a real mount: any write fails with
EROFS), its objects are in moto's S3 server and its catalog in the harness's PostgreSQL.
The snapshot and release jobs, their checks and the fence sensors run through the
resource, which only opens the workspace; the gate records the run's launcher.
"""

from __future__ import annotations

import errno
import os
import stat
import subprocess
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import dagster as dg
import pytest
from support.instances import dagster_instance
from support.moto_s3 import DUMMY_AWS_ENV
from support.postgres import fresh_database
from support.workspaces import make_workspace, s3_workspace

from pipelines.definitions import defs
from relgate.catalog.snapshot_table import get_snapshot
from relgate.catalog.states import history
from relgate.errors import RejectedError
from relgate.gate.transitions import open_gate
from relgate.workspace import CACHE_ENV, Workspace
from resources.relgate import RelgateResource, run_actor
from sensors.fence_sensors import tombstone_fence_sensor

SNAPSHOT_OPS = {"snapshot_alias": {"config": {"alias": "default", "approver": "carol"}}}
RELEASE_OPS = {
    "shard_release": {"config": {"records_per_shard": 60}},
    "release_alias": {"config": {"alias": "default-release", "approver": "dana"}},
    "gate_permit": {
        "config": {"alias": "default-release", "purpose": "demo-model-training", "world_size": 1}
    },
}


@contextmanager
def read_only(path: Path) -> Iterator[None]:
    """``path`` bind-mounted read-only onto itself, unmounted afterwards."""
    subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    try:
        subprocess.run(["mount", "-o", "remount,bind,ro", str(path)], check=True)
        yield
    finally:
        # lazily when still busy (a handle the interpreter has not released yet): the mount
        # leaves the namespace now either way
        if subprocess.run(["umount", str(path)], check=False).returncode != 0:
            subprocess.run(["umount", "--lazy", str(path)], check=True)


def _tree(home: Path) -> dict[str, tuple[int, int]]:
    return {
        str(p.relative_to(home)): (p.stat().st_size, p.stat().st_mtime_ns)
        for p in sorted(home.rglob("*"))
    }


@pytest.mark.postgres
@pytest.mark.s3
def test_jobs_checks_and_sensors_run_on_a_read_only_workspace(
    pg_dsn: str, moto_s3_endpoint: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    home = tmp_path / "relgate"
    for name, value in {"RELGATE_HOME": str(home), **DUMMY_AWS_ENV}.items():
        monkeypatch.setenv(name, value)
    with fresh_database(pg_dsn) as catalog:
        s3_workspace(home, catalog, moto_s3_endpoint).close()
        before = _tree(home)
        with read_only(home), dagster_instance() as instance:
            with pytest.raises(OSError) as probe:
                (home / "probe").write_text("x")
            assert probe.value.errno == errno.EROFS
            snap = defs.resolve_job_def("snapshot_release_job").execute_in_process(
                instance=instance,
                run_config={"ops": SNAPSHOT_OPS},
                tags={"dagster/user": "alice@example.com"},
            )
            assert snap.success
            assert all(c.passed for c in snap.get_asset_check_evaluations())
            release = defs.resolve_job_def("release_job").execute_in_process(
                instance=instance, run_config={"ops": RELEASE_OPS}
            )
            assert release.success
            assert all(c.passed for c in release.get_asset_check_evaluations())
            resources = {"relgate": RelgateResource()}
            with dg.build_sensor_context(instance=instance, resources=resources) as ctx:
                assert isinstance(tombstone_fence_sensor(ctx), dg.SkipReason)
            ws = Workspace.open(home)
            digest = snap.output_for_node("dataset_snapshot")
            assert get_snapshot(ws.db, digest).state == "ACTIVE"
            root = release.output_for_node("shard_release")
            with ws.db.tx() as conn:
                built = history(conn, "snapshot", digest)[0]
                staged = history(conn, "release", root)[0]
            # the snapshot run's launcher built it (its approver, carol, activated it); the
            # release run named nobody, so the resource's default actor staged the root
            assert (built["to_state"], built["actor"]) == ("BUILDING", "alice@example.com")
            assert [h.actor for h in open_gate(ws).alias_history("default")] == ["carol"]
            assert (staged["to_state"], staged["actor"]) == ("STAGED", "dagster")
            ws.close()
        assert _tree(home) == before
        assert not os.path.ismount(home)


def test_the_actor_is_the_runs_launcher_then_its_automation_then_the_default() -> None:
    assert run_actor({"dagster/user": "alice", "user": "bob"}, "dagster") == "alice"
    assert run_actor({"user": "bob", "dagster/schedule_name": "nightly"}, "dagster") == "bob"
    assert run_actor({"dagster/schedule_name": "nightly"}, "dagster") == "schedule:nightly"
    assert run_actor({"dagster/sensor_name": "tombstone"}, "dagster") == "sensor:tombstone"
    assert run_actor({"dagster/user": ""}, "ops") == "ops"


def test_a_read_only_workspace_caches_in_a_private_directory(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """``$RELGATE_CACHE_DIR`` first; else ``<home>/cache`` while the workspace is writable;
    on a read-only mount a 0700 directory of this user in the temp dir, refused
    (``cache-dir``) when something else was put there first."""
    home = tmp_path / "ws"
    make_workspace(home, seed=False).close()
    temp = tmp_path / "tmp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    monkeypatch.delenv(CACHE_ENV, raising=False)
    assert Workspace.open(home).cache_dir == home / "cache"
    base = temp / f"relgate-cache-{os.getuid()}"
    with read_only(home):
        assert Workspace.open(home).cache_dir.parent == base
        assert stat.S_IMODE(base.lstat().st_mode) == 0o700
        base.rmdir()
        (tmp_path / "elsewhere").mkdir()
        base.symlink_to(tmp_path / "elsewhere")  # planted before relgate ran
        with pytest.raises(RejectedError) as planted:
            _ = Workspace.open(home).cache_dir
        assert (planted.value.check, planted.value.object) == ("cache-dir", str(base))
        base.unlink()
        base.mkdir(mode=0o777)
        base.chmod(0o777)  # open to every user
        with pytest.raises(RejectedError):
            _ = Workspace.open(home).cache_dir
    monkeypatch.setenv(CACHE_ENV, str(tmp_path / "chosen"))
    assert Workspace.open(home).cache_dir == tmp_path / "chosen"
