"""The coordinator's store as a PostgreSQL server on the lab network (root only).

With SQLite every replica reaches the store through the file system, so a replica whose
network link is dropped still renews its lease and nobody takes over. A real fleet's store
is a server on the network: cut a replica off and it loses the store with everything else.
This runs one throwaway PostgreSQL (``fsync=off``) as the ``postgres`` user in a namespace
of the lab, listening on the lab address it is given; the replicas connect over TCP.

Both ends give up on a silent peer in seconds, as a deployment must: the server drops a
session whose client stopped acknowledging (``tcp_user_timeout``, keepalives) or sits idle
in a transaction, so a cut-off leader never holds a row lock the next leader waits on; the
client (:data:`DSN_OPTIONS`) fails a call after ``tcp_user_timeout``, so a cut-off leader's
lease renewal fails (and it steps down) instead of hanging until the kernel gives up.
"""

from __future__ import annotations

import contextlib
import glob
import os
import shutil
import subprocess
import tempfile
import time
from pathlib import Path

import psycopg

from relgate_agent.errors import AgentError

PG_PORT = 5432
PG_TIMEOUT_MS = 3000  # either end gives up on a peer that stops acknowledging this long
DSN_OPTIONS = (
    f"connect_timeout=3&tcp_user_timeout={PG_TIMEOUT_MS}"
    "&keepalives=1&keepalives_idle=2&keepalives_interval=1&keepalives_count=2"
)
_SERVER_SETTINGS = (
    "fsync=off",
    f"idle_in_transaction_session_timeout={PG_TIMEOUT_MS}",
    f"tcp_user_timeout={PG_TIMEOUT_MS}",
    "tcp_keepalives_idle=2",
    "tcp_keepalives_interval=1",
    "tcp_keepalives_count=2",
)


def pg_bindir() -> Path | None:
    """The PostgreSQL server binaries (Debian's versioned directory, else on PATH)."""
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/postgres"))
    if found:
        return Path(found[-1]).parent
    exe = shutil.which("postgres")
    return Path(exe).parent if exe else None


def _as_postgres(*cmd: str) -> list[str]:
    """``cmd`` run as the ``postgres`` user, exec'd in place (the pid is the server's)."""
    return ["setpriv", "--reuid=postgres", "--regid=postgres", "--init-groups", "--", *cmd]


def prepare(trusted_net: str) -> tuple[Path, Path]:
    """A fresh data directory owned by ``postgres`` (clients from ``trusted_net`` trusted);
    (its base directory, which also holds the unix socket; the server binary)."""
    bindir = pg_bindir()
    if bindir is None or shutil.which("setpriv") is None:
        raise AgentError("the lab's PostgreSQL store needs the server binaries and setpriv")
    base = Path(tempfile.mkdtemp(prefix="rgl-pg-"))
    os.chmod(base, 0o755)  # noqa: S103 - the postgres user must reach its data directory
    shutil.chown(base, "postgres")
    data = base / "data"
    cmd = _as_postgres(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres")
    res = subprocess.run([*cmd, "-N"], check=False, capture_output=True, text=True, timeout=120)  # noqa: S603 - an argv list we built
    if res.returncode != 0:
        shutil.rmtree(base, ignore_errors=True)
        raise AgentError(f"initdb failed: {res.stderr.strip()[-500:]}")
    with open(data / "pg_hba.conf", "a") as fh:
        fh.write(f"host all all {trusted_net} trust\n")
    return base, bindir / "postgres"


def server_argv(base: Path, server: Path, listen: str) -> list[str]:
    """The server's command line (foreground), listening on ``listen`` and in ``base``."""
    settings = [a for s in _SERVER_SETTINGS for a in ("-c", s)]
    return _as_postgres(
        str(server),
        "-D",
        str(base / "data"),
        "-p",
        str(PG_PORT),
        "-c",
        f"listen_addresses={listen}",
        "-c",
        f"unix_socket_directories={base}",
        *settings,
    )


def wait_ready(base: Path, proc: subprocess.Popen[bytes], timeout: float = 60.0) -> None:
    """Until the server accepts a connection on its unix socket (it crosses namespaces)."""
    deadline = time.monotonic() + timeout
    while True:
        if proc.poll() is not None:
            raise AgentError(f"postgres exited ({proc.returncode}); see its log")
        with contextlib.suppress(psycopg.OperationalError):
            psycopg.connect(
                host=str(base), port=PG_PORT, user="postgres", dbname="postgres"
            ).close()
            return
        if time.monotonic() > deadline:
            raise AgentError("postgres did not start accepting connections")
        time.sleep(0.2)


def dsn(address: str) -> str:
    """The replicas' DSN for the server at ``address`` (TCP, bounded waits)."""
    return f"postgresql://postgres@{address}:{PG_PORT}/postgres?{DSN_OPTIONS}"


__all__ = ["DSN_OPTIONS", "PG_PORT", "dsn", "pg_bindir", "prepare", "server_argv", "wait_ready"]
