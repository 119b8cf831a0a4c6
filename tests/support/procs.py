"""Small process helpers shared by the service harnesses."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import time
from pathlib import Path


def free_port() -> int:
    """A loopback port nobody listens on right now (the caller retries if it is taken)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie still answers signal 0: reap it if it is our child, and count it as gone
    # if it is not (a daemonized server's zombie waits for init to reap it).
    with contextlib.suppress(ChildProcessError):
        reaped, _ = os.waitpid(pid, os.WNOHANG)
        if reaped == pid:
            return False
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return True
    state = stat.rsplit(")", 1)[-1].split()[0]
    return state not in ("Z", "X")


def kill_pid(pid: int, *, grace: float = 5.0) -> None:
    """SIGTERM, wait up to ``grace`` seconds, then SIGKILL; returns once ``pid`` is gone."""
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            os.kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            if not pid_alive(pid):
                return
            time.sleep(0.05)
    raise RuntimeError(f"process {pid} survived SIGKILL")
