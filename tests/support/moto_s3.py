"""moto's S3 server as a real subprocess on loopback.

The server is the ``moto_server`` console script of the running interpreter's
environment (next to ``sys.executable``), so tests exercise the real HTTP path of boto3:
signing, retries, headers such as ``If-None-Match``.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import IO

from support.procs import free_port, kill_pid, pid_alive

# Dummy credentials: moto accepts anything, and they keep boto3 away from real ones.
DUMMY_AWS_ENV = {
    "AWS_ACCESS_KEY_ID": "relgate-test",
    "AWS_SECRET_ACCESS_KEY": "relgate-test-secret",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_CONFIG_FILE": "/dev/null",
    "AWS_SHARED_CREDENTIALS_FILE": "/dev/null",
    "AWS_EC2_METADATA_DISABLED": "true",
}
DUMMY_AWS_UNSET = ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3")


def moto_server_binary() -> Path:
    path = Path(sys.executable).parent / "moto_server"
    if not path.exists():
        raise RuntimeError(
            f"{path} not found: install the dev extras (moto[server]) into this environment"
        )
    return path


class MotoServer:
    """Start with ``start()``, always ``stop()`` (safe to call after a failed start).

    ``serial=True`` (the default) runs the same ``moto_server`` script with werkzeug's
    threading off, because moto's conditional create is not atomic between concurrent
    requests; see ``moto_serial.py``.  ``serial=False`` runs the script unchanged.
    """

    def __init__(self, *, serial: bool = True, startup_timeout: float = 30.0) -> None:
        self.serial = serial
        self.startup_timeout = startup_timeout
        self.endpoint_url: str | None = None
        self.pid: int | None = None
        self._proc: subprocess.Popen[bytes] | None = None
        self._log: IO[bytes] | None = None

    def start(self) -> str:
        last_error = ""
        for _attempt in range(3):  # a free port can be taken between probe and bind
            port = free_port()
            self._log = tempfile.TemporaryFile()  # noqa: SIM115 (lives as long as the server)
            cmd = [str(moto_server_binary()), "-H", "127.0.0.1", "-p", str(port)]
            if self.serial:
                cmd = [sys.executable, str(Path(__file__).with_name("moto_serial.py")), *cmd]
            self._proc = subprocess.Popen(
                cmd,
                stdin=subprocess.DEVNULL,
                stdout=self._log,
                stderr=subprocess.STDOUT,
            )
            self.pid = self._proc.pid
            url = f"http://127.0.0.1:{port}"
            if self._wait_ready(url):
                self.endpoint_url = url
                return url
            last_error = self._read_log()
            self.stop()
        raise RuntimeError(f"moto_server did not start:\n{last_error}")

    def _wait_ready(self, url: str) -> bool:
        assert self._proc is not None
        deadline = time.monotonic() + self.startup_timeout
        while time.monotonic() < deadline:
            if self._proc.poll() is not None:
                return False
            try:
                probe = url + "/moto-api/data.json"  # http URL of the moto server we started
                with urllib.request.urlopen(probe, timeout=1) as resp:  # noqa: S310 our own http endpoint
                    if resp.status == 200:
                        return True
            except (urllib.error.URLError, ConnectionError, TimeoutError):
                pass
            time.sleep(0.05)
        return False

    def _read_log(self) -> str:
        if self._log is None:
            return ""
        self._log.seek(0)
        return self._log.read().decode("utf-8", "replace")[-4000:]

    def stop(self) -> None:
        if self.pid is not None and pid_alive(self.pid):
            kill_pid(self.pid)
        if self._proc is not None:
            self._proc.wait(timeout=10)
        if self._log is not None:
            self._log.close()
        self._proc = None
        self._log = None
        self.pid = None
        self.endpoint_url = None
