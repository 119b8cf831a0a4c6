from __future__ import annotations

import glob
import hashlib
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# The lab and fault injection live outside the installed package (agent/lab/relgate_lab).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))

import numpy as np
import pytest
from agent_harness import Cluster, write_checkpoint
from relgate_trust.manifest import (
    build_manifest,
    generate_private_key,
    sign_manifest,
    write_envelope,
    write_keypair,
)

KiB = 1024
MiB = 1024 * KiB


@pytest.fixture
def keypair(tmp_path: Path):
    key = generate_private_key()
    keys = tmp_path / "keys"
    keys.mkdir()
    write_keypair(key, keys / "signer.key", keys / "builder-v1.pem")
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    os.link(keys / "builder-v1.pem", trusted / "builder-v1.pem")
    return key, keys / "signer.key", trusted


CHECKPOINT_SIZES = {
    "model-00001-of-00003.safetensors": 10 * MiB + 123,
    "model-00002-of-00003.safetensors": 9 * MiB,
    "model-00003-of-00003.safetensors": 5 * MiB - 7,
    "config.json": 513,
}


@pytest.fixture(scope="session")
def checkpoint_files(tmp_path_factory) -> Path:
    """The deterministic checkpoint bytes, generated once (24 MiB of pseudo-random data);
    each test gets its own copy (tests rot origin files on purpose)."""
    return write_checkpoint(tmp_path_factory.mktemp("checkpoint") / "ckpt", CHECKPOINT_SIZES)


@pytest.fixture
def checkpoint(tmp_path: Path, keypair, checkpoint_files: Path) -> dict[str, Any]:
    key, _, trusted = keypair
    src = tmp_path / "origin" / "ckpt"
    shutil.copytree(checkpoint_files, src)
    m = build_manifest(src, "claude-x", "2026-10-12.3", chunk_size=1 * MiB, block_size=64 * KiB)
    env_path = tmp_path / "origin" / "manifest.dsse.json"
    write_envelope(sign_manifest(m, key), env_path)
    digests = {f.path: hashlib.sha256((src / f.path).read_bytes()).hexdigest() for f in m.files}
    return {
        "manifest": m,
        "envelope": env_path,
        "origin": src,
        "trusted": trusted,
        "digests": digests,
    }


def write_bf16(path: Path, size: int, seed: int) -> None:
    """bf16 weights (the high halves of normal float32s): compressible once byte-split."""
    rng = np.random.default_rng(seed)
    w = (rng.standard_normal(size // 2).astype(np.float32) * 0.02).view(np.uint32)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes((w >> 16).astype(np.uint16).tobytes())


@pytest.fixture
def bf16_checkpoint(tmp_path: Path, keypair) -> dict[str, Any]:
    """8 MiB of bf16 weights in three files (1 MiB chunks, 64 KiB blocks), signed."""
    key, _, trusted = keypair
    src = tmp_path / "origin" / "ckpt"
    for i, size in enumerate((3 * MiB, 3 * MiB, 2 * MiB)):
        write_bf16(src / f"model-{i:05d}.safetensors", size, seed=i)
    m = build_manifest(src, "claude-x", "2026-10-12.3", chunk_size=1 * MiB, block_size=64 * KiB)
    env = tmp_path / "origin" / "manifest.dsse.json"
    write_envelope(sign_manifest(m, key), env)
    digests = {f.path: hashlib.sha256((src / f.path).read_bytes()).hexdigest() for f in m.files}
    return {"manifest": m, "envelope": env, "origin": src, "trusted": trusted, "digests": digests}


# ------------------------------------------------------------------------------ PostgreSQL


def _pg_bin() -> Path | None:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/pg_ctl"))
    return Path(found[-1]).parent if found else None


def _as_pg(*cmd: str) -> None:
    subprocess.run(
        ["runuser", "-u", "postgres", "--", *cmd], check=True, capture_output=True, timeout=120
    )


@pytest.fixture(scope="session")
def pg_server() -> Iterator[str]:
    """One throwaway PostgreSQL for the session (``fsync=off``: tests survive no power loss);
    the URL of its ``postgres`` database.  Each module gets its own database (``pg_dsn``)."""
    if os.environ.get("RELGATE_TEST_PG_DSN"):
        yield os.environ["RELGATE_TEST_PG_DSN"]
        return
    pytest.importorskip("psycopg")
    bindir = _pg_bin()
    if bindir is None or os.geteuid() != 0 or shutil.which("runuser") is None:
        pytest.skip("PostgreSQL binaries (run as root via runuser) or RELGATE_TEST_PG_DSN needed")
    base = Path(tempfile.mkdtemp(prefix="relgate-agent-pg-"))
    os.chmod(base, 0o755)  # noqa: S103 - the postgres user must reach its data dir
    data = base / "data"
    shutil.chown(base, "postgres")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    try:
        _as_pg(str(bindir / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-N")
        _as_pg(
            str(bindir / "pg_ctl"),
            "-D",
            str(data),
            "-l",
            str(base / "pg.log"),
            "-o",
            f"-p {port} -k {base} -c listen_addresses=127.0.0.1 -c fsync=off",
            "-w",
            "start",
        )
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        if (data / "postmaster.pid").exists():
            _as_pg(str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop")
        shutil.rmtree(base, ignore_errors=True)


def _admin(server_url: str, statement: str) -> None:
    import psycopg

    with psycopg.connect(server_url, autocommit=True, connect_timeout=10) as conn:
        conn.execute(statement)


@pytest.fixture(scope="module")
def pg_dsn(pg_server: str) -> Iterator[str]:
    """A database of its own for each test module on the session's server (an external
    ``RELGATE_TEST_PG_DSN`` is used as it is, as before)."""
    if os.environ.get("RELGATE_TEST_PG_DSN"):
        yield pg_server
        return
    name = f"relgate_agent_{uuid.uuid4().hex}"
    _admin(pg_server, f'CREATE DATABASE "{name}"')
    try:
        yield pg_server.rsplit("/", 1)[0] + "/" + name
    finally:
        _admin(pg_server, f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture
def cluster(tmp_path: Path, checkpoint: dict[str, Any]) -> Iterator[Cluster]:
    """A fleet in processes on loopback (coordinator and agents started by the test), with
    a 3 s dead-after and 0.5 s reports; stopped by PID at the end."""
    c = Cluster(
        tmp_path / "cluster",
        checkpoint["trusted"],
        ["--dead-after", "3", "--report-interval", "0.5"],
    )
    try:
        yield c
    finally:
        c.stop_all()
