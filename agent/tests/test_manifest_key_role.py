"""A checkpoint manifest verifies only under a trusted key of a role that may sign it (the
builder), exactly like every other signed document: the same key under an unroled file name
or another role's file name is refused with check ``key-role``, by the library and by
``relgate-agent manifest verify`` (exit 3)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from relgate_trust import dsse
from relgate_trust.manifest import (
    PAYLOAD_TYPE,
    SIGNER_ROLES,
    TrustedKeys,
    build_manifest,
    generate_private_key,
    keyid_for,
    load_private_key,
    sign_manifest,
    verify_envelope,
    write_envelope,
    write_keypair,
)

from relgate_agent.cli import EXIT_OK, EXIT_REJECTED, main

KiB = 1024


@pytest.fixture
def signed(tmp_path: Path) -> tuple[Path, Path]:
    """(signed envelope, the signer's public key PEM) from real files: a key pair written
    as keygen writes it, a checkpoint directory, its manifest signed with the private key."""
    keys = tmp_path / "keys"
    write_keypair(generate_private_key(), keys / "signer.key", keys / "builder-v1.pem")
    ckpt = tmp_path / "ckpt"
    ckpt.mkdir()
    (ckpt / "weights.bin").write_bytes(bytes(range(256)) * 40)
    m = build_manifest(ckpt, "m", "v1", chunk_size=4 * KiB, block_size=1 * KiB)
    env = tmp_path / "manifest.dsse.json"
    write_envelope(sign_manifest(m, load_private_key(keys / "signer.key")), env)
    return env, keys / "builder-v1.pem"


def _trusted_as(tmp_path: Path, pem: Path, name: str) -> Path:
    trusted = tmp_path / f"trusted-{name}"
    trusted.mkdir()
    (trusted / name).write_bytes(pem.read_bytes())
    return trusted


def _cli_verify(
    capsys: pytest.CaptureFixture[str], env: Path, trusted: Path
) -> tuple[int, dict[str, object]]:
    rc = main(["--json", "manifest", "verify", str(env), "--trusted-keys", str(trusted)])
    lines = capsys.readouterr().out.strip().splitlines()
    return rc, json.loads(lines[-1]) if lines else {}


def test_only_the_builder_role_signs_checkpoint_manifests() -> None:
    assert SIGNER_ROLES == (dsse.Role.BUILDER,) == tuple(dsse.roles_for(PAYLOAD_TYPE))
    assert None not in SIGNER_ROLES


@pytest.mark.parametrize(
    "name", ["builder-v1.pem", "builder-v2-prod.pem", "builder-v7-0123456789abcdef.pem"]
)
def test_the_key_under_a_builder_file_name_verifies(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], signed: tuple[Path, Path], name: str
) -> None:
    env, pem = signed
    trusted = _trusted_as(tmp_path, pem, name)
    got = verify_envelope(env.read_bytes(), trusted)
    assert got.model == "m"
    rc, out = _cli_verify(capsys, env, trusted)
    assert rc == EXIT_OK and out["manifestDigest"] == got.digest


@pytest.mark.parametrize(
    ("name", "role"),
    [
        ("signer.pem", "unroled"),  # what keygen wrote before it named keys for their role
        ("builder.pem", "unroled"),  # no version: not a role name
        ("builder-v0.pem", "unroled"),
        ("verifier-v1.pem", "verifier"),
        ("approver-v1.pem", "approver"),
        ("gate-v3-x.pem", "gate"),
    ],
)
def test_the_same_key_unroled_or_of_another_role_is_refused_key_role(
    tmp_path: Path,
    capsys: pytest.CaptureFixture[str],
    signed: tuple[Path, Path],
    name: str,
    role: str,
) -> None:
    env, pem = signed
    trusted = _trusted_as(tmp_path, pem, name)
    with pytest.raises(dsse.DsseError) as err:
        verify_envelope(env.read_bytes(), trusted)
    assert err.value.check == "key-role" and f"key role {role} " in err.value.reason
    assert err.value.keyid == keyid_for(load_private_key(pem.parent / "signer.key").public_key())
    rc, out = _cli_verify(capsys, env, trusted)
    assert rc == EXIT_REJECTED and out["check"] == "key-role" and out["error"] == "rejected"
    assert "check=key-role" in str(out["message"])


def test_an_unroled_pem_is_trusted_only_when_given_the_builder_role(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], signed: tuple[Path, Path]
) -> None:
    """Giving an unroled PEM a role explicitly (``builder=PATH``) is the one way to trust it."""
    env, pem = signed
    unroled = _trusted_as(tmp_path, pem, "signer.pem") / "signer.pem"
    assert [k.role for k in TrustedKeys.load(unroled).keys.values()] == [None]
    assert verify_envelope(env.read_bytes(), [f"builder={unroled}"]).model == "m"
    with pytest.raises(dsse.DsseError) as err:
        verify_envelope(env.read_bytes(), [f"verifier={unroled}"])
    assert err.value.check == "key-role"
    rc, _ = _cli_verify(capsys, env, Path(f"builder={unroled}"))
    assert rc == EXIT_OK
