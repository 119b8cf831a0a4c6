"""A demo instance for the UI test: the demo's snapshot and release runs (launched through
workspace.yaml and the run queue, as ``make demo`` launches them), then an INVALID
release (one shard byte flipped after writing) whose blocking checks fail.

Everything lands in a persistent SQLite Dagster instance under ``dagster_home`` and a
workspace under ``relgate_home``, as ``make demo`` leaves them, for ``dagster-webserver``
to serve.
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
from support.releases import overwrite_in_place, shard_path
from support.workspaces import make_workspace

from pipelines import demo
from pipelines.definitions import defs
from pipelines.launch import CodeLocationRuns
from relgate.catalog.release_table import get_release
from relgate.documents import release_root as rm
from relgate.gate.transitions import open_gate
from relgate.workspace import Workspace

ROOT = Path(__file__).resolve().parents[2]


@dataclass(frozen=True)
class UiInstance:
    #: the first published release (generation 1), the second (generation 2, active)
    first_root: str
    published_root: str
    invalid_root: str
    run_id: str


def _flip_one_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    overwrite_in_place(path, bytes(data))


def build(relgate_home: Path, dagster_home: Path) -> UiInstance:
    """Seed, run the demo's snapshot and release jobs, then write and verify a tampered
    release.  ``RELGATE_HOME`` must already point at ``relgate_home``."""
    make_workspace(relgate_home).close()
    dagster_home.mkdir(parents=True, exist_ok=True)
    shutil.copy(ROOT / "dagster.yaml", dagster_home / "dagster.yaml")
    ws = Workspace.init(relgate_home)
    purpose = str(ws.config["snapshot"]["purpose"])
    with (
        dg.DagsterInstance.from_config(str(dagster_home)) as instance,
        CodeLocationRuns(instance) as runs,
    ):
        assert demo.snapshots(runs) and demo.releases(runs, purpose)
        first = open_gate(ws).alias("default-release", "release").active_digest
        # a second release (other shard sizes: another root) at generation 2, so the alias
        # has a generation to roll back to
        assert demo.releases(runs, purpose, records_per_shard=100)
        published = open_gate(ws).alias("default-release", "release").active_digest
        assert first is not None and published != first
        run = instance.get_latest_materialization_event(dg.AssetKey("pinned_run"))
        assert published is not None and run is not None
        run_id = str(run.asset_materialization.metadata["runId"].value)
        job = defs.resolve_job_def("release_job")
        quiet = {"loggers": demo.QUIET}
        written = job.execute_in_process(
            instance=instance,
            asset_selection=[dg.AssetKey("shard_release")],
            run_config={**quiet, "ops": {"shard_release": {"config": {"records_per_shard": 150}}}},
        )
        invalid = str(written.output_for_node("shard_release"))
        manifest = rm.load(
            ws.store, ws.trusted_keys, invalid, get_release(ws.db, invalid).envelope_version
        )
        _flip_one_byte(shard_path(ws, rm.wire_shards(manifest.document())[1]))
        verified = job.execute_in_process(
            instance=instance,
            asset_selection=[dg.AssetKey("release_verification")],
            run_config=quiet,
            raise_on_error=False,
        )
        assert not verified.success
    assert get_release(ws.db, invalid).state == "INVALID"
    ws.close()
    return UiInstance(
        first_root=first, published_root=published, invalid_root=invalid, run_id=run_id
    )
