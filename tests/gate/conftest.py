"""A prebuilt gate workspace copied per test, so gate tests run in-process in seconds
(and mutation testing of the gate can afford to run them per mutant).

The template holds: snapshot S (APPROVED, not active), releases R1 and R2 published in
turn on alias ``train`` (R1 superseded; the alias retains only its active root), and R3
(APPROVED, never published).  ``RELGATE_GATE_TEMPLATE`` names a template built once
with ``python -m tests.gate.conftest DIR`` (built by unmutated code); without it the
session builds one.
"""

import json
import os
import shutil
import sys
from pathlib import Path

import pytest
from support.snapshots import build_validated
from support.workspaces import make_workspace

from relgate.holds.retention import RetentionPolicy, set_policy
from relgate.release.publication import approve_release, publish
from relgate.release.verify.verifier import verify_release
from relgate.release.writer import write_release
from relgate.snapshot import activation as lifecycle
from relgate.workspace import CONFIG_NAME, Workspace

TEMPLATE_ENV = "RELGATE_GATE_TEMPLATE"
PURPOSE = "demo-model-training"


def build_template(path: Path) -> dict:
    ws = make_workspace(path)
    snap = build_validated(ws)
    lifecycle.approve(ws, snap.digest, approver="alice")
    digests = {"snapshot": snap.digest}
    for name, per_shard in (("r1", 60), ("r2", 40), ("r3", 50)):
        release = write_release(ws, snap.digest, records_per_shard=per_shard, actor="t")
        assert verify_release(ws, release.digest, workers=1, actor="t").ok
        approve_release(ws, release.digest, approver="alice")
        if name != "r3":
            publish(ws, release.digest, alias="train", actor="alice")
        digests[name] = release.digest
    set_policy(ws.db, RetentionPolicy("train", keep_last=1, keep_days=0, rollback_window=0))
    ws.close()
    (path / "template.json").write_text(json.dumps(digests))
    return digests


@pytest.fixture(scope="session")
def template(tmp_path_factory) -> Path:
    given = os.environ.get(TEMPLATE_ENV)
    if given and (Path(given) / "template.json").exists():
        return Path(given)
    path = tmp_path_factory.mktemp("gate-template") / "home"
    build_template(path)
    return path


class GateWorkspace:
    def __init__(self, ws: Workspace, digests: dict) -> None:
        self.ws = ws
        self.snapshot = digests["snapshot"]
        self.r1, self.r2, self.r3 = digests["r1"], digests["r2"], digests["r3"]


@pytest.fixture
def g(template, tmp_path):
    home = tmp_path / "home"
    shutil.copytree(template, home)
    config = (home / CONFIG_NAME).read_text().replace(str(template), str(home))
    (home / CONFIG_NAME).write_text(config)
    ws = Workspace.open(home)
    yield GateWorkspace(ws, json.loads((home / "template.json").read_text()))
    ws.close()


if __name__ == "__main__":  # python -m tests.gate.conftest DIR
    target = Path(sys.argv[1]).absolute()
    if target.exists():
        shutil.rmtree(target)
    print(json.dumps(build_template(target)))
