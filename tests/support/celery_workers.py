"""``celery -A dagster_celery.app worker`` processes, started and stopped by PID.

Each worker is one process (``--pool=solo``: the step runs in it, nothing forked behind
the PID) that takes one task at a time from the ``dagster`` queue of the broker.  The
broker and result backend come from a ``dagster_celery_config`` module on the worker's
``PYTHONPATH``, which is how dagster-celery's own ``worker start`` configures workers.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import IO

from support.procs import kill_pid, pid_alive

PROJECT = Path(__file__).resolve().parents[2]


def write_celery_config(directory: Path, broker: str) -> Path:
    """The ``dagster_celery_config`` module a worker imports (broker and result backend)."""
    directory.mkdir(parents=True, exist_ok=True)
    (directory / "dagster_celery_config.py").write_text(
        f"broker_url = {broker!r}\nresult_backend = {broker!r}\n"
    )
    return directory


class CeleryWorker:
    """One worker named ``name@<host>``; ``start()`` waits until celery logs it ready."""

    def __init__(self, name: str, config_dir: Path, env: Mapping[str, str], log: Path) -> None:
        self.name = name
        self.config_dir = config_dir
        self.env = dict(env)
        self.log_path = log
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self, timeout: float = 60.0) -> None:
        path = os.pathsep.join([str(self.config_dir), str(PROJECT), str(PROJECT / "agent")])
        env = {**os.environ, **self.env, "PYTHONPATH": path}
        cmd = [sys.executable, "-m", "celery", "-A", "dagster_celery.app", "worker"]
        cmd += ["--pool=solo", "-Q", "dagster", "-n", f"{self.name}@%h", "--loglevel=INFO"]
        cmd += ["--prefetch-multiplier=1", "--without-gossip", "--without-mingle"]
        self._log = self.log_path.open("wb")
        self._proc = subprocess.Popen(
            cmd, cwd=PROJECT, env=env, stdin=subprocess.DEVNULL, stdout=self._log,
            stderr=subprocess.STDOUT,
        )  # fmt: skip
        self.pid = self._proc.pid
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and self._proc.poll() is None:
            if b" ready." in self.log_path.read_bytes():
                return
            time.sleep(0.1)
        raise RuntimeError(f"celery worker {self.name} did not start:\n{self.log()}")

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-4000:]

    def stop(self) -> None:
        if self.pid is not None and pid_alive(self.pid):
            kill_pid(self.pid, grace=10.0)  # SIGTERM: a warm shutdown, then SIGKILL
        if self._proc is not None:
            self._proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
        self._proc, self._log, self.pid = None, None, None
