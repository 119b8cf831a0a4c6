"""The retention plan asset and the GC job (dry run by default) on a temp instance."""

import dagster as dg
from support.lifecycle import release_of, set_state, stored_set
from support.snapshots import build_approved
from support.workspaces import make_workspace

from assets.lifecycle import gc_job, retention_plan
from pipelines.definitions import defs
from relgate.documents import release_root as rm
from relgate.lifecycle.collector import verify_retained
from resources.relgate import RelgateResource


def test_plan_asset_and_gc_job_dry_run_then_sweep(tmp_path):
    ws = make_workspace(tmp_path / "home")
    release = release_of(ws, build_approved(ws).digest)
    set_state(ws, "release", release.digest, "INVALID")
    home = str(ws.home)
    resources = {"relgate": RelgateResource(home=home)}
    assert defs.resolve_schedule_def("weekly_gc_plan").job_name == "gc_job"
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [retention_plan],
            instance=instance,
            resources=resources,
            run_config={"ops": {"retention_plan": {"config": {"grace": "0s"}}}},
        )
        assert result.success
        plan = result.output_for_node("retention_plan")
        assert plan["candidateCount"] >= len(rm.wire_shards(release.document()))
        (mat,) = result.asset_materializations_for_node("retention_plan")
        excluded = {r.data["reason"]: r.data["objects"] for r in mat.metadata["excluded"].records}
        assert excluded == plan["excluded"]
        assert mat.metadata["excludedObjects"].value == sum(plan["excluded"].values())
        assert mat.metadata["unknownOutcome"].value == len(plan["unknownOutcome"])
        # Issue 28: what names keep, the audit trail kept, tombstoned versions still held.
        assert mat.metadata["auditObjects"].value == plan["auditObjects"] > 0
        assert mat.metadata["auditPolicyDays"].value == "forever"
        kept = {r.data["digest"] for r in mat.metadata["auditKept"].records}
        assert release.digest in kept
        assert len(mat.metadata["named"].records) == len(plan["named"])
        assert mat.metadata["erasureHeld"].records == []
        before = stored_set(ws)
        dry = gc_job.execute_in_process(
            instance=instance,
            resources=resources,
            run_config={"ops": {"garbage_collect": {"config": {"grace": "0s"}}}},
        )
        assert dry.success and dry.output_for_node("garbage_collect")["mode"] == "plan"
        assert stored_set(ws) == before  # the default deletes nothing
        swept = gc_job.execute_in_process(
            instance=instance,
            resources=resources,
            run_config={"ops": {"garbage_collect": {"config": {"grace": "0s", "sweep": True}}}},
        )
        assert swept.success
        assert swept.output_for_node("garbage_collect")["deletedCount"] >= len(
            rm.wire_shards(release.document())
        )
        verify_retained(ws)
    ws.close()
