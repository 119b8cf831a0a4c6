"""Checkpoint publication and distribution from the main package: CLI and Dagster (Pipes)."""

import hashlib
import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import dagster as dg
import pytest
from support.instances import dagster_instance

from assets.checkpoints import checkpoint_assets
from relgate.checkpoint.distribute import DistributionRequest, distribute
from relgate.checkpoint.listing import find_checkpoint, list_checkpoints
from relgate.checkpoint.publish import publish_checkpoint
from relgate.demo.checkpoint import (
    DemoCheckpointRequest,
    publish_demo_checkpoint,
    write_demo_checkpoint,
)
from relgate.errors import ObjectExistsError, RejectedError, UsageError
from relgate.progress import reporting
from relgate.workspace import Workspace
from resources.fleet import FleetResource
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
    assert published.to_json()["manifestDigest"] == published.manifest_digest
    assert find_checkpoint(ws, "m", "v1") == published  # the listing reads the same record back
    assert find_checkpoint(ws, "m", "v9") is None
    (row,) = list_checkpoints(ws)
    assert row.to_json() == {
        "model": "m",
        "version": "v1",
        "manifestDigest": published.manifest_digest,
        "manifestUri": published.manifest_uri,
    }
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


def test_demo_checkpoint_is_published_once_then_reused(ws, tmp_path):
    request = DemoCheckpointRequest(
        model="demo-lm", version="v1", demo_megabytes=2, chunk_size=1 << 20, block_size=1 << 18
    )
    lines: list[str] = []
    first = publish_demo_checkpoint(ws, request, log=lines.append)
    assert first.files == 4 and "synthetic" in lines[-1]
    again = publish_demo_checkpoint(ws, request, log=lines.append)
    assert again == first and "already published" in lines[-1]
    with pytest.raises(UsageError):
        publish_demo_checkpoint(ws, request.model_copy(update={"version": ".."}))


def test_distribute_refuses_an_unpublished_version_before_starting_a_fleet(ws):
    request = DistributionRequest(model="m", version="v1", hosts=1, racks=1)
    with pytest.raises(RejectedError) as info:
        distribute(ws, request, log=lambda _l: None)
    assert info.value.check == "checkpoint-published"
    assert not (ws.home / "fleet").exists()


class _Bars:
    """A real progress reporter that keeps each task's total, progress and end."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.totals: dict[str, int | None] = {}
        self.done: dict[str, int] = {}
        self.ended: set[str] = set()

    def begin(self, description: str, total: int | None) -> int:
        self.names.append(description)
        self.totals[description], self.done[description] = total, 0
        return len(self.names) - 1

    def advance(self, handle: int, steps: int) -> None:
        self.done[self.names[handle]] += steps

    def end(self, handle: int) -> None:
        self.ended.add(self.names[handle])


def test_distribute_lands_every_host_byte_exact(ws, tmp_path):
    src = tmp_path / "ckpt"
    write_demo_checkpoint(src, megabytes=8)
    publish_checkpoint(
        ws, src, model="demo-lm", version="v1", chunk_size=1 << 20, block_size=1 << 18
    )
    request = DistributionRequest(model="demo-lm", version="v1", hosts=4, racks=2, timeout_s=180)
    bars = _Bars()
    with reporting(bars):
        out = distribute(ws, request, log=lambda _line: None)
    # the progress display: hosts ready, bytes over every copy, origin bytes over one copy
    size = int(out.status["checkpoint_bytes"])
    assert bars.totals == {
        "hosts ready": 4,
        "bytes moved": 4 * size,
        "origin bytes (1x = one copy)": size,
    }
    assert bars.done["hosts ready"] == 4  # every host READY was shown
    assert 0 < bars.done["bytes moved"] <= 4 * size
    assert 0 < bars.done["origin bytes (1x = one copy)"] <= size
    assert bars.ended == set(bars.totals)
    event = out.distribution_complete
    assert event is not None
    assert event["type"] == "DistributionComplete" and sorted(event["readyHosts"]) == [
        f"host-{i:02d}" for i in range(4)
    ]
    want = _tree_digests(src)
    for member in out.fleet:
        placed = Path(member.models_root) / "demo-lm" / "v1"
        assert _tree_digests(placed) == want
    # a smaller fleet in the same workspace targets exactly the hosts it started (the four
    # earlier hosts are still in the coordinator's store)
    src2 = tmp_path / "ckpt2"
    write_demo_checkpoint(src2, megabytes=4, seed=1)
    publish_checkpoint(
        ws, src2, model="demo-lm", version="v2", chunk_size=1 << 20, block_size=1 << 18
    )
    request2 = DistributionRequest(model="demo-lm", version="v2", hosts=2, racks=1, timeout_s=120)
    out2 = distribute(ws, request2, log=lambda _l: None)
    assert out2.status["state"] == "DONE" and out2.status["hosts_total"] == 2
    assert out2.distribution_complete is not None
    assert sorted(out2.distribution_complete["readyHosts"]) == ["host-00", "host-01"]
    for member in out2.fleet:
        assert _tree_digests(Path(member.models_root) / "demo-lm" / "v2") == _tree_digests(src2)


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
    listed = run("checkpoint", "list")
    assert listed.returncode == 0, listed.stderr
    assert [(c["model"], c["version"]) for c in json.loads(listed.stdout)["checkpoints"]] == [
        ("cli-lm", "v1")
    ]
    assert (
        json.loads(listed.stdout)["checkpoints"][0]["manifestDigest"]
        == (json.loads(pub.stdout)["manifestDigest"])
    )
    dist = run(
        "distribute", "--model", "cli-lm", "--version", "v1", "--hosts", "3", "--racks", "2",
        "--dcs", "2",
    )  # fmt: skip
    assert dist.returncode == 0, dist.stderr
    doc = json.loads(dist.stdout)
    assert doc["distributionComplete"]["type"] == "DistributionComplete"
    # one JSON style: the coordinator's snake_case job status is printed in camelCase
    assert doc["status"]["hostsTotal"] == 3 and "bytesMoved" in doc["status"]
    assert not [k for k in doc["status"] if "_" in k]
    assert {m["hostId"] for m in doc["fleet"]} == {"host-00", "host-01", "host-02"}
    # two DCs: rack-0 (host-00, host-02) holds the origin, rack-1 (host-01) is fed over the
    # WAN edge, compressed, and never reads the origin
    dcs = {m["hostId"]: m["labels"].rsplit("dc=", 1)[1] for m in doc["fleet"]}
    assert dcs == {"host-00": "dc0", "host-01": "dc1", "host-02": "dc0"}
    stats = {}
    for m in doc["fleet"]:
        d = Path(m["modelsRoot"], ".agent-stats")
        docs = [json.loads(p.read_text()) for p in d.glob("*.json")]
        docs = [x for x in docs if "origin_bytes" in x]  # one stats file per job and process
        keys = ("origin_bytes", "wan_raw_bytes", "wan_wire_bytes")
        stats[m["hostId"]] = {k: sum(x[k] for x in docs) for k in keys}
    size = doc["status"]["checkpointBytes"]
    assert stats["host-01"]["origin_bytes"] == 0 and stats["host-01"]["wan_raw_bytes"] >= size
    assert 0 < stats["host-01"]["wan_wire_bytes"] < stats["host-01"]["wan_raw_bytes"]
    assert stats["host-00"]["origin_bytes"] + stats["host-02"]["origin_bytes"] >= size


def test_distribution_asset_through_dagster_pipes(tmp_path):
    home = str(tmp_path / "home")
    Workspace.init(home).close()
    with dagster_instance() as instance:
        result = dg.materialize(
            checkpoint_assets,
            instance=instance,
            resources={
                "relgate": RelgateResource(home=home),
                "pipes_subprocess_client": dg.PipesSubprocessClient(),
                "fleet": FleetResource(),  # the embedded local fleet
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
        assert sorted(json.loads(json.dumps(mat.metadata["readyHosts"].value))) == [
            "host-00",
            "host-01",
            "host-02",
        ]
        # hosts READY over time: samples that only rise, ending at every host, and the plot
        curve = [
            (row["seconds"], row["hostsReady"]) for row in mat.metadata["hostsReadyOverTime"].value
        ]
        assert curve[-1][1] == 3 and curve == sorted(curve)
        assert mat.metadata["hostsReadyPlot"].value.rstrip("`\n").endswith(" 3/3")


def _small_checkpoint(root: Path) -> Path:
    root.mkdir(parents=True)
    (root / "config.json").write_text('{"hidden_size": 8}')
    (root / "sub").mkdir()
    (root / "sub" / "weights.bin").write_bytes(os.urandom(3 << 20))
    return root


def _plant(kind: str, src: Path, tmp_path: Path) -> Path:
    secret = tmp_path / "secret.key"
    secret.write_text("not for the fleet")
    (tmp_path / "elsewhere").mkdir(exist_ok=True)
    (tmp_path / "elsewhere" / "x.bin").write_bytes(b"x")
    path = {
        "symlink": src / "sub" / "leak.bin",
        "symlink-dir": src / "linked",
        "fifo": src / "pipe",
        "device": src / "null",
        "hard-link": src / "sub" / "hard.bin",
    }[kind]
    if kind == "symlink":
        path.symlink_to(secret)
    elif kind == "symlink-dir":
        path.symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    elif kind == "fifo":
        os.mkfifo(path)
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("mknod of a device node needs root")
        os.mknod(path, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    else:
        os.link(secret, path)
    return path


@pytest.mark.parametrize(
    ("kind", "check"),
    [
        ("symlink", "checkpoint-symlink"),
        ("symlink-dir", "checkpoint-symlink"),
        ("fifo", "checkpoint-fifo"),
        ("device", "checkpoint-device"),
        ("hard-link", "checkpoint-hard-link"),
    ],
)
def test_publish_refuses_what_is_not_a_regular_file_inside(ws, tmp_path, kind, check):
    src = _small_checkpoint(tmp_path / "ckpt")
    planted = _plant(kind, src, tmp_path)
    with pytest.raises(RejectedError) as info:
        publish_checkpoint(ws, src, model="m", version="v1", chunk_size=1 << 20, block_size=1 << 18)
    assert info.value.exit_code == 3
    assert info.value.check == check and info.value.object == str(planted)
    assert not (ws.home / "checkpoints" / "m" / "v1").exists()
    assert not [p for p in (ws.home / "checkpoints" / "m").iterdir()]  # no staging left behind


def test_cli_publish_symlink_exit_3_names_path_and_check(tmp_path):
    home = tmp_path / "home"
    src = _small_checkpoint(tmp_path / "ckpt")
    planted = _plant("symlink", src, tmp_path)
    init = _cli(home, "init")
    assert init.returncode == 0, init.stderr
    out = _cli(home, "checkpoint", "publish", str(src), "--model", "m", "--version", "v1")
    assert out.returncode == 3, out.stderr
    doc = json.loads(out.stdout)
    assert doc["check"] == "checkpoint-symlink" and doc["object"] == str(planted)


def _cli(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "relgate.cli", "--home", str(home), *args, "--json"]
    return subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ), timeout=300)


def _envelope_path(ws: Workspace, model: str, version: str) -> Path:
    return ws.home / "checkpoints" / model / version / "manifest.dsse.json"


def _rewrite_envelope(path: Path, how: str) -> None:
    import base64

    import rfc8785
    from relgate_trust.manifest import CheckpointManifest, generate_private_key, sign_manifest

    env = json.loads(path.read_text())
    if how == "unsigned":
        env["signatures"] = []
    elif how == "tampered":
        doc = json.loads(base64.b64decode(env["payload"]))
        doc["createdAt"] = "2099-01-01"  # any change the signature did not cover
        env["payload"] = base64.b64encode(rfc8785.dumps(doc)).decode()
    else:  # signed by a key the coordinator does not trust
        doc = json.loads(base64.b64decode(env["payload"]))
        env = sign_manifest(CheckpointManifest.from_json(doc), generate_private_key())
    path.chmod(0o644)
    path.write_text(json.dumps(env))


@pytest.mark.parametrize(
    ("how", "check"),
    [
        ("tampered", "signature-valid"),
        ("unsigned", "signature-present"),
        ("unknown-key", "signature-trusted"),
    ],
)
def test_manifest_refused_at_job_creation_is_exit_3_with_the_check(ws, tmp_path, how, check):
    src = _small_checkpoint(tmp_path / "ckpt")
    publish_checkpoint(ws, src, model="m", version="v1", chunk_size=1 << 20, block_size=1 << 18)
    _rewrite_envelope(_envelope_path(ws, "m", "v1"), how)
    request = DistributionRequest(model="m", version="v1", hosts=1, racks=1, timeout_s=60)
    with pytest.raises(RejectedError) as info:
        distribute(ws, request, log=lambda _l: None)
    assert info.value.exit_code == 3 and info.value.check == check, info.value
    assert "_InactiveRpcError" not in str(info.value)
    for root in (ws.home / "fleet").glob("*/models"):
        assert not (root / "m" / "v1").exists()


def test_cli_distribute_unsigned_manifest_exit_3(tmp_path):
    home = tmp_path / "home"
    assert _cli(home, "init").returncode == 0
    src = _small_checkpoint(tmp_path / "ckpt")
    pub = _cli(
        home,
        "checkpoint",
        "publish",
        str(src),
        "--model",
        "m",
        "--version",
        "v1",
        "--chunk-size",
        "1MiB",
        "--block-size",
        "256KiB",
    )
    assert pub.returncode == 0, pub.stderr
    _rewrite_envelope(home / "checkpoints" / "m" / "v1" / "manifest.dsse.json", "unsigned")
    out = _cli(
        home, "distribute", "--model", "m", "--version", "v1", "--hosts", "1", "--racks", "1"
    )
    assert out.returncode == 3, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["check"] == "signature-present" and "InactiveRpcError" not in out.stdout


def test_cli_distribute_origin_bit_rot_exit_3_names_the_chunk(tmp_path):
    from relgate_trust.manifest import TrustedKeys, verify_envelope

    home = tmp_path / "home"
    assert _cli(home, "init").returncode == 0
    src = _small_checkpoint(tmp_path / "ckpt")
    pub = _cli(
        home,
        "checkpoint",
        "publish",
        str(src),
        "--model",
        "m",
        "--version",
        "v1",
        "--chunk-size",
        "1MiB",
        "--block-size",
        "256KiB",
    )
    assert pub.returncode == 0, pub.stderr
    ws = Workspace.open(home)
    try:
        manifest = verify_envelope(
            _envelope_path(ws, "m", "v1").read_bytes(),
            TrustedKeys.load(ws.config["keys"]["trusted"]),
        )
    finally:
        ws.close()
    origin_file = home / "checkpoints" / "m" / "v1" / "origin" / "sub" / "weights.bin"
    f = next(x for x in manifest.files if x.path == "sub/weights.bin")
    offset = (2 << 20) + 1000  # a byte in the third MiB of weights.bin
    chunk = (f.offset + offset) // manifest.chunk_size
    origin_file.chmod(0o644)
    data = bytearray(origin_file.read_bytes())
    data[offset] ^= 0xFF
    origin_file.write_bytes(bytes(data))
    out = _cli(
        home, "distribute", "--model", "m", "--version", "v1", "--hosts", "2", "--racks", "1"
    )
    assert out.returncode == 3, out.stdout + out.stderr
    doc = json.loads(out.stdout)
    assert doc["check"] == "chunk-verification", doc
    assert f"chunk {chunk} " in doc["message"] and "sub/weights.bin" in doc["message"]
    assert str(origin_file) in doc["message"] and manifest.chunks[chunk].digest in doc["message"]
    assert doc["digest"] == manifest.digest
