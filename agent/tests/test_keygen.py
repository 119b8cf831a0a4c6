"""``relgate-agent keygen`` through the real CLI: atomic, rerunnable, never clobbering a key,
and writing only a public key file named for the builder role."""

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

from relgate_agent.cli import EXIT_OK, EXIT_REJECTED, EXIT_USAGE


def _agent(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "relgate_agent", "--json", *argv],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def _keygen(*argv: str) -> tuple[int, dict[str, object]]:
    proc = _agent("keygen", *argv)
    lines = proc.stdout.strip().splitlines()
    return proc.returncode, json.loads(lines[-1]) if lines else {}


def _public_keyid(path: Path) -> str:
    key = serialization.load_pem_public_key(path.read_bytes())
    assert isinstance(key, Ed25519PublicKey)
    return keyid_for(key)


def test_missing_public_directory_is_created_and_the_pair_matches(tmp_path: Path) -> None:
    priv, pub = tmp_path / "keys" / "signer.key", tmp_path / "trusted" / "deep" / "builder-v1.pem"
    rc, out = _keygen("--private", str(priv), "--public", str(pub))
    assert rc == EXIT_OK and out["created"] is True
    assert _public_keyid(pub) == keyid_for(load_private_key(priv).public_key()) == out["keyid"]
    assert priv.stat().st_mode & 0o777 == 0o600
    leftovers = [p.name for p in (*priv.parent.iterdir(), *pub.parent.iterdir())]
    assert sorted(leftovers) == ["builder-v1.pem", "signer.key"]  # no temporary files left


def test_a_complete_pair_is_refused_naming_the_file_and_force_rotates(tmp_path: Path) -> None:
    priv, pub = tmp_path / "s.key", tmp_path / "trusted" / "builder-v1.pem"
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
    priv, pub = tmp_path / "s.key", tmp_path / "missing-dir" / "builder-v1.pem"
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
        priv, pub = tmp_path / f"{i}.key", tmp_path / f"builder-v1-{i}.pem"
        priv.write_bytes(torn)
        pub.write_bytes(b"stale")
        rc, out = _keygen("--private", str(priv), "--public", str(pub))
        assert rc == EXIT_OK and out["created"] is True, torn
        assert keyid_for(load_private_key(priv).public_key()) == _public_keyid(pub) == out["keyid"]


def test_foreign_files_are_refused_untouched(tmp_path: Path) -> None:
    ec_pem = ec.generate_private_key(ec.SECP256R1()).private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )
    priv, pub = tmp_path / "tls.key", tmp_path / "builder-v1-tls.pem"
    priv.write_bytes(ec_pem)
    rc, out = _keygen("--private", str(priv), "--public", str(pub))
    assert rc == EXIT_REJECTED and out["check"] == "not-ed25519-private-key"
    assert str(priv) in str(out["message"]) and priv.read_bytes() == ec_pem and not pub.exists()
    mine, other = tmp_path / "a.key", tmp_path / "builder-v1-b.pem"
    assert _keygen("--private", str(mine), "--public", str(other))[0] == EXIT_OK
    third = tmp_path / "builder-v1-c.pem"
    assert _keygen("--private", str(tmp_path / "c.key"), "--public", str(third))[0] == EXIT_OK
    held = third.read_bytes()
    rc, out = _keygen("--private", str(mine), "--public", str(third))
    assert rc == EXIT_REJECTED and out["check"] == "public-key-mismatch"
    assert str(third) in str(out["message"]) and third.read_bytes() == held


def test_a_public_key_file_not_named_for_the_builder_role_is_a_usage_error_writing_nothing(
    tmp_path: Path,
) -> None:
    """An unroled name (the old ``signer.pem``), another role's name, or a path that is
    neither a directory nor a builder key file: exit 2 naming the pattern, nothing written
    (no private key, no public key, no directory)."""
    priv = tmp_path / "keys" / "signer.key"
    for public in (
        tmp_path / "trusted" / "signer.pem",
        tmp_path / "trusted" / "verifier-v1.pem",
        tmp_path / "trusted" / "builder-v0.pem",
        tmp_path / "trusted",  # not there and no trailing '/': a file name, unroled
    ):
        proc = _agent("keygen", "--private", str(priv), "--public", str(public))
        assert proc.returncode == EXIT_USAGE, public
        assert proc.stdout == "" and "builder-v<N>[-<anything>].pem" in proc.stderr, public
        assert str(public) in proc.stderr
        assert sorted(p.name for p in tmp_path.iterdir()) == [], public
    assert (
        "verifier key may not sign checkpoint manifests"
        in _agent(
            "keygen", "--private", str(priv), "--public", str(tmp_path / "verifier-v1.pem")
        ).stderr
    )


def test_keygen_into_a_directory_writes_the_builder_key_and_the_pair_verifies_end_to_end(
    tmp_path: Path,
) -> None:
    """keygen -> manifest build -> manifest verify through the real CLI: the directory gets
    builder-v1.pem, a manifest signed with the private key verifies under it, and the same
    public key under an unroled name is refused (key-role)."""
    trusted, priv = tmp_path / "trusted", tmp_path / "signer.key"
    trusted.mkdir()
    rc, out = _keygen("--private", str(priv), "--public", str(trusted))
    assert rc == EXIT_OK and out["created"] is True
    assert out["public"] == str(trusted / "builder-v1.pem")
    assert [p.name for p in trusted.iterdir()] == ["builder-v1.pem"]
    assert _public_keyid(trusted / "builder-v1.pem") == out["keyid"]
    # a directory named with a trailing '/' is created; a rerun finds the complete pair
    fresh = tmp_path / "new-trusted"
    rc, again = _keygen("--private", str(tmp_path / "b.key"), "--public", f"{fresh}/")
    assert rc == EXIT_OK and _public_keyid(fresh / "builder-v1.pem") == again["keyid"]
    rc, refused = _keygen("--private", str(priv), "--public", str(trusted))
    assert rc == EXIT_REJECTED and refused["check"] == "key-exists"

    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "weights.bin").write_bytes(os.urandom(5000))
    env = tmp_path / "manifest.dsse.json"
    proc = _agent(
        "manifest", "build", str(ckpt), "--model", "m", "--version", "v1",
        "--chunk-size", "4KiB", "--block-size", "1KiB", "--key", str(priv), "--out", str(env),
    )  # fmt: skip
    assert proc.returncode == EXIT_OK, proc.stderr
    digest = json.loads(proc.stdout)["manifestDigest"]
    proc = _agent("manifest", "verify", str(env), "--trusted-keys", str(trusted))
    assert proc.returncode == EXIT_OK, proc.stderr
    assert json.loads(proc.stdout)["manifestDigest"] == digest
    unroled = tmp_path / "plain"
    unroled.mkdir()
    (unroled / "signer.pem").write_bytes((trusted / "builder-v1.pem").read_bytes())
    proc = _agent("manifest", "verify", str(env), "--trusted-keys", str(unroled))
    assert proc.returncode == EXIT_REJECTED and json.loads(proc.stdout)["check"] == "key-role"
