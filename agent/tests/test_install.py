"""``pip install ./trust ./agent`` into a fresh virtual environment, pinned by the
repository's requirements.lock, from the package index pip is configured with: the
installed ``relgate-agent`` command answers ``--help`` and ``--version``, and every module
of relgate_agent imports without the main ``relgate`` package (a module that needs an
optional extra may only miss that extra's distribution).

Measured at 26 to 36 s with a warm pip cache on a shared 2-core machine, so it runs in
the normal suite. The sources are copied first: pip's in-tree build would otherwise leave
build/ and *.egg-info in the checkout."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
INSTALL_TIMEOUT_S = 600
# the venv's own interpreter and nothing else: the test run's PYTHONPATH names the checkout
CLEAN_ENV = {
    k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")
}

_IMPORT_ALL = """
import importlib, json, pkgutil, sys
import relgate_agent
failed = {}
names = sorted(
    m.name
    for m in pkgutil.walk_packages(relgate_agent.__path__, "relgate_agent.")
    if not m.name.endswith(".__main__")
)
for name in names:
    try:
        importlib.import_module(name)
    except ModuleNotFoundError as exc:
        failed[name] = exc.name
print(json.dumps({
    "modules": names,
    "missing": failed,
    "relgate": "relgate" in sys.modules,
    "file": relgate_agent.__file__,
}))
"""


def _copy_source(name: str, dest: Path) -> Path:
    target = dest / name
    shutil.copytree(
        ROOT / name,
        target,
        ignore=shutil.ignore_patterns(
            "__pycache__", "build", "*.egg-info", "tests", "lab", ".ruff_cache", "scenarios"
        ),
    )
    return target


def _extras_modules() -> set[str]:
    project = tomllib.loads((ROOT / "agent" / "pyproject.toml").read_text())["project"]
    names = {
        Requirement(spec).name.lower().replace("-", "_")
        for specs in project["optional-dependencies"].values()
        for spec in specs
    }
    return names | {n.split("[")[0] for n in names}


def test_pip_install_of_agent_alone_runs_and_imports_every_module(tmp_path: Path) -> None:
    src = tmp_path / "src"
    trust, agent = _copy_source("trust", src), _copy_source("agent", src)
    venv = tmp_path / "venv"
    subprocess.run(
        [sys.executable, "-m", "venv", str(venv)], check=True, timeout=120, env=CLEAN_ENV
    )
    py, exe = venv / "bin" / "python", venv / "bin" / "relgate-agent"
    pip = subprocess.run(
        [
            str(py),
            "-m",
            "pip",
            "install",
            "--quiet",
            "-c",
            str(ROOT / "requirements.lock"),
            str(trust),
            str(agent),
        ],
        capture_output=True,
        text=True,
        timeout=INSTALL_TIMEOUT_S,
        cwd=tmp_path,
        env=CLEAN_ENV,
    )
    assert pip.returncode == 0, pip.stderr[-3000:]

    version = subprocess.run(
        [str(exe), "--version"], capture_output=True, text=True, timeout=60, env=CLEAN_ENV
    )
    assert version.returncode == 0, version.stderr
    assert version.stdout.strip() == "relgate-agent, version 0.1.0"
    for args in (["--help"], ["agent", "serve", "--help"], ["coordinator", "serve", "--help"]):
        shown = subprocess.run(
            [str(exe), *args], capture_output=True, text=True, timeout=60, env=CLEAN_ENV
        )
        assert shown.returncode == 0, shown.stderr
        assert "Usage: relgate-agent" in shown.stdout
    assert "--config PATH" in shown.stdout and "--log-format" in shown.stdout

    done = subprocess.run(
        [str(py), "-c", _IMPORT_ALL],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=tmp_path,
        env=CLEAN_ENV,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    found = json.loads(done.stdout)
    assert found["file"].startswith(str(venv))  # the installed copy, not the checkout
    assert "relgate_agent.cli.daemons" in found["modules"]
    assert not found["relgate"]  # never the main package
    # only an optional extra's distribution may be missing (sim: matplotlib)
    assert set(found["missing"].values()) <= _extras_modules(), found["missing"]
