"""The snapshot asset runs a pinned wheel transform once, through Dagster Pipes."""

import dagster as dg
import pytest
from support import transforms as art
from support.instances import dagster_instance
from support.workspaces import make_workspace

from assets.snapshots import snapshot_assets
from relgate.snapshot.diff import load_manifest
from relgate.snapshot.transform_tags import tag_transform
from relgate.transforms.registry import register_wheel
from resources.relgate import RelgateResource


@pytest.fixture
def home(tmp_path):
    ws = make_workspace(tmp_path / "home")
    wheel = art.write_wheel(tmp_path, "t-shout", "1.0", art.SHOUT)
    spec = register_wheel(ws.db, ws.cas, wheel)
    tag_transform(ws.db, "registry.local/normalize:v1", spec.pin)
    ws.close()
    return str(tmp_path / "home"), spec


def test_snapshot_asset_launches_the_pinned_wheel_once_through_pipes(home):
    path, spec = home
    with dagster_instance() as instance:
        result = dg.materialize(
            snapshot_assets[:2],
            instance=instance,
            resources={"relgate": RelgateResource(home=path)},
        )
        assert result.success
        digest = result.output_for_node("dataset_snapshot")
        mat = instance.get_latest_materialization_event(dg.AssetKey("dataset_snapshot"))
        metadata = mat.asset_materialization.metadata
        assert metadata["transformLaunches"].value == 1
        assert metadata["transformImage"].value == f"registry.local/normalize@{spec.pin}"
        assert metadata["transform"].data["kind"] == "python-wheel"
        rows_in, rows_out = (metadata[k].value for k in ("transformRowsIn", "transformRowsOut"))
        selection = {r.data["stage"]: r.data["rows"] for r in metadata["selection"].records}
        assert rows_in > 0 and rows_in == rows_out == selection["sourceRows"]
        assert metadata["dagster/row_count"].value == metadata["members"].value > 0
        logs = [
            e.message
            for e in instance.all_logs(result.run_id)
            if e.message and f"transform registry.local/normalize@{spec.pin}" in e.message
        ]
        assert logs, "the verified transform rows are logged in the run"
    ws = RelgateResource(home=path).workspace()
    assert load_manifest(ws, digest).transform == spec
