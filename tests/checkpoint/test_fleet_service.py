"""Distribution to a fleet that already runs: ``relgate distribute --coordinator`` and the
checkpoint_distribution asset with a configured FleetResource create the job on that
fleet's coordinator with the operator's credentials and start no agent of their own.

The fleet (a coordinator process and agents from the local fleet harness) is started here,
outside the code under test, under its own home; the deployer's workspace only publishes.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest
from support.instances import dagster_instance

from assets.checkpoints import checkpoint_assets
from relgate.checkpoint.distribute import DistributionRequest, distribute
from relgate.checkpoint.fleet import FleetMember, FleetService
from relgate.checkpoint.local_fleet import local_fleet
from relgate.checkpoint.location import ORIGIN_NAME, version_dir
from relgate.checkpoint.publish import publish_checkpoint
from relgate.demo.checkpoint import write_demo_checkpoint
from relgate.errors import RejectedError
from relgate.workspace import Workspace
from relgate_agent.client import CoordinatorClient
from relgate_agent.pki import TlsFiles, ensure_dev_pki
from resources.fleet import FleetResource
from resources.relgate import RelgateResource

HOSTS = 3
RACKS = 2
SELECTOR = "cluster=svc"
START_WAIT_S = 60.0


def _tree_digests(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def _agent_pids(under: Path) -> set[int]:
    """PIDs of running ``relgate-agent agent serve`` processes whose models root is under
    ``under``."""
    pids = set()
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        text = [a.decode(errors="replace") for a in argv]
        if "relgate_agent.cli" not in text or "--models-root" not in text:
            continue
        root = text[text.index("--models-root") + 1]
        if Path(root).is_relative_to(under):
            pids.add(int(entry.name))
    return pids


@dataclass
class RunningFleet:
    address: str
    pki: Path
    members: list[FleetMember]
    home: Path


@pytest.fixture
def deployer(tmp_path: Path) -> Iterator[Workspace]:
    ws = Workspace.init(tmp_path / "home")
    yield ws
    ws.close()


@pytest.fixture
def running_fleet(tmp_path: Path, deployer: Workspace) -> Iterator[RunningFleet]:
    """A coordinator process and HOSTS agents labelled SELECTOR, trusting the deployer's
    signing key; stopped by PID afterwards."""
    home = tmp_path / "fleet-home"
    fleet_ws = Workspace.init(home)
    fleet_ws.config["keys"]["trusted"] = list(deployer.config["keys"]["trusted"])
    fleet_ws.save()
    hosts = {f"host-{i:02d}": f"rack-{i % RACKS}" for i in range(HOSTS)}
    pki = ensure_dev_pki(home, hosts)
    address_file = home / "coordinator.address"
    log = (home / "coordinator.log").open("ab")
    coordinator = subprocess.Popen(
        [
            sys.executable, "-m", "relgate_agent.cli", "coordinator", "serve",
            "--listen", "127.0.0.1:0", "--db", str(home / "coordinator.sqlite"),
            "--trusted-keys", *fleet_ws.config["keys"]["trusted"],
            "--pki", str(pki), "--address-file", str(address_file),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + START_WAIT_S
        while not address_file.exists() or not address_file.read_text():
            assert coordinator.poll() is None, (home / "coordinator.log").read_text()
            assert time.monotonic() < deadline, "the coordinator did not start"
            time.sleep(0.1)
        address = address_file.read_text().strip()
        client = CoordinatorClient(address, TlsFiles.from_pki(pki, "operator"))
        try:
            with local_fleet(
                fleet_ws, hosts=HOSTS, racks=RACKS, coordinator=address, labels=SELECTOR
            ) as members:
                for m in members:
                    e = m.enrollment()
                    client.enroll_host(e.host_id, e.rack, dict(e.labels))
                while (
                    not all(h.live for h in client.list_hosts().hosts)
                    or len(client.list_hosts().hosts) < HOSTS
                ):
                    assert time.monotonic() < deadline, "the agents did not check in"
                    time.sleep(0.2)
                yield RunningFleet(address, pki, members, home)
        finally:
            client.close()
    finally:
        coordinator.terminate()
        coordinator.wait(timeout=30)
        log.close()
        fleet_ws.close()


def _publish(ws: Workspace, tmp_path: Path, model: str = "svc-lm") -> Path:
    src = tmp_path / f"ckpt-{model}"
    write_demo_checkpoint(src, megabytes=4)
    publish_checkpoint(ws, src, model=model, version="v1", chunk_size=1 << 20, block_size=1 << 18)
    return src


def _assert_placed(fleet: RunningFleet, src: Path, model: str) -> None:
    want = _tree_digests(src)
    for m in fleet.members:
        assert _tree_digests(Path(m.models_root) / model / "v1") == want, m.host


def _assert_nothing_started(deployer: Workspace, fleet: RunningFleet, before: set[int]) -> None:
    # the same agents run, none started under the deployer's home, no coordinator served there
    assert _agent_pids(fleet.home) == before and len(before) == HOSTS
    assert _agent_pids(deployer.home) == set()
    assert not (deployer.home / "fleet").exists()
    assert not (deployer.home / "coordinator.sqlite").exists()


def test_cli_distribute_to_a_running_fleet(tmp_path, deployer, running_fleet):
    src = _publish(deployer, tmp_path)
    before = _agent_pids(running_fleet.home)
    cmd = [
        sys.executable, "-m", "relgate.cli", "--home", str(deployer.home), "distribute",
        "--model", "svc-lm", "--version", "v1",
        "--coordinator", "127.0.0.1:1",  # nobody there: the next replica answers as leader
        "--coordinator", running_fleet.address,
        "--pki-dir", str(running_fleet.pki), "--selector", SELECTOR, "--json",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    assert out.returncode == 0, out.stderr
    doc = json.loads(out.stdout)
    assert doc["status"]["state"] == "DONE" and doc["status"]["hostsTotal"] == HOSTS
    assert sorted(doc["status"]["readyHosts"]) == sorted(m.host_id for m in running_fleet.members)
    assert doc["coordinator"] == f"127.0.0.1:1,{running_fleet.address}"
    assert doc["fleet"] == []
    _assert_placed(running_fleet, src, "svc-lm")
    _assert_nothing_started(deployer, running_fleet, before)


def test_asset_distributes_to_the_fleet_resource(tmp_path, deployer, running_fleet):
    before = _agent_pids(running_fleet.home)
    with dagster_instance() as instance:
        result = dg.materialize(
            checkpoint_assets,
            instance=instance,
            resources={
                "relgate": RelgateResource(home=str(deployer.home)),
                "pipes_subprocess_client": dg.PipesSubprocessClient(),
                "fleet": FleetResource(
                    addresses=[running_fleet.address],
                    pki_dir=str(running_fleet.pki),
                    selector=SELECTOR,
                ),
            },
            run_config={
                "ops": {
                    "checkpoint_manifest": {
                        "config": {
                            "model": "asset-lm",
                            "demo_megabytes": 4,
                            "chunk_mb": 1,
                            "block_mb": 1,
                        }
                    }
                }
            },
        )
        assert result.success
        (check,) = result.get_asset_check_evaluations()
        assert check.check_name == "ready_threshold" and check.passed
        event = instance.get_latest_materialization_event(dg.AssetKey("checkpoint_distribution"))
        metadata = event.asset_materialization.metadata
    assert metadata["hostsTotal"].value == HOSTS
    assert sorted(metadata["readyHosts"].value) == sorted(m.host_id for m in running_fleet.members)
    _assert_placed(running_fleet, version_dir(deployer, "asset-lm", "v1") / ORIGIN_NAME, "asset-lm")
    _assert_nothing_started(deployer, running_fleet, before)


def test_missing_operator_certificate_is_refused_before_any_call(tmp_path, deployer):
    _publish(deployer, tmp_path)
    pki = ensure_dev_pki(tmp_path / "other", {"host-00": "rack-0"})
    (pki / "operator.pem").unlink()
    request = DistributionRequest(
        model="svc-lm",
        version="v1",
        hosts=1,
        racks=1,
        fleet=FleetService(coordinators=["127.0.0.1:1"], pki_dir=str(pki), selector=SELECTOR),
    )
    with pytest.raises(RejectedError) as err:
        distribute(deployer, request, log=lambda _l: None)
    assert err.value.check == "operator-credentials"
    cmd = [
        sys.executable, "-m", "relgate.cli", "--home", str(deployer.home), "distribute",
        "--model", "svc-lm", "--version", "v1", "--coordinator", "127.0.0.1:1",
        "--pki-dir", str(pki), "--selector", SELECTOR, "--json",
    ]  # fmt: skip
    out = subprocess.run(cmd, capture_output=True, text=True, env=dict(os.environ))
    assert out.returncode == 3, out.stderr
    doc = json.loads(out.stdout)
    assert doc["check"] == "operator-credentials" and doc["object"] == str(pki)
    assert "operator.pem" in doc["message"]
    # no selector: never every host by default
    no_selector = [*cmd[: cmd.index("--selector")], "--json"]
    out = subprocess.run(no_selector, capture_output=True, text=True, env=dict(os.environ))
    assert out.returncode == 3 and json.loads(out.stdout)["check"] == "target-selector"
    # credentials in place but no replica answers: refused naming the leader check
    pki = ensure_dev_pki(tmp_path / "good", {"host-00": "rack-0"})
    nobody = [
        *cmd[: cmd.index("--pki-dir")],
        "--pki-dir",
        str(pki),
        "--selector",
        SELECTOR,
        "--json",
    ]
    out = subprocess.run(nobody, capture_output=True, text=True, env=dict(os.environ))
    assert out.returncode == 3, out.stderr
    doc = json.loads(out.stdout)
    assert doc["check"] == "coordinator-leader" and doc["object"] == "127.0.0.1:1"
    assert not (deployer.home / "fleet").exists()


def test_the_running_fleet_path_does_not_load_the_local_fleet_harness():
    """The harness that spawns agents is imported only on the embedded path: loading the
    distribution core (and the code location) leaves it out, and the code location's
    fleet resource defaults to the embedded local fleet."""
    probe = (
        "import sys, relgate.checkpoint.distribute, assets.checkpoints\n"
        "from pipelines.definitions import defs\n"
        "print('relgate.checkpoint.local_fleet' in sys.modules)\n"
        "print(defs.resources['fleet'].service())\n"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, env=dict(os.environ)
    )
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["False", "None"]
