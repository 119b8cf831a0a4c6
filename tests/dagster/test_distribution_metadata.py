"""Dagster metadata of schema evolution (on the release verification) and of the shadow
diff's distributions (on snapshot_diff): tables with schemas, numbers that plot."""

import json

import dagster as dg
import pytest
from support.instances import dagster_instance
from support.workspaces import make_workspace

from assets.releases import release_assets, release_checks
from assets.snapshots import snapshot_assets, snapshot_checks
from relgate.workspace import Workspace
from resources.relgate import RelgateResource


@pytest.fixture
def home(tmp_path):
    ws = make_workspace(tmp_path / "home")
    ws.config["readers"] = [
        {"name": "trainer", "requires": [{"name": "text", "type": "string"}]},
        {"name": "legacy", "requires": [{"name": "body", "type": "string"}]},
    ]
    ws.save()
    ws.close()
    return str(tmp_path / "home")


def _snapshots(home, instance):
    return dg.materialize(
        [*snapshot_assets, *snapshot_checks],
        instance=instance,
        resources={"relgate": RelgateResource(home=home)},
        run_config={"ops": {"snapshot_alias": {"config": {"alias": "default", "approver": "c"}}}},
    )


def _metadata(instance, key):
    event = instance.get_latest_materialization_event(dg.AssetKey(key))
    return event.asset_materialization.metadata


def test_shadow_diff_metadata_has_distribution_tables_and_divergences(home):
    with dagster_instance() as instance:
        assert _snapshots(home, instance).success
        ws = Workspace.open(home)
        rows = [{"id": f"forum/long-{i}", "lang": "fr", "text": "w " * 300} for i in range(10)]
        ws.store.put("raw/forum/long.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
        ws.close()
        assert _snapshots(home, instance).success
        meta = _metadata(instance, "snapshot_diff")
        table = meta["distributions.tokenLengths"]
        assert isinstance(table, dg.TableMetadataValue)
        assert [c.name for c in table.schema.columns] == ["range", "old", "new", "delta"]
        assert sum(r.data["delta"] for r in table.records) == 10
        assert meta["divergencePpm.tokenLengths"].value > 0
        assert meta["divergencePpm.label"].value > 0
        labels = {r.data["value"]: r.data for r in meta["distributions.label"].records}
        assert labels["fr"]["new"] - labels["fr"]["old"] == 10
        assert isinstance(meta["distributions.bySource"], dg.TableMetadataValue)


def test_release_verification_metadata_has_reader_verdicts_and_change_counts(home):
    with dagster_instance() as instance:
        result = dg.materialize(
            [*snapshot_assets, *snapshot_checks, *release_assets, *release_checks],
            instance=instance,
            resources={"relgate": RelgateResource(home=home)},
            run_config={
                "ops": {
                    "snapshot_alias": {"config": {"alias": "default", "approver": "c"}},
                    "shard_release": {"config": {"records_per_shard": 40}},
                    "release_alias": {"config": {"alias": "train", "approver": "d"}},
                }
            },
            raise_on_error=False,
        )
        meta = _metadata(instance, "release_verification")
        assert meta["schemaEvolution.old"].value == "none"
        assert meta["schemaEvolution.incompatibleReaders"].value == 1
        verdicts = {r.data["reader"]: r.data for r in meta["schemaEvolution.readers"].records}
        assert verdicts["trainer"]["verdict"] == "COMPATIBLE"
        assert verdicts["legacy"]["verdict"] == "INCOMPATIBLE"
        assert "missing" in verdicts["legacy"]["reasons"]
        # the legacy reader cannot read it: the alias step is refused
        assert not result.success
