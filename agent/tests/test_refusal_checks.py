"""Every refusal names its check: the CLI's exit 3 carries a non-empty ``check`` for
TLS identity problems too (issue 30), run here as real commands."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from relgate_agent.pki import ensure_dev_pki

EXIT_REJECTED = 3


def _run(*args: str) -> tuple[int, dict[str, object]]:
    env = {k: v for k, v in os.environ.items() if k != "RELGATE_AGENT_PKI"}
    proc = subprocess.run(
        [sys.executable, "-m", "relgate_agent", "--json", *args],
        capture_output=True,
        text=True,
        timeout=60,
        env=env,
        check=False,
    )
    return proc.returncode, json.loads(proc.stdout.strip().splitlines()[-1])


def test_agent_serve_with_another_hosts_certificate(tmp_path: Path, keypair) -> None:
    pki = ensure_dev_pki(tmp_path, {"h00": "r0", "h01": "r1"})
    rc, out = _run(
        "agent", "serve", "--host-id", "h00", "--rack", "r0",
        "--coordinator", "127.0.0.1:1", "--models-root", str(tmp_path / "models"),
        "--trusted-keys", str(keypair[2]), "--pki", str(pki),
        "--cert", str(pki / "h01.pem"), "--key", str(pki / "h01.key"),
    )  # fmt: skip
    assert rc == EXIT_REJECTED and out["check"] == "cert-host", out
    assert "h01" in str(out["message"])


@pytest.mark.parametrize(
    ("tls", "check"),
    [(["--pki", "{missing}"], "tls-missing"), ([], "tls-unset")],
)
def test_job_create_without_tls_files(tmp_path: Path, tls: list[str], check: str) -> None:
    tls = [a.format(missing=tmp_path / "no-pki") for a in tls]
    rc, out = _run(
        "job", "create", "--coordinator", "127.0.0.1:1", "--model", "m", "--version", "v",
        "--manifest-uri", str(tmp_path / "m.dsse.json"), *tls,
    )  # fmt: skip
    assert rc == EXIT_REJECTED and out["check"] == check, out
