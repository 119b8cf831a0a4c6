"""How a transform process is launched: the runner protocol and the plain subprocess runner.

The core describes a launch (:class:`Launch`: the verified transform's command, its
environment, working directory and time limit) and hands it to a
:class:`TransformRunner`.  The CLI uses :class:`SubprocessRunner`; the Dagster layer
passes a runner that launches the same command through ``PipesSubprocessClient`` (the
core never imports Dagster).  Either way the command is the :mod:`watchdog
<relgate.transforms.watchdog>` around the transform, and the outcome is read from the
status file it writes, so a crash or a timeout is refused the same way on both paths.
"""

from __future__ import annotations

import contextlib
import json
import subprocess
import sys
from pathlib import Path
from typing import Final, Protocol

from pydantic import StrictInt, StrictStr

from relgate.errors import RejectedError
from relgate.integrity.contract import Contract
from relgate.transforms import refusals

#: Seconds a transform may run (workspace config ``transforms.timeoutSeconds``).
DEFAULT_TIMEOUT_S: Final = 600
#: Extra seconds the plain runner gives the watchdog before it gives up on it.
_GRACE_S: Final = 30
_MAX_STATUS_BYTES: Final = 4096


class Launch(Contract):
    """One transform process to run to completion."""

    transform: StrictStr  # the pinned reference, for refusals and logs
    argv: tuple[StrictStr, ...]
    env: dict[StrictStr, StrictStr]
    cwd: StrictStr
    work: StrictStr  # private directory for the status, env and log files
    timeout_s: StrictInt

    @property
    def status_path(self) -> Path:
        return Path(self.work) / "status.json"

    def command(self) -> list[str]:
        """The watchdog command line around :attr:`argv` (what a runner executes)."""
        work = Path(self.work)
        env_file = work / "env.json"
        env_file.write_text(json.dumps(self.env))
        return [
            sys.executable,
            "-m",
            "relgate.transforms.watchdog",
            "--timeout",
            str(self.timeout_s),
            "--status",
            str(self.status_path),
            "--env",
            str(env_file),
            "--log",
            str(work / "transform.log"),
            "--cwd",
            self.cwd,
            "--",
            *self.argv,
        ]

    def outcome(self) -> None:
        """Refuse unless the watchdog saw the transform exit 0 within its time limit."""
        try:
            status = json.loads(self.status_path.read_bytes()[:_MAX_STATUS_BYTES])
        except (OSError, ValueError):
            status = None
        if not isinstance(status, dict):
            raise self._refused("transform supervisor wrote no status", refusals.EXIT, {})
        if status.get("timedOut") is True:
            raise self._refused(
                f"transform ran past its {self.timeout_s}s limit and was killed",
                refusals.TIMEOUT,
                {"timeoutSeconds": self.timeout_s},
            )
        code = status.get("exitCode")
        if code != 0:
            raise self._refused("transform process failed", refusals.EXIT, {"exitCode": code})

    def _refused(self, message: str, check: str, details: dict[str, object]) -> RejectedError:
        pinned = self.transform.split("@", 1)[-1]
        return RejectedError(
            message, object=self.transform, check=check, digest=pinned, details=details
        )


class TransformRunner(Protocol):
    """Runs :meth:`Launch.command` to completion (blocking); the core checks the rest."""

    def run(self, launch: Launch) -> None: ...


class SubprocessRunner:
    """The plain runner (CLI, validation, replay): a subprocess, no orchestration."""

    def run(self, launch: Launch) -> None:
        # A watchdog that outlives its own limit leaves no status file: refused by outcome().
        with contextlib.suppress(subprocess.TimeoutExpired):
            subprocess.run(  # noqa: S603 our watchdog with the verified transform's command
                launch.command(),
                cwd=launch.work,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
                timeout=launch.timeout_s + _GRACE_S,
                check=False,
            )
