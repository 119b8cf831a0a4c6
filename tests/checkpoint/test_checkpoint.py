"""Checkpoint publication and distribution from the main package: CLI and Dagster (Pipes)."""

import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest

from assets.checkpoints import checkpoint_assets
from relgate.checkpoint import distribute, publish_checkpoint, write_demo_checkpoint
from relgate.errors import ObjectExistsError, UsageError
from relgate.workspace import Workspace
from resources.relgate import RelgateResource


def _tree_digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


@pytest.fixture
def ws(tmp_path):
    workspace = Workspace.init(tmp_path / "home")
    yield workspace
    workspace.close()


def test_publish_is_immutable_and_names_are_safe(ws, tmp_path):
    src = tmp_path / "ckpt"
    write_demo_checkpoint(src, megabytes=4)
    published = publish_checkpoint(
        ws, src, model="m", version="v1", chunk_size=1 << 20, block_size=1 << 18
    )
    assert published.bytes == sum(p.stat().st_size for p in src.iterdir())
    with pytest.raises(ObjectExistsError):
        publish_checkpoint(ws, src, model="m", version="v1", chunk_size=1 << 20, block_size=1 << 18)
    for bad in ("..", "a/b", ""):
        with pytest.raises(UsageError):
            publish_checkpoint(
                ws, src, model=bad, version="v2", chunk_size=1 << 20, block_size=1 << 18
            )
    header = json.loads(
        (src / "model-00001-of-00002.safetensors").read_bytes()[8:][
            : int.from_bytes((src / "model-00001-of-00002.safetensors").read_bytes()[:8], "little")
        ]
    )
    assert {v["dtype"] for k, v in header.items() if k != "__metadata__"} == {"BF16"}


def test_distribute_lands_every_host_byte_exact(ws, tmp_path):
    src = tmp_path / "ckpt"
    write_demo_checkpoint(src, megabytes=8)
    publish_checkpoint(
        ws, src, model="demo-lm", version="v1", chunk_size=1 << 20, block_size=1 << 18
    )
    out = distribute(
        ws, model="demo-lm", version="v1", hosts=4, racks=2, timeout_s=180, log=lambda _line: None
    )
    event = out["distributionComplete"]
    assert event["type"] == "DistributionComplete" and sorted(event["readyHosts"]) == [
        f"host-{i:02d}" for i in range(4)
    ]
    want = _tree_digests(src)
    for member in out["fleet"]:
        placed = Path(member["modelsRoot"]) / "demo-lm" / "v1"
        assert _tree_digests(placed) == want


def test_cli_publish_and_distribute(tmp_path):
    home = tmp_path / "home"

    def run(*args: str) -> subprocess.CompletedProcess[str]:
        cmd = [sys.executable, "-m", "relgate.cli", "--home", str(home), *args, "--json"]
        return subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))

    assert run("init").returncode == 0
    assert run("checkpoint", "demo", str(tmp_path / "ckpt"), "--megabytes", "4").returncode == 0
    pub = run(
        "checkpoint",
        "publish",
        str(tmp_path / "ckpt"),
        "--model",
        "cli-lm",
        "--version",
        "v1",
        "--chunk-size",
        "1MiB",
        "--block-size",
        "256KiB",
    )
    assert pub.returncode == 0, pub.stderr
    bad = run("checkpoint", "publish", str(tmp_path / "ckpt"), "--model", "..", "--version", "v1")
    assert bad.returncode == 2 and json.loads(bad.stdout)["check"] == "checkpoint-name"
    dist = run("distribute", "--model", "cli-lm", "--version", "v1", "--hosts", "3", "--racks", "2")
    assert dist.returncode == 0, dist.stderr
    assert json.loads(dist.stdout)["distributionComplete"]["type"] == "DistributionComplete"


def test_distribution_asset_through_dagster_pipes(tmp_path):
    home = str(tmp_path / "home")
    Workspace.init(home).close()
    with dg.instance_for_test() as instance:
        result = dg.materialize(
            checkpoint_assets,
            instance=instance,
            resources={
                "relgate": RelgateResource(home=home),
                "pipes_subprocess_client": dg.PipesSubprocessClient(),
            },
            run_config={
                "ops": {
                    "checkpoint_manifest": {
                        "config": {"demo_megabytes": 6, "chunk_mb": 1, "block_mb": 1}
                    },
                    "checkpoint_distribution": {"config": {"hosts": 3, "racks": 2}},
                }
            },
        )
        assert result.success
        checks = result.get_asset_check_evaluations()
        assert [(c.check_name, c.passed) for c in checks] == [("ready_threshold", True)]
        mat = instance.get_latest_materialization_event(
            dg.AssetKey("checkpoint_distribution")
        ).asset_materialization
        assert sorted(json.loads(json.dumps(mat.metadata["ready_hosts"].value))) == [
            "host-00",
            "host-01",
            "host-02",
        ]
