"""Debian's ``redis-server`` as a real subprocess on a free loopback port (a celery broker).

No persistence (``--save ''``, ``--appendonly no``), its working directory a temporary
directory; stopped by PID (SIGTERM, then SIGKILL) whether the test passed or not.
"""

from __future__ import annotations

import shutil
import socket
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO

from support.procs import free_port, kill_pid, pid_alive

REDIS_SERVER = "/usr/bin/redis-server"


def _pong(port: int) -> bool:
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=1) as sock:
            sock.sendall(b"PING\r\n")
            return sock.recv(16).startswith(b"+PONG")
    except OSError:
        return False


class RedisServer:
    """``start()`` returns ``redis://127.0.0.1:<port>``; always ``stop()``."""

    def __init__(self, *, startup_timeout: float = 20.0) -> None:
        self.startup_timeout = startup_timeout
        self.pid: int | None = None
        self.url: str | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._dir: Path | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> str:
        binary = shutil.which("redis-server") or REDIS_SERVER
        for _attempt in range(3):  # a free port can be taken between probe and bind
            port = free_port()
            self._dir = Path(tempfile.mkdtemp(prefix="relgate-redis-"))
            cmd = [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", ""]
            cmd += ["--appendonly", "no", "--dir", str(self._dir), "--protected-mode", "no"]
            self._log = (self._dir / "log").open("wb")
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
            self.pid = self._proc.pid
            deadline = time.monotonic() + self.startup_timeout
            while time.monotonic() < deadline and self._proc.poll() is None:
                if _pong(port):
                    self.url = f"redis://127.0.0.1:{port}"
                    return self.url
                time.sleep(0.05)
            log = (self._dir / "log").read_text(errors="replace")[-2000:]
            self.stop()
        raise RuntimeError(f"redis-server did not start:\n{log}")

    def stop(self) -> None:
        if self.pid is not None and pid_alive(self.pid):
            kill_pid(self.pid)
        if self._proc is not None:
            self._proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
        if self._dir is not None:
            shutil.rmtree(self._dir, ignore_errors=True)
        self._proc, self._dir, self._log, self.pid, self.url = None, None, None, None, None
