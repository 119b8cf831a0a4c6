"""N-1 retention with the deployer: ``relgate-agent ack-serving`` on real placed trees."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from relgate_agent.cli import EXIT_OK, EXIT_REJECTED, main
from relgate_agent.staging.retention import read_serving, retire_versions

MODEL = "claude-x"


MARKERS = (".digest", ".manifest.dsse.json", ".attestation.json")


def _place(root: Path, *versions: str) -> None:
    """Placed copies, each placed after the one before (directory mtime order), each with
    its marker, envelope and attestation under .placed/ as an agent leaves them."""
    base = root / MODEL
    placed = root / ".placed" / MODEL
    placed.mkdir(parents=True, exist_ok=True)
    for v in versions:
        (base / v).mkdir(parents=True)
        (base / v / "w.bin").write_bytes(v.encode())
        for suffix in MARKERS:
            (placed / f"{v}{suffix}").write_text(v)
    for i, v in enumerate(sorted(p.name for p in base.iterdir())):
        t = time.time() - 1000 + i
        os.utime(base / v, (t, t))


def _held(root: Path) -> list[str]:
    """The placed versions; a removed tree leaves no marker behind (and a kept one keeps all)."""
    held = sorted(p.name for p in (root / MODEL).iterdir())
    markers = sorted(p.name for p in (root / ".placed" / MODEL).iterdir())
    assert markers == sorted(f"{v}{suffix}" for v in held for suffix in MARKERS)
    return held


def _ack(capsys: pytest.CaptureFixture[str], root: Path, version: str) -> tuple[int, dict]:
    rc = main(["--json", "ack-serving", MODEL, version, "--models-root", str(root)])
    lines = capsys.readouterr().out.strip().splitlines()
    return rc, json.loads(lines[-1]) if lines else {}


def test_nothing_is_retired_until_the_deployer_acknowledges(tmp_path: Path) -> None:
    root = tmp_path / "models"
    _place(root, "v1", "v2", "v3", "v4")
    # what the agent runs after placing v4: no version is known to serve, so none goes
    assert retire_versions(root, MODEL, 2, frozenset({"v4"})) == []
    assert _held(root) == ["v1", "v2", "v3", "v4"]


def test_ack_keeps_serving_previous_and_newer(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "models"
    _place(root, "v1", "v2", "v3", "v4")
    # v3 serves; v4 was placed after it and waits for its own ack; v2 is the N-1
    rc, out = _ack(capsys, root, "v3")
    assert rc == EXIT_OK and out["removed"] == ["v1"] and out["previous"] == ""
    assert _held(root) == ["v2", "v3", "v4"] and out["kept"] == ["v2", "v3", "v4"]
    # placing v5 while v3 serves retires nothing that retention keeps
    _place(root, "v5")
    assert retire_versions(root, MODEL, 2, frozenset({"v5"})) == []
    # v4 serves: the previously served v3 is the N-1, v2 goes, v5 (newer) stays
    rc, out = _ack(capsys, root, "v4")
    assert rc == EXIT_OK and out["previous"] == "v3" and out["removed"] == ["v2"]
    assert _held(root) == ["v3", "v4", "v5"]
    record = read_serving(root, MODEL)
    assert record is not None and (record.version, record.previous) == ("v4", "v3")
    # a rollback to v3: never deletes what serves, nor the newer ones
    rc, out = _ack(capsys, root, "v3")
    assert rc == EXIT_OK and out["removed"] == [] and out["previous"] == "v4"
    assert _held(root) == ["v3", "v4", "v5"]


def test_ack_of_a_version_not_placed_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    root = tmp_path / "models"
    _place(root, "v1")
    rc, out = _ack(capsys, root, "v9")
    assert rc == EXIT_REJECTED and out["check"] == "not-placed"
    assert f"{MODEL}/v9" in out["message"]
    assert read_serving(root, MODEL) is None and _held(root) == ["v1"]


def test_a_hostile_serving_record_retires_nothing(tmp_path: Path) -> None:
    root = tmp_path / "models"
    _place(root, "v1", "v2", "v3")
    (root / ".serving").mkdir()
    (root / ".serving" / f"{MODEL}.json").write_text('{"model": "claude-x", "version": "../x"}')
    assert read_serving(root, MODEL) is None
    assert retire_versions(root, MODEL, 1) == [] and _held(root) == ["v1", "v2", "v3"]
