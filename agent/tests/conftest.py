from __future__ import annotations

import hashlib
import os
import shutil
import sys
from pathlib import Path
from typing import Any

# The lab and fault injection live outside the installed package (agent/lab/relgate_lab).
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "lab"))

import pytest
from agent_harness import write_checkpoint

from relgate_agent.manifest import (
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
    write_keypair(key, keys / "signer.key", keys / "signer.pem")
    trusted = tmp_path / "trusted"
    trusted.mkdir()
    os.link(keys / "signer.pem", trusted / "signer.pem")
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
