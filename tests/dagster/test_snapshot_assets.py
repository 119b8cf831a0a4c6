"""End to end through Dagster: materialize on a temp instance, then the fence sensors."""

import json

import dagster as dg
import pytest
from support.instances import dagster_instance
from support.workspaces import make_workspace

from assets.fence_checks import FENCE_CHECK, fence_checks, snapshot_fence_hits
from assets.snapshots import snapshot_assets, snapshot_checks
from assets.table_metadata import COLUMN_SCHEMA
from assets.versions import snapshot_version
from pipelines.definitions import defs
from pipelines.jobs import recheck_job
from relgate.catalog.snapshot_table import get_snapshot
from relgate.gate.transitions import open_gate
from relgate.snapshot import activation as lifecycle
from relgate.snapshot.diff import load_manifest
from relgate.snapshot.provenance import verify_provenance
from relgate.sources.cdc import append_segment
from resources.relgate import RelgateResource
from sensors.fence_sensors import benchmark_fence_sensor, tombstone_fence_sensor


@pytest.fixture
def home(tmp_path):
    ws = make_workspace(tmp_path / "home")
    ws.close()
    return str(tmp_path / "home")


def _materialize(home, instance, approver="carol"):
    return dg.materialize(
        [*snapshot_assets, *snapshot_checks],
        instance=instance,
        resources={"relgate": RelgateResource(home=home)},
        run_config={
            "ops": {"snapshot_alias": {"config": {"alias": "default", "approver": approver}}}
        },
    )


def test_definitions_load():
    defs.resolve_all_job_defs()
    assert defs.resolve_sensor_def("tombstone_fence_sensor").job_name == "recheck_job"
    assert defs.resolve_sensor_def("benchmark_fence_sensor").job_name == "recheck_job"
    assert defs.resolve_schedule_def("nightly_snapshot").cron_schedule == "0 2 * * *"


def test_materialize_snapshot_to_alias(home):
    with dagster_instance() as instance:
        result = _materialize(home, instance)
        assert result.success
        digest = result.output_for_node("dataset_snapshot")
        alias = result.output_for_node("snapshot_alias")
        assert alias["activeDigest"] == digest and alias["generation"] == 1
        checks = {
            (c.asset_key.path[-1], c.partition, c.check_name): c.passed
            for c in result.get_asset_check_evaluations()
        }
        # the pipeline's check, and the same validation (and the fence check) on the
        # digest's own partition of snapshot_version
        assert checks == {
            ("dataset_snapshot", None, "snapshot_validation"): True,
            ("snapshot_version", digest, "snapshot_validation"): True,
            ("snapshot_version", digest, FENCE_CHECK): True,
        }
        assert digest in instance.get_dynamic_partitions("snapshot_digest")
        # materializing the digest's partition (from the UI) re-validates that version
        version = dg.materialize(
            [snapshot_version],
            instance=instance,
            partition_key=digest,
            resources={"relgate": RelgateResource(home=home)},
        )
        assert version.success
        (record,) = version.get_asset_materialization_events()
        assert record.partition == digest
        assert record.materialization.metadata["state"].value == "ACTIVE"
        assert {(c.check_name, c.passed) for c in version.get_asset_check_evaluations()} == {
            ("snapshot_validation", True),
            (FENCE_CHECK, True),
        }
        mat = instance.get_latest_materialization_event(dg.AssetKey("dataset_snapshot"))
        assert mat.asset_materialization.tags["dagster/data_version"] == digest
        ws = RelgateResource(home=home).workspace()
        meta = mat.asset_materialization.metadata
        provenance = verify_provenance(ws, digest)
        assert meta["provenanceDigest"].value == provenance.statement_digest
        assert meta["provenanceMaterials"].value == provenance.materials > 0
        assert get_snapshot(ws.db, digest).state == "ACTIVE"
        # the declared record schema is Dagster's column schema: names, types, roles
        declared = load_manifest(ws, digest).record_schema_document
        columns = meta[COLUMN_SCHEMA].value.columns
        assert [(c.name, c.type) for c in columns] == [(f.name, f.type) for f in declared.fields]
        assert {c.name: c.description for c in columns}["sampleId"] == "id"
        assert {c.description for c in columns} >= {"id", "content"}
        # A second run on unchanged input is a no-op that reports the existing digest.
        again = _materialize(home, instance)
        assert again.success and again.output_for_node("dataset_snapshot") == digest
        same = again.output_for_node("snapshot_alias")
        assert (same["generation"], same["activeDigest"], same["idempotentRetry"]) == (
            1,
            digest,
            True,
        )
        mat = instance.get_latest_materialization_event(dg.AssetKey("dataset_snapshot"))
        assert mat.asset_materialization.metadata["existing"].value is True
        assert mat.asset_materialization.tags["dagster/data_version"] == digest
        assert [h.generation for h in open_gate(ws).alias_history("default")] == [1]
        # Changed input (a fence advanced): a new snapshot, diffed against the active one.
        lifecycle.add_tombstones(ws, ["not-a-member"], reason="test", actor="dpo")
        changed = _materialize(home, instance)
        assert changed.output_for_node("dataset_snapshot") != digest
        assert changed.output_for_node("snapshot_alias")["generation"] == 2
        assert changed.output_for_node("snapshot_diff")["old"] == digest


def test_failed_validation_blocks_the_alias(home):
    ws = RelgateResource(home=home).workspace()
    # Break a pinned source version after pinning: the blocking check fails, alias untouched.

    with dagster_instance() as instance:
        frozen = dg.materialize(
            snapshot_assets[:1],
            instance=instance,
            resources={"relgate": RelgateResource(home=home)},
        )
        commit_wm = next(
            e for e in frozen.output_for_node("frozen_sources")["sources"] if e["id"] == "chat-cdc"
        )["commitWatermark"]
        append_segment(
            ws.store,
            "cdc/chat/",
            [
                {
                    "offset": 60,
                    "commit": commit_wm,
                    "op": "upsert",
                    "id": "chat/late",
                    "lang": "en",
                    "text": "late but older than the watermark",
                }
            ],
        )
        result = dg.materialize(
            [*snapshot_assets, *snapshot_checks],
            instance=instance,
            resources={"relgate": RelgateResource(home=home)},
            run_config={
                "ops": {"snapshot_alias": {"config": {"alias": "default", "approver": "carol"}}}
            },
            raise_on_error=False,
            selection=dg.AssetSelection.assets(
                "dataset_snapshot", "snapshot_diff", "snapshot_alias"
            ),
        )
        assert not result.success
        evaluation = result.get_asset_check_evaluations()[0]
        assert not evaluation.passed and evaluation.metadata["outcome"].value == "INCOMPLETE"
        assert open_gate(ws).alias("default").generation == 0


def test_fence_sensors_request_a_recheck_once(home):
    ws = RelgateResource(home=home).workspace()
    with dagster_instance() as instance:
        result = _materialize(home, instance)
        digest = result.output_for_node("dataset_snapshot")
        resources = {"relgate": RelgateResource(home=home)}
        with dg.build_sensor_context(instance=instance, resources=resources) as ctx:
            quiet = tombstone_fence_sensor(ctx)
        assert isinstance(quiet, dg.SkipReason)
        member = ws.membership.read(load_manifest(ws, digest).members_ref)["sampleId"][0]
        lifecycle.add_tombstones(ws, [member], reason="gdpr", actor="dpo")
        with dg.build_sensor_context(instance=instance, resources=resources) as ctx:
            fired = tombstone_fence_sensor(ctx)
        assert [r.run_key for r in fired.run_requests] == ["tombstone-1"]
        config = fired.run_requests[0].run_config["ops"]["recheck_snapshots"]["config"]
        assert config["subjects"] == [f"snapshot:{digest}"]
        assert json.loads(fired.cursor) == {"seen": 1}
        with dg.build_sensor_context(
            instance=instance, resources=resources, cursor=fired.cursor
        ) as ctx:
            again = tombstone_fence_sensor(ctx)
        assert isinstance(again, dg.SkipReason)
        with dg.build_sensor_context(instance=instance, resources=resources) as ctx:
            assert isinstance(benchmark_fence_sensor(ctx), dg.SkipReason)
        run = recheck_job.execute_in_process(
            instance=instance, run_config=fired.run_requests[0].run_config, resources=resources
        )
        assert run.success
        obs = instance.fetch_observations(dg.AssetKey("dataset_snapshot"), limit=1).records[0]
        assert obs.asset_observation.metadata["reactivatable"].value is False
        assert get_snapshot(ws.db, digest).state == "ACTIVE"  # history is immutable
        # the hit version's zero_fence_hits check is red now, naming the fence entry
        red, on_version = run.get_asset_check_evaluations()
        assert (red.asset_key, red.check_name, red.passed, red.partition) == (
            dg.AssetKey("dataset_snapshot"),
            FENCE_CHECK,
            False,
            None,
        )
        # and on the hit version's own partition
        assert (on_version.asset_key, on_version.partition, on_version.passed) == (
            dg.AssetKey("snapshot_version"),
            digest,
            False,
        )
        assert red.metadata["digest"].value == digest and red.metadata["hits"].value == 1
        assert "tombstone 1" in str(red.description)
        # executing the check alone (from the UI) reads the same hits
        alone = dg.materialize(
            [*snapshot_assets, *fence_checks],
            instance=instance,
            resources={"relgate": RelgateResource(home=home)},
            selection=dg.AssetSelection.checks(snapshot_fence_hits),
            raise_on_error=False,
        )
        (again_red,) = alone.get_asset_check_evaluations()
        assert not again_red.passed and again_red.metadata["hits"].value == 1


def test_a_fresh_snapshot_passes_its_fence_check(home):
    with dagster_instance() as instance:
        result = dg.materialize(
            [*snapshot_assets, *snapshot_checks, snapshot_fence_hits],
            instance=instance,
            resources={"relgate": RelgateResource(home=home)},
            run_config={
                "ops": {"snapshot_alias": {"config": {"alias": "default", "approver": "carol"}}}
            },
        )
        fence = {e.check_name: e for e in result.get_asset_check_evaluations()}[FENCE_CHECK]
        assert fence.passed and fence.metadata["hits"].value == 0


def test_validation_and_replay_metadata(home):
    from assets.snapshots import replay_checks

    with dagster_instance() as instance:
        result = dg.materialize(
            [*snapshot_assets, *snapshot_checks, *replay_checks],
            instance=instance,
            resources={"relgate": RelgateResource(home=home)},
            run_config={
                "ops": {"snapshot_alias": {"config": {"alias": "default", "approver": "carol"}}}
            },
        )
        assert result.success
        found = {c.check_name: c for c in result.get_asset_check_evaluations()}
        validation = found["snapshot_validation"].metadata
        assert validation["orphanIds"].value == 0 and validation["unexplainedRows"].value == 0
        assert validation["lineageCompleteness"].value == 1.0
        assert validation["uncoveredSources"].value == 0
        assert validation["buildLatencySeconds"].value >= 0
        coverage = validation["coverage"].value
        assert [r.data["source"] for r in coverage.records] == ["tickets-eu", "forum", "chat-cdc"]
        replayed = found["snapshot_replay"]
        assert replayed.passed and replayed.metadata["result"].value == "REPRODUCED"
        assert replayed.metadata["comparator"].value == "relgate.replay.exact@1"
        assert replayed.metadata["tolerance"].value == "0"
