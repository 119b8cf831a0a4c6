"""PostgreSQL for tests: the installed Debian binaries, or ``RELGATE_TEST_PG_DSN``.

The Debian server binaries live in ``/usr/lib/postgresql/<major>/bin`` (not on PATH) and
refuse to run as root, so as root every server command runs through
``runuser -u postgres --`` in a temporary directory owned by postgres; as any other user
they run directly.  The server listens on 127.0.0.1 on a free port with its socket in
the same temporary directory, ``fsync=off`` (tests do not survive power loss), and is
stopped with ``pg_ctl stop -m immediate`` and then, if the postmaster is still there,
killed by PID.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import re
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from support.procs import free_port, kill_pid, pid_alive

PG_DSN_ENV = "RELGATE_TEST_PG_DSN"
PG_BIN_GLOB = "/usr/lib/postgresql/*/bin"
TEST_DATABASE = "relgate_test"


def find_pg_bin() -> Path:
    """The bin directory of the highest installed PostgreSQL major version."""
    candidates = []
    for path in glob.glob(PG_BIN_GLOB):
        version = re.search(r"/postgresql/([0-9.]+)/bin$", path)
        if version and (Path(path) / "pg_ctl").exists() and (Path(path) / "initdb").exists():
            key = tuple(int(part) for part in version.group(1).split("."))
            candidates.append((key, Path(path)))
    if not candidates:
        raise RuntimeError(
            f"no PostgreSQL server binaries under {PG_BIN_GLOB}: install the Debian "
            f"postgresql package, or set {PG_DSN_ENV} to a SQLAlchemy URL of a server "
            "where the test user may CREATE DATABASE"
        )
    return max(candidates)[1]


def sqlalchemy_url(url: str) -> str:
    """Normalize ``postgres://`` / ``postgresql://`` to the psycopg 3 SQLAlchemy dialect."""
    for plain in ("postgres://", "postgresql://"):
        if url.startswith(plain):
            return "postgresql+psycopg://" + url[len(plain) :]
    return url


def _connect_kwargs(url: str) -> dict[str, Any]:
    from sqlalchemy.engine import make_url

    parsed = make_url(sqlalchemy_url(url))
    kwargs: dict[str, Any] = {
        "host": parsed.host or "127.0.0.1",
        "port": parsed.port or 5432,
        "user": parsed.username or "postgres",
        "dbname": parsed.database or "postgres",
    }
    if parsed.password:
        kwargs["password"] = parsed.password
    kwargs.update({k: v for k, v in parsed.query.items() if isinstance(v, str)})
    return kwargs


def _admin_execute(url: str, *statements: str) -> None:
    import psycopg

    kwargs = _connect_kwargs(url)
    kwargs["dbname"] = "postgres"  # never connected to the database being created/dropped
    with psycopg.connect(**kwargs, autocommit=True, connect_timeout=10) as conn:
        for statement in statements:
            conn.execute(statement)


def create_database(server_url: str, name: str) -> str:
    """Create ``name`` on the server of ``server_url``; the URL of the new database."""
    if not re.fullmatch(r"[a-z_][a-z0-9_]*", name):
        raise ValueError(f"unsafe database name {name!r}")
    _admin_execute(server_url, f'CREATE DATABASE "{name}"')
    from sqlalchemy.engine import make_url

    return (
        make_url(sqlalchemy_url(server_url))
        .set(database=name)
        .render_as_string(hide_password=False)
    )


def drop_database(server_url: str, name: str) -> None:
    # FORCE ends sessions a test leaked (PostgreSQL 13+), so cleanup cannot hang.
    _admin_execute(server_url, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@contextlib.contextmanager
def fresh_database(server_url: str, prefix: str = "relgate_t_") -> Iterator[str]:
    name = prefix + uuid.uuid4().hex
    url = create_database(server_url, name)
    try:
        yield url
    finally:
        drop_database(server_url, name)


def _is_postgres(pid: int) -> bool:
    """Guard against PID reuse: only ever kill a process that is a postgres server."""
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return True  # no /proc: trust the pid from postmaster.pid
    return b"postgres" in cmdline


class PostgresServer:
    """A throwaway cluster.  ``start()`` returns its URL; ``stop()`` always cleans up."""

    def __init__(self, bin_dir: Path | None = None, *, start_timeout: int = 60) -> None:
        self.bin_dir = bin_dir or find_pg_bin()
        self.start_timeout = start_timeout
        self.as_root = os.geteuid() == 0
        self.tmp: Path | None = None
        self.port: int | None = None
        self.url: str | None = None
        self.postmaster_pid: int | None = None

    @property
    def data_dir(self) -> Path:
        assert self.tmp is not None
        return self.tmp / "data"

    @property
    def log_file(self) -> Path:
        assert self.tmp is not None
        return self.tmp / "server.log"

    def _run(self, tool: str, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        cmd = [str(self.bin_dir / tool), *args]
        if self.as_root:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        proc = subprocess.run(
            cmd,
            cwd=self.tmp,  # postgres cannot chdir into root's cwd
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            timeout=self.start_timeout + 30,
        )
        if check and proc.returncode != 0:
            raise RuntimeError(
                f"{' '.join(cmd)} exited {proc.returncode}\n{proc.stdout}\n{proc.stderr}\n"
                f"{self._log_tail()}"
            )
        return proc

    def _log_tail(self) -> str:
        try:
            return self.log_file.read_text(errors="replace")[-4000:]
        except OSError:
            return ""

    def start(self) -> str:
        self.tmp = Path(tempfile.mkdtemp(prefix="relgate-pg-"))
        if self.as_root:
            pw = pwd.getpwnam("postgres")
            os.chown(self.tmp, pw.pw_uid, pw.pw_gid)
        self._run(
            "initdb",
            "-D",
            str(self.data_dir),
            "-A",
            "trust",
            "-U",
            "postgres",
            "--no-sync",
            "-E",
            "UTF8",
            "--locale=C",
        )
        last_error: Exception | None = None
        for _attempt in range(3):  # the probed port can be taken before the server binds
            self.port = free_port()
            options = f"-p {self.port} -k {self.tmp} -c listen_addresses=127.0.0.1 -c fsync=off"
            try:
                self._run(
                    "pg_ctl",
                    "-D",
                    str(self.data_dir),
                    "-l",  # without a log file the postmaster would hold our pipes open
                    str(self.log_file),
                    "-o",
                    options,
                    "-w",
                    "-t",
                    str(self.start_timeout),
                    "start",
                )
            except RuntimeError as exc:
                last_error = exc
                self._stop_server()
                continue
            self.postmaster_pid = self._read_postmaster_pid()
            server_url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"
            _admin_execute(server_url, f'CREATE DATABASE "{TEST_DATABASE}"')
            self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/{TEST_DATABASE}"
            return self.url
        raise RuntimeError(f"PostgreSQL did not start: {last_error}")

    def _read_postmaster_pid(self) -> int | None:
        try:
            first = (self.data_dir / "postmaster.pid").read_text().splitlines()[0]
        except (OSError, IndexError):
            return None
        return int(first) if first.strip().isdigit() else None

    def _stop_server(self) -> None:
        pid = self._read_postmaster_pid() or self.postmaster_pid
        if self.tmp is not None and self.data_dir.exists():
            self._run(
                "pg_ctl", "-D", str(self.data_dir), "stop", "-m", "immediate", "-w", check=False
            )
        if pid is not None and pid_alive(pid) and _is_postgres(pid):
            kill_pid(pid, grace=2.0)
        self.postmaster_pid = None

    def stop(self) -> None:
        try:
            self._stop_server()
        finally:
            if self.tmp is not None:
                shutil.rmtree(self.tmp, ignore_errors=True)
            self.tmp = None
            self.url = None
