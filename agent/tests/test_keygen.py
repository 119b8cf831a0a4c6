"""``relgate-agent keygen`` through the real CLI: atomic, rerunnable, never clobbering a key."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from relgate_trust.manifest import generate_private_key, keyid_for, load_private_key

from relgate_agent.cli import EXIT_OK, EXIT_REJECTED


def _keygen(*argv: str) -> tuple[int, dict[str, object]]:
    proc = subprocess.run(
        [sys.executable, "-m", "relgate_agent", "--json", "keygen", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, json.loads(lines[-1]) if lines else {}


def _public_keyid(path: Path) -> str:
    key = serialization.load_pem_public_key(path.read_bytes())
    assert isinstance(key, Ed25519PublicKey)
    return keyid_for(key)


def test_missing_public_directory_is_created_and_the_pair_matches(tmp_path: Path) -> None:
    priv, pub = tmp_path / "keys" / "signer.key", tmp_path / "trusted" / "deep" / "signer.pem"
    rc, out = _keygen("--private", str(priv), "--public", str(pub))
    assert rc == EXIT_OK and out["created"] is True
    assert _public_keyid(pub) == keyid_for(load_private_key(priv).public_key()) == out["keyid"]
    assert priv.stat().st_mode & 0o777 == 0o600
    leftovers = [p.name for p in (*priv.parent.iterdir(), *pub.parent.iterdir())]
    assert sorted(leftovers) == ["signer.key", "signer.pem"]  # no temporary files left


def test_a_complete_pair_is_refused_naming_the_file_and_force_rotates(tmp_path: Path) -> None:
    priv, pub = tmp_path / "s.key", tmp_path / "trusted" / "s.pem"
    rc, first = _keygen("--private", str(priv), "--public", str(pub))
    assert rc == EXIT_OK
    before = priv.read_bytes()
    rc, out = _keygen("--private", str(priv), "--public", str(pub))
    assert rc == EXIT_REJECTED and out["check"] == "key-exists"
    assert str(priv) in str(out["message"]) and str(first["keyid"]) in str(out["message"])
    assert priv.read_bytes() == before
    rc, rotated = _keygen("--private", str(priv), "--public", str(pub), "--force")
    assert rc == EXIT_OK and rotated["keyid"] != first["keyid"]
    assert _public_keyid(pub) == rotated["keyid"]


def test_a_private_key_without_its_public_half_is_completed_not_replaced(tmp_path: Path) -> None:
    """What the old keygen left when the public key's directory was missing."""
    key = generate_private_key()
    priv, pub = tmp_path / "s.key", tmp_path / "missing-dir" / "s.pem"
    pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    fd = os.open(priv, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as fh:
        fh.write(pem)
    rc, out = _keygen("--private", str(priv), "--public", str(pub))
    assert rc == EXIT_OK and out == {
        "keyid": keyid_for(key.public_key()),
        "private": str(priv),
        "public": str(pub),
        "created": False,
    }
    assert priv.read_bytes() == pem and _public_keyid(pub) == out["keyid"]
    pub.write_bytes(b"-----BEGIN PUBLIC KEY-----\nMCow")  # a torn public key: rewritten
    rc, out = _keygen("--private", str(priv), "--public", str(pub))
    assert rc == EXIT_OK and out["created"] is False and _public_keyid(pub) == out["keyid"]


def test_torn_or_empty_private_keys_from_a_crash_never_block_a_rerun(tmp_path: Path) -> None:
    for i, torn in enumerate([b"", b"-----BEGIN PRIV", b"-----BEGIN PRIVATE KEY-----\nMC4CAQAw"]):
        priv, pub = tmp_path / f"{i}.key", tmp_path / f"{i}.pem"
        priv.write_bytes(torn)
        pub.write_bytes(b"stale")
        rc, out = _keygen("--private", str(priv), "--public", str(pub))
        assert rc == EXIT_OK and out["created"] is True, torn
        assert keyid_for(load_private_key(priv).public_key()) == _public_keyid(pub) == out["keyid"]


def test_foreign_files_are_refused_untouched(tmp_path: Path) -> None:
    ec_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    priv, pub = tmp_path / "tls.key", tmp_path / "tls.pem"
    priv.write_bytes(ec_pem)
    rc, out = _keygen("--private", str(priv), "--public", str(pub))
    assert rc == EXIT_REJECTED and out["check"] == "not-ed25519-private-key"
    assert str(priv) in str(out["message"]) and priv.read_bytes() == ec_pem and not pub.exists()
    mine, other = tmp_path / "a.key", tmp_path / "b.pem"
    assert _keygen("--private", str(mine), "--public", str(other))[0] == EXIT_OK
    third = tmp_path / "c.pem"
    assert _keygen("--private", str(tmp_path / "c.key"), "--public", str(third))[0] == EXIT_OK
    held = third.read_bytes()
    rc, out = _keygen("--private", str(mine), "--public", str(third))
    assert rc == EXIT_REJECTED and out["check"] == "public-key-mismatch"
    assert str(third) in str(out["message"]) and third.read_bytes() == held
