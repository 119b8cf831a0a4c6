"""``make demo`` as a new user sees it: what happened, and nothing else.

The demo driver runs as a real process on a fresh SQLite instance and workspace, twice.
The first run prints one line per step and nothing on stderr (no Preview/Beta warnings,
no Pipes notices, no agent or coordinator logging, no ``eta -1s``); its GC summary never
counts more required than stored objects.  The second run, on unchanged input, reports
the same snapshot and release digests at generation 1.
"""

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DIGEST = r"sha256:[0-9a-f]{64}"

pytestmark = pytest.mark.slow


def _demo(tmp_path: Path) -> subprocess.CompletedProcess[str]:
    env = {
        **os.environ,
        "RELGATE_HOME": str(tmp_path / "relgate"),
        "DAGSTER_HOME": str(tmp_path / "dagster"),
    }
    return subprocess.run(
        [sys.executable, "-m", "pipelines.demo"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )


def _digest(pattern: str, out: str) -> str:
    found = re.search(pattern + f"({DIGEST})", out)
    assert found, (pattern, out)
    return found.group(1)


def test_the_demo_prints_what_happened_and_reruns_as_a_no_op(tmp_path):
    (tmp_path / "dagster").mkdir()
    shutil.copy(ROOT / "dagster.yaml", tmp_path / "dagster" / "dagster.yaml")
    first = _demo(tmp_path)
    assert first.returncode == 0, first.stderr
    assert first.stderr == ""
    out = first.stdout
    for noise in ("Warning", "[pipes]", "relgate_agent", "eta -1s", "INFO", "DEBUG"):
        assert noise not in out
    snapshot = _digest(r"active snapshot for alias 'default' \(generation 1\): ", out)
    release = _digest(r"published release for alias 'default-release' \(generation 1\): ", out)
    assert "verification VERIFIED" in out and "4 worker processes passed the barrier" in out
    assert "DistributionComplete: demo-lm/v1 ready on 4/4 hosts" in out
    gc = re.search(
        r"GC plan \(dry run, grace 0s\): (\d+) stored objects, (\d+) of them required", out
    )
    assert gc and int(gc.group(2)) <= int(gc.group(1)), out
    assert (tmp_path / "relgate" / "fleet" / "coordinator.log").stat().st_size > 0

    again = _demo(tmp_path)
    assert again.returncode == 0 and again.stderr == "", again.stderr
    rerun = again.stdout
    assert _digest(r"active snapshot for alias 'default' \(generation 1\): ", rerun) == snapshot
    assert (
        _digest(r"published release for alias 'default-release' \(generation 1\): ", rerun)
        == release
    )
    assert rerun.count("(unchanged input: the existing digest)") == 2
