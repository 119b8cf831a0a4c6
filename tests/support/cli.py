"""The relgate CLI as a user runs it: a real process, its JSON object, its exit code."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

RELGATE = [sys.executable, "-m", "relgate.cli"]


def relgate_cli(home: Path, *args: str, expect: int = 0) -> dict[str, Any]:
    """Run ``relgate --home HOME ARGS --json``; assert the exit code; the last JSON line."""
    proc = subprocess.run(
        [*RELGATE, "--home", str(home), *args, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "RELGATE_HASH_WORKERS": "1"},
        check=False,
    )
    assert proc.returncode == expect, (args, proc.returncode, proc.stdout, proc.stderr)
    found: dict[str, Any] = json.loads(proc.stdout.splitlines()[-1])
    return found
