"""The deployment files under agent/deploy/ stay true to the code: the systemd units run
``relgate-agent ... serve --config`` on the shipped example configs with the hardening
the install guide promises (and ``systemd-analyze verify`` finds nothing wrong in them
where it is installed); the Containerfile installs from agent/ and trust/ alone."""

from __future__ import annotations

import configparser
import os
import shutil
import subprocess
from pathlib import Path

import pytest

DEPLOY = Path(__file__).resolve().parents[1] / "deploy"
UNITS = {"relgate-coordinator.service": "coordinator", "relgate-agent.service": "agent"}
HARDENING = {
    "NoNewPrivileges": "yes",
    "ProtectSystem": "strict",
    "ProtectHome": "yes",
    "PrivateTmp": "yes",
    "Restart": "on-failure",
    "RestartPreventExitStatus": "2 3",  # a refused config (exit 3) does not fix itself
}


def _unit(name: str) -> configparser.RawConfigParser:
    parser = configparser.RawConfigParser(strict=False, interpolation=None)
    parser.optionxform = str  # type: ignore[assignment,method-assign]  # keys keep their case
    text = (DEPLOY / name).read_text().replace("\\\n", " ")
    parser.read_string(text)
    return parser


@pytest.mark.parametrize(("name", "daemon"), sorted(UNITS.items()))
def test_units_run_the_example_config_hardened(name: str, daemon: str) -> None:
    service = _unit(name)["Service"]
    exec_start = " ".join(service["ExecStart"].split())
    assert exec_start.startswith(f"/opt/relgate-agent/bin/relgate-agent --json {daemon} serve")
    assert f"--config /etc/relgate-agent/{daemon}.toml" in exec_start
    assert (DEPLOY / f"{daemon}.toml").is_file()
    for key, value in HARDENING.items():
        assert service[key] == value, (name, key)
    assert service.get("DynamicUser") == "yes" or service.get("User"), name
    state = f"%S/{service['StateDirectory']}"
    rw = service["ReadWritePaths"].split()
    assert state in rw
    if daemon == "agent":
        assert "/models" in rw


@pytest.mark.skipif(shutil.which("systemd-analyze") is None, reason="no systemd-analyze")
@pytest.mark.parametrize("name", sorted(UNITS))
def test_systemd_analyze_verify_finds_no_unknown_or_bad_directive(
    tmp_path: Path, name: str
) -> None:
    """Verified under a scratch root holding the unit and an executable at ExecStart's path
    (the real one is installed by docs/agent-install.md)."""
    exe = tmp_path / "opt" / "relgate-agent" / "bin" / "relgate-agent"
    exe.parent.mkdir(parents=True)
    exe.write_text("#!/bin/sh\n")
    exe.chmod(0o755)
    units = tmp_path / "etc" / "systemd" / "system"
    units.mkdir(parents=True)
    shutil.copy(DEPLOY / name, units / name)
    done = subprocess.run(
        ["systemd-analyze", "verify", f"--root={tmp_path}", name],
        capture_output=True,
        text=True,
        timeout=60,
        env={**os.environ, "SYSTEMD_LOG_COLOR": "0"},
    )
    # a scratch root has no sysinit.target: that line is the only one expected
    problems = [
        line
        for line in (done.stdout + done.stderr).splitlines()
        if line.strip() and "sysinit.target not found" not in line
    ]
    assert problems == []


def test_containerfile_installs_from_agent_and_trust_alone() -> None:
    lines = [
        " ".join(line.split())
        for line in (DEPLOY / "Containerfile").read_text().splitlines()
        if line.startswith("COPY ") and "--from=" not in line
    ]
    sources = {src for line in lines for src in line.split()[1:-1]}
    assert sources == {
        "requirements.lock",
        "trust/pyproject.toml",
        "trust/relgate_trust",
        "agent/pyproject.toml",
        "agent/relgate_agent",
        "agent/deploy/agent.toml",
        "agent/deploy/coordinator.toml",
    }
    text = (DEPLOY / "Containerfile").read_text()
    assert "./trust" in text and "./agent" in text
    assert 'ENTRYPOINT ["relgate-agent", "--json"]' in text
