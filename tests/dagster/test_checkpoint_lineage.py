"""A checkpoint's lineage runs from the training run it declares and that run's exact root.

Real workspace: a snapshot activated, a release written, verified and published, a run
admitted on it; then ``checkpoint_manifest`` materialized with ``trained_on_run``.
"""

from __future__ import annotations

import dagster as dg
from support.instances import dagster_instance
from support.runs import create_run
from support.snapshots import build_active
from support.workspaces import make_workspace

from assets.checkpoints import checkpoint_assets
from pipelines.definitions import defs
from relgate.release.publication import approve_release, publish
from relgate.release.verify.verifier import verify_release
from relgate.release.writer import write_release
from resources.fleet import FleetResource
from resources.relgate import RelgateResource


def _materialize(home: str, instance: dg.DagsterInstance, run: str) -> dg.ExecuteInProcessResult:
    config = {"trained_on_run": run, "demo_megabytes": 2, "chunk_mb": 1, "block_mb": 1}
    return dg.materialize(
        checkpoint_assets,
        instance=instance,
        resources={
            "relgate": RelgateResource(home=home),
            "pipes_subprocess_client": dg.PipesSubprocessClient(),
            "fleet": FleetResource(),  # the embedded local fleet
        },
        run_config={"ops": {"checkpoint_manifest": {"config": config}}},
        selection=dg.AssetSelection.assets("checkpoint_manifest"),
        raise_on_error=False,
    )


def test_a_checkpoint_names_the_run_and_root_it_was_trained_on(tmp_path) -> None:
    ws = make_workspace(tmp_path / "home")
    snapshot = build_active(ws)
    root = write_release(ws, snapshot.digest, records_per_shard=60, actor="t").digest
    assert verify_release(ws, root, workers=1, actor="t").ok
    approve_release(ws, root, approver="dana")
    publish(ws, root, alias="train", actor="dana")
    run = create_run(ws, alias="train", purpose="demo-model-training", world_size=1, actor="s")
    home = str(ws.home)
    graph = defs.resolve_asset_graph()
    assert dg.AssetKey("pinned_run") in graph.get(dg.AssetKey("checkpoint_manifest")).parent_keys
    with dagster_instance() as instance:
        result = _materialize(home, instance, run["runId"])
        assert result.success
        event = instance.get_latest_materialization_event(dg.AssetKey("checkpoint_manifest"))
        meta = {k: v.value for k, v in event.asset_materialization.metadata.items()}
        assert (meta["trainedOnRun"], meta["trainedOnRoot"]) == (run["runId"], root)
        assert meta["trainedOnAlias"] == "train"
        # a run the catalog does not know is refused by name, and nothing is published
        unknown = _materialize(home, instance, "run-000000000000")
        assert not unknown.success
        (failure,) = [e for e in unknown.all_events if e.is_step_failure]
        shown = failure.step_failure_data.user_failure_data
        assert shown is not None and shown.metadata["object"].value == "run-000000000000"
