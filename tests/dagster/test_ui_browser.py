"""The Dagster UI on a demo instance, in headless Chromium, and its GraphQL API.

Builds a demo instance in a temporary directory (the demo's snapshot and release runs and
an INVALID release), starts ``dagster-webserver`` on a free port against it, loads the
asset graph and the INVALID release's checks page in Debian's headless Chromium (saving
docs/img/asset-graph.png and docs/img/release-checks.png), and asserts through GraphQL that
the lineage runs sources -> snapshot -> release -> verification report -> permit -> run
and that the INVALID release's checks failed.  The webserver (with its code server) and
Chromium run in sessions of their own and are stopped by PID.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import dagster as dg
import pytest

from assets.fence_checks import FENCE_CHECK
from assets.releases import OUTCOME_CHECK
from assets.source_specs import source_key
from pipelines.launch import CodeLocationRuns
from relgate.demo.corpus import DEMO_SOURCES
from relgate.gate.transitions import open_gate
from relgate.release.verify.checks import ZERO_CHECKS, Check
from relgate.snapshot.diff import load_manifest
from relgate.workspace import Workspace
from sensors.gate_sensor import INTERVAL_S
from tests.dagster import ui_instance

pytestmark = pytest.mark.browser

ROOT = Path(__file__).resolve().parents[2]
IMG = ROOT / "docs" / "img"
CHROMIUM = Path("/usr/bin/chromium")
#: Debian's Chromium with nothing fetched, synced or updated behind the test's back.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--hide-scrollbars",
    "--window-size=1600,1000",
]
STARTUP_S = 60.0
PAGE_BUDGET_MS = 15000
#: The chain the UI must show, upstream first (after one edge from each source).
CHAIN = [
    "frozen_sources",
    "dataset_snapshot",
    "snapshot_alias",
    "shard_release",
    "release_verification",
    "release_alias",
    "gate_permit",
    "pinned_run",
]
#: What one flipped byte in a shard fails (tests/dagster/test_release_checks.py).
FLIPPED_BYTE_FAILS = {
    Check.STORAGE_DIGEST_MISMATCH,
    Check.MISSING_MEMBERS,
    Check.TUPLE_ROOT_MISMATCH,
    Check.TOTALS_MISMATCH,
}

LINEAGE_QUERY = "{ assetNodes { assetKey { path } dependencyKeys { path } } }"
CHECKS_QUERY = """
query($path: [String!]!) {
  assetNodeOrError(assetKey: {path: $path}) {
    ... on AssetNode {
      assetChecksOrError {
        ... on AssetChecks {
          checks { name executionForLatestMaterialization { status evaluation { success } } }
        }
      }
    }
  }
  assetOrError(assetKey: {path: $path}) {
    ... on Asset {
      assetMaterializations(limit: 1) {
        metadataEntries { label ... on TextMetadataEntry { text } }
      }
    }
  }
}
"""


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _stop(proc: subprocess.Popen[bytes]) -> None:
    """SIGTERM the process's session (it leads one), then SIGKILL after 10 s."""
    if proc.poll() is None:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=10)


class Ui:
    def __init__(self, port: int, proc: subprocess.Popen[bytes]) -> None:
        self.url = f"http://127.0.0.1:{port}"
        self.proc = proc

    def graphql(self, query: str, variables: dict[str, object] | None = None) -> dict:
        body = json.dumps({"query": query, "variables": variables or {}}).encode()
        request = urllib.request.Request(  # noqa: S310 - http://127.0.0.1:<our port>
            f"{self.url}/graphql", data=body, headers={"Content-Type": "application/json"}
        )
        with urllib.request.urlopen(request, timeout=30) as response:  # noqa: S310
            answer = json.loads(response.read(8 << 20))
        assert "errors" not in answer, answer["errors"]
        return answer["data"]

    def wait_loaded(self) -> None:
        """Until the code location has loaded (its assets are served), bounded."""
        deadline = time.monotonic() + STARTUP_S
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "dagster-webserver exited"
            try:
                if self.graphql(LINEAGE_QUERY)["assetNodes"]:
                    return
            except (urllib.error.URLError, ConnectionError, AssertionError):
                pass
            time.sleep(0.5)
        raise AssertionError(f"the UI did not load the code location in {STARTUP_S} s")


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("ui")
    relgate_home, dagster_home = tmp / "relgate", tmp / "dagster"
    mp = pytest.MonkeyPatch()
    # the daemon, the webserver and the runs they launch read the workspace from here
    mp.setenv("RELGATE_HOME", str(relgate_home))
    try:
        built = ui_instance.build(relgate_home, dagster_home)
        port = _free_port()
        env = {**os.environ, "DAGSTER_HOME": str(dagster_home)}
        webserver = Path(sys.executable).with_name("dagster-webserver")
        with (tmp / "webserver.log").open("wb") as log:
            proc = subprocess.Popen(
                [str(webserver), "-h", "127.0.0.1", "-p", str(port), "-w", "workspace.yaml"],
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        ui = Ui(port, proc)
        # the run daemon beside the webserver, as `dagster dev` runs both: it dequeues
        # re-executions and ticks the gate and fence sensors
        with (
            dg.DagsterInstance.from_config(str(dagster_home)) as instance,
            CodeLocationRuns(instance) as runs,
        ):
            try:
                ui.wait_loaded()
                yield Demo(ui, built, tmp, runs, relgate_home)
            finally:
                _stop(proc)
    finally:
        mp.undo()


@dataclass(frozen=True)
class Demo:
    ui: Ui
    built: ui_instance.UiInstance
    tmp: Path
    runs: CodeLocationRuns
    home: Path


def _screenshot(url: str, out: Path, profile: Path) -> None:
    """One page in headless Chromium, after its GraphQL requests settled, to ``out``."""
    assert CHROMIUM.exists(), "install Debian's chromium (apt-get install chromium; .ci/run does)"
    out.unlink(missing_ok=True)
    proc = subprocess.Popen(
        [
            str(CHROMIUM),
            *CHROMIUM_FLAGS,
            f"--user-data-dir={profile}",
            f"--virtual-time-budget={PAGE_BUDGET_MS}",
            f"--screenshot={out}",
            url,
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        proc.wait(timeout=60)
    finally:
        _stop(proc)
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_lineage_runs_from_the_sources_to_the_run(demo):
    ui, tmp = demo.ui, demo.tmp
    _screenshot(
        f"{ui.url}/assets/pinned_run?view=lineage&lineageScope=upstream&lineageDepth=12",
        IMG / "asset-graph.png",
        tmp / "chrome-graph",
    )
    edges = {
        (tuple(parent["path"]), tuple(node["assetKey"]["path"]))
        for node in ui.graphql(LINEAGE_QUERY)["assetNodes"]
        for parent in node["dependencyKeys"]
    }
    for source in DEMO_SOURCES:
        assert (tuple(source_key(str(source["id"])).path), ("frozen_sources",)) in edges
    for upstream, downstream in itertools.pairwise(CHAIN):
        assert ((upstream,), (downstream,)) in edges


def _checks(ui: Ui, asset: str) -> tuple[dict[str, tuple[str, bool]], dict[str, str]]:
    data = ui.graphql(CHECKS_QUERY, {"path": [asset]})
    checks = {
        c["name"]: (
            c["executionForLatestMaterialization"]["status"],
            c["executionForLatestMaterialization"]["evaluation"]["success"],
        )
        for c in data["assetNodeOrError"]["assetChecksOrError"]["checks"]
    }
    (latest,) = data["assetOrError"]["assetMaterializations"]
    metadata = {e["label"]: e.get("text") for e in latest["metadataEntries"]}
    return checks, metadata


def test_an_invalid_releases_checks_are_failed(demo):
    ui, built, tmp = demo.ui, demo.built, demo.tmp
    _screenshot(
        f"{ui.url}/assets/release_verification?view=checks",
        IMG / "release-checks.png",
        tmp / "chrome-checks",
    )
    checks, metadata = _checks(ui, "release_verification")
    # The latest verification report is the INVALID release's.
    assert (metadata["root"], metadata["outcome"]) == (built.invalid_root, "INVALID")
    failing = {c.asset_check_name for c in FLIPPED_BYTE_FAILS} | {OUTCOME_CHECK}
    assert set(checks) == {c.asset_check_name for c in ZERO_CHECKS} | {OUTCOME_CHECK}
    assert {name for name, (status, _) in checks.items() if status == "FAILED"} == failing
    assert all(ok is (name not in failing) for name, (_, ok) in checks.items())
    # The run downstream was admitted on the published (verified) root, not the INVALID one.
    _, run = _checks(ui, "pinned_run")
    assert (run["root"], run["runId"]) == (built.published_root, built.run_id)


JOB_RUNS_QUERY = """
query($job: String!) {
  pipelineOrError(params: {pipelineName: $job, repositoryName: "__repository__",
                           repositoryLocationName: "relgate"}) {
    __typename
    ... on Pipeline { runs(limit: 20) { runId status } }
  }
}
"""
REEXECUTE = """
mutation($parent: String!) {
  launchPipelineReexecution(reexecutionParams: {parentRunId: $parent, strategy: ALL_STEPS}) {
    __typename
    ... on LaunchRunSuccess { run { runId } }
    ... on PythonError { message }
  }
}
"""
OBSERVATION_QUERY = """
query($path: [String!]!) {
  assetOrError(assetKey: {path: $path}) {
    ... on Asset {
      assetObservations(limit: 1) {
        timestamp
        metadataEntries {
          label
          ... on IntMetadataEntry { intValue }
          ... on TextMetadataEntry { text }
          ... on TableMetadataEntry { table { records } }
        }
      }
    }
  }
}
"""
CHECK_EXECUTIONS = """
query($path: [String!]!, $check: String!, $partition: String) {
  assetCheckExecutions(assetKey: {path: $path}, checkName: $check, limit: 1,
                       partition: $partition) {
    runId status evaluation { success description }
  }
}
"""
PARTITIONS_QUERY = """
query($path: [String!]!) {
  assetNodeOrError(assetKey: {path: $path}) {
    ... on AssetNode { partitionKeysByDimension { partitionKeys } }
  }
}
"""
#: A sensor tick every INTERVAL_S; the daemon's own loop and a launched run's start add a
#: few seconds, on a busy 2-core machine tens of seconds: the waits below are bounds.
SENSOR_BOUND_S = 2 * INTERVAL_S + 60


def _job_runs(ui: Ui, job: str) -> list[dict]:
    answer = ui.graphql(JOB_RUNS_QUERY, {"job": job})["pipelineOrError"]
    assert answer["__typename"] == "Pipeline", answer
    return answer["runs"]


def test_demo_runs_are_listed_under_their_jobs_and_re_execute(demo):
    ui = demo.ui
    _screenshot(
        f"{ui.url}/locations/relgate/jobs/snapshot_release_job/runs",
        IMG / "job-runs.png",
        demo.tmp / "chrome-runs",
    )
    (parent,) = _job_runs(ui, "snapshot_release_job")
    assert parent["status"] == "SUCCESS"
    assert {r["status"] for r in _job_runs(ui, "release_job")} == {"SUCCESS"}
    launched = ui.graphql(REEXECUTE, {"parent": parent["runId"]})["launchPipelineReexecution"]
    assert launched["__typename"] == "LaunchRunSuccess", launched
    child = demo.runs.wait(launched["run"]["runId"])
    assert child.success, child.step_failures()
    assert {r["runId"] for r in _job_runs(ui, "snapshot_release_job")} == {
        parent["runId"],
        child.run_id,
    }


def _observed(ui: Ui, asset: str) -> dict[str, object]:
    data = ui.graphql(OBSERVATION_QUERY, {"path": [asset]})["assetOrError"]
    if not data["assetObservations"]:
        return {}
    (latest,) = data["assetObservations"]
    values: dict[str, object] = {}
    for entry in latest["metadataEntries"]:
        if "intValue" in entry:
            values[entry["label"]] = entry["intValue"]
        elif "text" in entry:
            values[entry["label"]] = entry["text"]
        elif "table" in entry:
            values[entry["label"]] = [json.loads(r) for r in entry["table"]["records"]]
    return values


def _until(what: str, probe, bound_s: float = SENSOR_BOUND_S):
    deadline = time.monotonic() + bound_s
    while True:
        found = probe()
        if found:
            return found
        assert time.monotonic() < deadline, f"{what}: not shown within {bound_s:.0f} s"
        time.sleep(1.0)


def _relgate(demo: Demo, *args: str) -> subprocess.CompletedProcess[str]:
    """The relgate command line on the demo's workspace, as an operator types it."""
    command = [str(Path(sys.executable).with_name("relgate")), "--home", str(demo.home), *args]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


def test_every_release_root_is_a_partition_with_its_own_checks(demo):
    ui, built = demo.ui, demo.built
    (dimension,) = ui.graphql(PARTITIONS_QUERY, {"path": ["release_version"]})["assetNodeOrError"][
        "partitionKeysByDimension"
    ]
    roots = {built.first_root, built.published_root, built.invalid_root}
    assert roots <= set(dimension["partitionKeys"])
    for root in roots:
        (latest,) = ui.graphql(
            CHECK_EXECUTIONS,
            {"path": ["release_version"], "check": OUTCOME_CHECK, "partition": root},
        )["assetCheckExecutions"]
        # the INVALID root's verdict stays on its partition after later, valid releases
        assert latest["status"] == ("FAILED" if root == built.invalid_root else "SUCCEEDED")
    _screenshot(
        f"{ui.url}/assets/release_version?view=partitions&partition={built.invalid_root}",
        IMG / "release-versions.png",
        demo.tmp / "chrome-versions",
    )


def test_a_cli_rollback_and_the_open_permits_show_on_their_pages(demo):
    ui, built = demo.ui, demo.built
    rolled = _relgate(
        demo, "release", "rollback", "default-release", "--to", built.first_root, "--json"
    )
    assert rolled.returncode == 0, rolled.stderr
    assert json.loads(rolled.stdout)["generation"] == 3

    def rolled_back() -> dict[str, object]:
        seen = _observed(ui, "release_alias")
        return seen if seen.get("generation.default-release") == 3 else {}

    seen = _until("the rollback on release_alias", rolled_back)
    assert seen["activeDigest.default-release"] == built.first_root
    assert seen["livePartition.default-release"] == f"release_version[{built.first_root}]"
    _screenshot(
        f"{ui.url}/assets/release_alias?view=events",
        IMG / "alias-observed.png",
        demo.tmp / "chrome-alias",
    )
    permits = _observed(ui, "gate_permit")
    assert permits["source"] == "gate" and permits["openPermits"] >= 1
    listed = permits["permits"]
    assert isinstance(listed, list) and {p["permitId"] for p in listed}
    assert built.published_root in {p["root"] for p in listed}
    _screenshot(
        f"{ui.url}/assets/gate_permit?view=events",
        IMG / "permits-observed.png",
        demo.tmp / "chrome-permits",
    )


def test_a_tombstone_turns_the_hit_snapshots_check_red(demo):
    ui = demo.ui
    ws = Workspace.open(demo.home)
    try:
        digest = open_gate(ws).alias("default").active_digest
        assert digest is not None
        member = str(ws.membership.read(load_manifest(ws, digest).members_ref)["sampleId"][0])
    finally:
        ws.close()
    added = _relgate(demo, "fence", "tombstone", "add", member, "--reason", "erasure request")
    assert added.returncode == 0, added.stderr

    def red() -> dict | None:
        (latest,) = ui.graphql(
            CHECK_EXECUTIONS,
            {"path": ["dataset_snapshot"], "check": FENCE_CHECK, "partition": None},
        )["assetCheckExecutions"] or [None]
        return latest if latest and latest["status"] == "FAILED" else None

    # the fence sensor's tick launches recheck_job, whose evaluation turns the check red
    execution = _until("the fence hit on dataset_snapshot's check", red, SENSOR_BOUND_S + 120)
    assert execution["evaluation"]["success"] is False
    assert digest in execution["evaluation"]["description"]
    # and on the hit version's own partition of snapshot_version
    (on_version,) = ui.graphql(
        CHECK_EXECUTIONS,
        {"path": ["snapshot_version"], "check": FENCE_CHECK, "partition": digest},
    )["assetCheckExecutions"]
    assert on_version["status"] == "FAILED"
    _screenshot(
        f"{ui.url}/assets/dataset_snapshot?view=checks&checkDetail={FENCE_CHECK}",
        IMG / "fence-hit.png",
        demo.tmp / "chrome-fence",
    )
