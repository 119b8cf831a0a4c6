from __future__ import annotations

import base64
import hashlib
import json
from pathlib import Path

import pytest
import rfc8785
from agent_harness import write_checkpoint
from relgate_trust.errors import ManifestError, VerificationError
from relgate_trust.manifest import (
    CheckpointManifest,
    TrustedKeys,
    build_manifest,
    crc32c,
    generate_private_key,
    keyid_for,
    load_private_key,
    pae,
    sign_manifest,
    validate_name,
    verify_envelope,
)

from relgate_agent.dataplane.origin import LocalDirOrigin, ManifestReader

KiB = 1024


def _ckpt(tmp_path: Path) -> Path:
    return write_checkpoint(
        tmp_path / "ckpt",
        {
            "model-00001.safetensors": 300 * KiB + 5,
            "sub/model-00002.safetensors": 129 * KiB,
            "empty.json": 0,
            "tok.json": 77,
        },
    )


def test_build_geometry_and_hashes(tmp_path: Path) -> None:
    d = _ckpt(tmp_path)
    m = build_manifest(d, "claude-x", "2026-10-12.3", chunk_size=128 * KiB, block_size=32 * KiB)
    data = b"".join((d / f.path).read_bytes() for f in m.files)
    assert [f.path for f in m.files] == sorted(f.path for f in m.files)
    assert m.total_size == len(data)
    assert m.num_chunks == -(-len(data) // (128 * KiB))
    for c in m.chunks:
        piece = data[c.offset : c.offset + c.size]
        assert c.digest == "sha256:" + hashlib.sha256(piece).hexdigest()
        for j, b in enumerate(m.chunk_blocks(c.index)):
            off, n = m.block_range(b)
            assert crc32c(data[off : off + n]) == c.block_crc32c[j]
    # stripes partition the blocks
    all_blocks = sorted(b for s in range(3) for b in m.stripe_blocks(s, 3))
    assert all_blocks == list(range(m.num_blocks))
    # ranged reads through the origin reproduce the concatenated space across file borders
    reader = ManifestReader(LocalDirOrigin(d), m)
    assert reader.read(300 * KiB - 10, 40) == data[300 * KiB - 10 : 300 * KiB + 30]
    # digest excludes manifestId and is stable through a JSON round trip
    doc = m.to_json()
    assert doc["manifestId"] == m.digest
    assert CheckpointManifest.from_json(json.loads(rfc8785.dumps(doc))).digest == m.digest


@pytest.mark.parametrize("bad", ["", "..", "a/b", "a..b", "x\x00", "x\n", "/abs", "a\\b"])
def test_bad_names_refused(tmp_path: Path, bad: str) -> None:
    d = _ckpt(tmp_path)
    with pytest.raises(ManifestError):
        validate_name("model", bad)
    with pytest.raises(ManifestError):
        build_manifest(d, bad, "v1", chunk_size=64 * KiB, block_size=16 * KiB)
    with pytest.raises(ManifestError):
        build_manifest(d, "m", bad, chunk_size=64 * KiB, block_size=16 * KiB)


def test_chunk_must_be_multiple_of_block(tmp_path: Path) -> None:
    with pytest.raises(ManifestError):
        build_manifest(_ckpt(tmp_path), "m", "v", chunk_size=100 * KiB, block_size=32 * KiB)


def test_sign_verify_roundtrip_and_dsse_format(tmp_path: Path, keypair) -> None:
    key, key_path, trusted = keypair
    m = build_manifest(_ckpt(tmp_path), "m", "v1", chunk_size=64 * KiB, block_size=16 * KiB)
    env = sign_manifest(m, load_private_key(key_path))
    assert env["payloadType"] == "application/vnd.relgate.checkpoint.manifest.v1+json"
    payload = base64.standard_b64decode(env["payload"])
    assert payload == rfc8785.dumps(m.to_json())
    (sig,) = env["signatures"]
    raw = key.public_key().public_bytes_raw()
    assert (
        sig["keyid"] == "sha256:" + hashlib.sha256(raw).hexdigest() == keyid_for(key.public_key())
    )
    key.public_key().verify(
        base64.standard_b64decode(sig["sig"]),
        b"DSSEv1 %d %s %d %s"
        % (len(env["payloadType"]), env["payloadType"].encode(), len(payload), payload),
    )
    assert pae(env["payloadType"], payload).startswith(b"DSSEv1 ")
    got = verify_envelope(json.dumps(env), [trusted])
    assert got == m
    assert got.digest == m.digest


def _tamper(env: dict, mutate) -> dict:
    doc = json.loads(base64.standard_b64decode(env["payload"]))
    mutate(doc)
    out = dict(env)
    out["payload"] = base64.standard_b64encode(rfc8785.dumps(doc)).decode()
    return out


def test_tampered_unsigned_unknown_refused(tmp_path: Path, keypair) -> None:
    key, _, trusted = keypair
    m = build_manifest(_ckpt(tmp_path), "m", "v1", chunk_size=64 * KiB, block_size=16 * KiB)
    env = sign_manifest(m, key)

    def flip_digest(doc: dict) -> None:
        doc["chunks"][0]["digest"] = "sha256:" + "0" * 64

    with pytest.raises(VerificationError, match="tampered"):
        verify_envelope(_tamper(env, flip_digest), trusted)
    with pytest.raises(VerificationError, match="unsigned"):
        verify_envelope({**env, "signatures": []}, trusted)
    other = sign_manifest(m, generate_private_key())
    with pytest.raises(VerificationError, match="trusted key"):
        verify_envelope(other, trusted)
    with pytest.raises(VerificationError):
        verify_envelope({**env, "payloadType": "application/json"}, trusted)
    with pytest.raises(VerificationError, match="empty"):
        verify_envelope(env, [])
    # a signer that signs a manifest with a traversal name is still refused
    evil = _tamper(env, lambda d: d.update(version=".."))
    evil["signatures"] = sign_manifest(m, key)["signatures"]  # signature now mismatches
    with pytest.raises(VerificationError):
        verify_envelope(evil, TrustedKeys.load(trusted))


def test_signed_traversal_manifest_refused(tmp_path: Path, keypair) -> None:
    """Even a validly signed payload naming '..' is refused (the signer is not trusted for paths)."""
    key, _, trusted = keypair
    m = build_manifest(_ckpt(tmp_path), "m", "v1", chunk_size=64 * KiB, block_size=16 * KiB)
    doc = m.to_json()
    doc["files"][0]["path"] = "../../etc/passwd"
    payload = rfc8785.dumps(doc)
    env = {
        "payloadType": "application/vnd.relgate.checkpoint.manifest.v1+json",
        "payload": base64.standard_b64encode(payload).decode(),
        "signatures": [
            {
                "keyid": keyid_for(key.public_key()),
                "sig": base64.standard_b64encode(
                    key.sign(pae("application/vnd.relgate.checkpoint.manifest.v1+json", payload))
                ).decode(),
            }
        ],
    }
    with pytest.raises(VerificationError, match="invalid"):
        verify_envelope(env, trusted)
