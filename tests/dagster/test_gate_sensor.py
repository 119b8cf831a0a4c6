"""The gate observed: a change made outside Dagster shows on the alias and permit assets
at the next tick of ``gate_state_sensor``.

Real workspace, real command line (``relgate alias rollback`` through click), the sensor
evaluated on a Dagster instance the way the daemon does, its observations stored in that
instance (what the asset pages show).
"""

from __future__ import annotations

from typing import Any

import dagster as dg
import pytest
from click.testing import CliRunner
from support.instances import dagster_instance
from support.runs import create_run
from support.snapshots import build_active, build_validated
from support.workspaces import make_workspace

from relgate.cli.main import main
from relgate.release.publication import approve_release, publish
from relgate.release.verify.verifier import verify_release
from relgate.release.writer import write_release
from relgate.runs.run_end import cancel_run
from relgate.snapshot import activation as lifecycle
from relgate.workspace import Workspace
from resources.relgate import RelgateResource
from sensors.gate_sensor import gate_state_sensor

PURPOSE = "demo-model-training"


@pytest.fixture
def ws(tmp_path) -> Workspace:
    return make_workspace(tmp_path / "home")


def _tick(instance: dg.DagsterInstance, home: str, cursor: str | None) -> Any:
    """One evaluation, as the daemon runs it; its observations go into the instance."""
    resources = {"relgate": RelgateResource(home=home)}
    with dg.build_sensor_context(instance=instance, resources=resources, cursor=cursor) as ctx:
        result = gate_state_sensor(ctx)
    if isinstance(result, dg.SensorResult):
        for event in result.asset_events:
            instance.report_runless_asset_event(event)
    return result


def _latest(instance: dg.DagsterInstance, key: str) -> dict[str, Any]:
    record = instance.fetch_observations(dg.AssetKey(key), limit=1).records[0]
    observation = record.asset_observation
    assert observation is not None
    return {k: v.value for k, v in observation.metadata.items()}


def _published(ws: Workspace, snapshot_digest: str) -> str:
    root = write_release(ws, snapshot_digest, records_per_shard=60, actor="t").digest
    assert verify_release(ws, root, workers=1, actor="t").ok
    approve_release(ws, root, approver="dana")
    publish(ws, root, alias="train", actor="dana")
    return root


def test_a_command_line_rollback_shows_on_the_alias_asset_at_the_next_tick(ws) -> None:
    home = str(ws.home)
    first = build_active(ws)
    second = build_validated(ws)
    lifecycle.approve(ws, second.digest, approver="alice")
    lifecycle.activate(ws, second.digest, alias="default", actor="alice")
    root = _published(ws, second.digest)
    run = create_run(ws, alias="train", purpose=PURPOSE, world_size=1, actor="sched")
    with dagster_instance() as instance:
        ticked = _tick(instance, home, None)
        assert isinstance(ticked, dg.SensorResult)
        seen = _latest(instance, "snapshot_alias")
        assert (seen["generation.default"], seen["activeDigest.default"]) == (2, second.digest)
        assert seen["source"] == "gate"
        permits = _latest(instance, "gate_permit")
        assert (permits["openPermits"], permits["liveRuns"]) == (1, 1)
        assert [r.data["root"] for r in permits["permits"].records] == [root]
        assert [r.data["runId"] for r in permits["runs"].records] == [run["runId"]]
        assert _latest(instance, "release_alias")["activeDigest.train"] == root
        # nothing changed: no new observation
        assert isinstance(_tick(instance, home, ticked.cursor), dg.SkipReason)

        rolled = CliRunner().invoke(
            main, ["--home", home, "alias", "rollback", "default", "--to", first.digest, "--json"]
        )
        assert rolled.exit_code == 0, rolled.output
        cancel_run(ws, run["runId"], actor="sched")
        again = _tick(instance, home, ticked.cursor)
        assert isinstance(again, dg.SensorResult) and again.cursor != ticked.cursor
        seen = _latest(instance, "snapshot_alias")
        assert (seen["generation.default"], seen["activeDigest.default"]) == (3, first.digest)
        permits = _latest(instance, "gate_permit")
        assert (permits["openPermits"], permits["liveRuns"]) == (0, 0)
