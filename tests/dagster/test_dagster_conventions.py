"""Dagster conventions (issue 13 item 3): sources as external assets, nightly snapshots as
daily partitions, typed tables and numbers that plot, worker ranks through Dagster Pipes."""

import dagster as dg
import pytest
from support.instances import dagster_instance
from support.releases import overwrite_in_place, shard_path
from support.workspaces import make_workspace

from assets.nightly import VALIDATION_CHECK, nightly_promotion, nightly_snapshot
from assets.releases import release_assets, release_checks
from assets.snapshots import snapshot_assets, snapshot_checks
from assets.source_specs import configured_sources, source_assets, source_key
from pipelines.definitions import defs
from relgate.catalog.release_table import get_release
from relgate.catalog.snapshot_table import get_snapshot
from relgate.demo.corpus import DEMO_SOURCES
from relgate.documents import release_root as rm
from relgate.gate.transitions import open_gate
from relgate.snapshot.build import Frozen
from relgate.sources.cdc import append_segment
from resources.relgate import RelgateResource

WORLD = 2


@pytest.fixture
def home(tmp_path):
    ws = make_workspace(tmp_path / "home")
    ws.close()
    return str(tmp_path / "home")


def _metadata(instance, key, partition=None):
    event = instance.get_latest_materialization_event(dg.AssetKey(key))
    if partition is not None:
        (record,) = instance.fetch_materializations(
            dg.AssetRecordsFilter(asset_key=dg.AssetKey(key), asset_partitions=[partition]),
            limit=1,
        ).records
        event = record.event_log_entry
    return event.asset_materialization


def test_sources_are_external_assets_upstream_of_the_snapshot(home):
    graph = defs.resolve_asset_graph()
    keys = {source_key(str(s["id"])) for s in DEMO_SOURCES}
    assert {spec.key for spec in source_assets} == keys
    for key in keys:
        assert not graph.get(key).is_materializable  # external: Dagster never writes them
    assert graph.get(dg.AssetKey("frozen_sources")).parent_keys == keys
    assert graph.get(nightly_snapshot.key).parent_keys == keys
    # The workspace's own sources (what `relgate demo seed` wrote) are what the specs name.
    assert [s["id"] for s in configured_sources(home)] == [s["id"] for s in DEMO_SOURCES]
    with dagster_instance() as instance:
        result = dg.materialize(
            [*source_assets, snapshot_assets[0]],
            instance=instance,
            resources={"relgate": RelgateResource(home=home)},
            selection=[dg.AssetKey("frozen_sources")],
        )
        assert result.success
        frozen = Frozen.parse(result.output_for_node("frozen_sources"), what="frozen_sources")
        pins = {entry.id: entry.label for entry in frozen.sources}
        for key in keys:
            (record,) = instance.fetch_observations(key, limit=1).records
            observed = record.event_log_entry.asset_observation
            assert observed.tags["dagster/data_version"] == pins[key.path[-1]]


def _nightly(home, instance, night):
    return dg.materialize(
        [*source_assets, nightly_snapshot],
        instance=instance,
        resources={"relgate": RelgateResource(home=home)},
        partition_key=night,
        selection=[nightly_snapshot.key],
    )


def test_nightly_snapshots_are_daily_partitions_each_validated(home):
    with dagster_instance() as instance:
        first = _nightly(home, instance, "2026-11-29")
        second = _nightly(home, instance, "2026-11-30")
        ws = RelgateResource(home=home).workspace()
        append_segment(
            ws.store,
            "cdc/chat/",
            [
                {
                    "offset": 60,  # after the 60 events make_workspace seeded
                    "commit": 1060,
                    "op": "upsert",
                    "id": "chat/0000060",
                    "lang": "en",
                    "text": "a new chat transcript about the router that arrived overnight",
                }
            ],
        )
        third = _nightly(home, instance, "2026-12-01")
        for result in (first, second, third):
            assert result.success
            (check,) = result.get_asset_check_evaluations()
            assert (check.check_name, check.passed) == (VALIDATION_CHECK, True)
        assert instance.get_materialized_partitions(nightly_snapshot.key) == {
            "2026-11-29",
            "2026-11-30",
            "2026-12-01",
        }
        nights = {
            night: _metadata(instance, "nightly_snapshot", night)
            for night in ("2026-11-29", "2026-11-30", "2026-12-01")
        }
        digests = {n: m.metadata["digest"].value for n, m in nights.items()}
        for night, mat in nights.items():
            # Each night keeps its own materialization; the data version is its digest.
            assert mat.tags["dagster/data_version"] == digests[night]
            assert mat.metadata["dagster/row_count"].value == mat.metadata["members"].value > 0
        assert len(set(digests.values())) == 3
        for digest in digests.values():
            assert get_snapshot(ws.db, digest).state != "ACTIVE"  # built, not activated
        # The third night pinned the CDC log with one more upsert: one more member.
        members = {n: m.metadata["members"].value for n, m in nights.items()}
        assert members["2026-12-01"] == members["2026-11-30"] + 1 == members["2026-11-29"] + 1
    schedule = defs.resolve_schedule_def("nightly_snapshot")
    assert (schedule.cron_schedule, schedule.job_name) == ("0 2 * * *", "nightly_snapshot_job")
    policy = defs.resolve_assets_def(nightly_snapshot.key).specs_by_key[nightly_snapshot.key]
    assert policy.freshness_policy is not None


def _chain(home, instance, selection, barrier_timeout=60.0):
    permit = {"alias": "train", "world_size": WORLD}
    config = {
        "snapshot_alias": {"alias": "default", "approver": "carol"},
        "shard_release": {"records_per_shard": 40},
        "release_alias": {"alias": "train", "approver": "dana"},
        "gate_permit": permit,
        "pinned_run": {"barrier_timeout": barrier_timeout},
    }
    selected = {key.path[-1] for key in selection}
    return dg.materialize(
        [*source_assets, *snapshot_assets, *snapshot_checks, *release_assets, *release_checks],
        instance=instance,
        resources={"relgate": RelgateResource(home=home)},
        run_config={"ops": {k: {"config": v} for k, v in config.items() if k in selected}},
        selection=selection,
        raise_on_error=False,
    )


def _column_types(table):
    return {c.name: c.type for c in table.schema.columns}


def test_the_release_chain_reports_typed_tables_and_numbers_and_runs_ranks_through_pipes(home):
    with dagster_instance() as instance:
        result = _chain(home, instance, [a.key for a in [*snapshot_assets, *release_assets]])
        assert result.success
        snapshot = _metadata(instance, "dataset_snapshot").metadata
        assert snapshot["dagster/row_count"].value == snapshot["members"].value > 0
        assert _column_types(snapshot["selection"].value) == {"stage": "string", "rows": "int"}
        assert _column_types(_metadata(instance, "frozen_sources").metadata["pins"].value) == {
            "id": "string",
            "kind": "string",
            "pin": "string",
        }
        release = _metadata(instance, "shard_release").metadata
        assert release["dagster/row_count"].value == release["records"].value > 0
        assert release["bytes"].value > 0
        report = _metadata(instance, "release_verification").metadata
        assert report["verifiedRatio"].value == 1.0
        assert report["shardsVerified"].value == report["shards"].value == release["shards"].value
        assert report["dagster/row_count"].value == release["records"].value
        assert report["bytes"].value == release["bytes"].value

        run = _metadata(instance, "pinned_run").metadata
        ranks = [r.data for r in run["rankResults"].value.records]
        assert [(r["rank"], r["exitCode"]) for r in ranks] == [(i, 0) for i in range(WORLD)]
        assert sum(r["shards"] for r in ranks) == release["shards"].value
        assert run["ranks"].value == run["ranksReported"].value == WORLD
        logged = [e.message for e in instance.all_logs(result.run_id) if e.message]
        for rank in range(WORLD):
            assert any(m.startswith(f"rank {rank} exit 0:") for m in logged), "Pipes log"


def test_a_rank_that_cannot_verify_its_shard_fails_the_run_step(home):
    with dagster_instance() as instance:
        upto_permit = [
            a.key for a in [*snapshot_assets, *release_assets] if a.key.path != ["pinned_run"]
        ]
        assert _chain(home, instance, upto_permit).success
        root = instance.get_latest_materialization_event(dg.AssetKey("shard_release"))
        root = root.asset_materialization.metadata["root"].value
        ws = RelgateResource(home=home).workspace()
        manifest = rm.load(
            ws.store, ws.trusted_keys, root, get_release(ws.db, root).envelope_version
        )
        path = shard_path(ws, rm.wire_shards(manifest.document())[0])
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        overwrite_in_place(path, bytes(data))

        result = _chain(home, instance, [dg.AssetKey("pinned_run")], barrier_timeout=10.0)
        assert not result.success
        (failure,) = [e for e in result.all_events if e.is_step_failure]
        assert failure.step_key == "pinned_run"
        message = failure.step_failure_data.user_failure_data.description
        assert "ranks failed before step 0" in message and "rank 0:" in message
        assert "failed with code 3" in message


def test_every_asset_has_the_owner_and_its_area_tag():
    """One owner for the gate's assets, and ``relgate/area`` naming the asset's group, so
    the catalog filters by team and by area."""
    from assets.ownership import AREA_TAG, OWNERS

    graph = defs.resolve_asset_graph()
    wrong = {}
    for key in graph.get_all_asset_keys():
        node = graph.get(key)
        if list(node.owners) != OWNERS or node.tags.get(AREA_TAG) != node.group_name:
            wrong[key.to_user_string()] = (node.owners, node.tags, node.group_name)
    assert wrong == {}
    assert len(graph.get_all_asset_keys()) >= 16


def _promote(home, instance, night, approver="dana"):
    return dg.materialize(
        [*source_assets, nightly_snapshot, nightly_promotion],
        instance=instance,
        resources={"relgate": RelgateResource(home=home)},
        partition_key=night,
        selection=[nightly_promotion.key],
        run_config={"ops": {"nightly_promotion": {"config": {"approver": approver}}}},
        raise_on_error=False,
    )


def test_an_approver_promotes_one_nights_build_through_the_gate(home):
    with dagster_instance() as instance:
        assert _nightly(home, instance, "2026-11-29").success
        digest = _metadata(instance, "nightly_snapshot", "2026-11-29").metadata["digest"].value
        ws = RelgateResource(home=home).workspace()
        # a night with no build has nothing to promote: refused, naming the check
        missing = _promote(home, instance, "2026-11-28")
        assert not missing.success
        (failure,) = [e for e in missing.all_events if e.is_step_failure]
        assert "nightly-build" in str(failure.step_failure_data.user_failure_data.metadata)
        # an approval without a name is refused by the gate; nothing moves
        unnamed = _promote(home, instance, "2026-11-29", approver=" ")
        assert not unnamed.success
        assert open_gate(ws).alias("default").generation == 0
        promoted = _promote(home, instance, "2026-11-29")
        assert promoted.success
        alias = open_gate(ws).alias("default")
        assert (alias.generation, alias.active_digest) == (1, digest)
        assert get_snapshot(ws.db, digest).state == "ACTIVE"
        mat = _metadata(instance, "nightly_promotion", "2026-11-29").metadata
        assert (mat["approver"].value, mat["activeDigest"].value) == ("dana", digest)
        assert mat["livePartition"].value == f"snapshot_version[{digest}]"
