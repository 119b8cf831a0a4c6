"""The supervisor every transform process runs under (``python -m``; stdlib only).

::

    python -m relgate.transforms.watchdog --timeout S --status FILE --env FILE --log FILE -- ARGV...

It starts ``ARGV`` in a new session with exactly the environment in the env file (plus
the ``DAGSTER_PIPES_*`` variables it was itself given, so a Pipes launch reaches the
transform), stdout and stderr to the log file, stdin closed; kills the whole process
group when the time limit passes; and writes ``{"exitCode": n}`` or ``{"timedOut": true}``
to the status file.  relgate runs it under both runners (plain subprocess from the CLI,
``PipesSubprocessClient`` from Dagster), so the time limit and the scrubbed environment
hold on either path; the watchdog itself always exits 0 once it has written a status.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Final

PIPES_PREFIX: Final = "DAGSTER_PIPES_"


def _kill_group(pid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pid, signal.SIGKILL)


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="relgate.transforms.watchdog")
    parser.add_argument("--timeout", type=float, required=True)
    parser.add_argument("--status", type=Path, required=True)
    parser.add_argument("--env", type=Path, required=True)
    parser.add_argument("--log", type=Path, required=True)
    parser.add_argument("--cwd", type=Path, required=True)
    parser.add_argument("command", nargs=argparse.REMAINDER)
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    env = json.loads(args.env.read_text())
    env.update({k: v for k, v in os.environ.items() if k.startswith(PIPES_PREFIX)})
    with args.log.open("wb") as log:
        try:
            child = subprocess.Popen(  # noqa: S603 the pinned, verified transform's own command
                command,
                env=env,
                cwd=args.cwd,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        except OSError as exc:
            _write(args.status, {"exitCode": 127, "startFailed": type(exc).__name__})
            return 0
        try:
            status: dict[str, object] = {"exitCode": child.wait(timeout=args.timeout)}
        except subprocess.TimeoutExpired:
            _kill_group(child.pid)
            child.wait()
            status = {"timedOut": True}
    _kill_group(child.pid)  # nothing the transform started outlives it
    _write(args.status, status)
    return 0


def _write(path: Path, status: dict[str, object]) -> None:
    staged = path.with_suffix(".tmp")
    staged.write_text(json.dumps(status))
    staged.replace(path)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
