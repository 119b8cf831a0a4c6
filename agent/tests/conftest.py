from __future__ import annotations

import os
from pathlib import Path

import pytest
from relgate_agent.manifest import generate_private_key, write_keypair


def write_checkpoint(root: Path, sizes: dict[str, int], seed: int = 7) -> Path:
    """Deterministic pseudo-random checkpoint files (not compressible, not all zeros)."""
    import random

    rng = random.Random(seed)
    for rel, size in sizes.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(size))
    return root


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
