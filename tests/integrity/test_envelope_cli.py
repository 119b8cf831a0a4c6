"""Hostile envelopes through BOTH command lines: ``relgate verify-manifest`` and
``relgate-agent manifest verify`` share one parser (relgate_trust.dsse) and refuse the same
inputs with exit 3 and the same check name.  Keys, roles, rotation and revocation through
``relgate key``."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from relgate_trust import dsse, jcs
from relgate_trust.manifest import PAYLOAD_TYPE as CHECKPOINT_TYPE
from relgate_trust.manifest import build_manifest, sign_manifest
from support.snapshots import build_validated
from support.workspaces import make_workspace

from relgate.catalog.audit import latest_report
from relgate.catalog.snapshot_table import get_snapshot
from relgate.documents import snapshot_manifest as sm
from relgate.gate.approvals import PAYLOAD_TYPE, verify_approval
from relgate.integrity.signing import Role, SigningKey
from relgate.workspace import Workspace

RELGATE = [sys.executable, "-m", "relgate.cli"]
AGENT = [sys.executable, "-m", "relgate_agent"]
REPORT_TYPE = "application/vnd.relgate.release-verification.v1+json"


def run(cmd: list[str], *args: str, expect: int, env: dict[str, str] | None = None) -> dict:
    proc = subprocess.run(
        [*cmd, *args, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "RELGATE_HASH_WORKERS": "1", **(env or {})},
        timeout=300,
    )
    assert proc.returncode == expect, (args, proc.returncode, proc.stdout, proc.stderr[-2000:])
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


def relgate(home: Path, *args: str, expect: int = 0, db_url: str = "") -> dict:
    env = {"RELGATE_CATALOG_URL": db_url} if db_url else {}
    return run(RELGATE, "--home", str(home), *args, expect=expect, env=env)


def agent_verify(envelope: Path, trusted: Path | str, expect: int) -> dict:
    # The agent CLI takes its options before the subcommand's arguments; --json is global.
    proc = subprocess.run(
        [*AGENT, "--json", "manifest", "verify", str(envelope), "--trusted-keys", str(trusted)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == expect, (proc.returncode, proc.stdout, proc.stderr[-2000:])
    return json.loads(proc.stdout.strip().splitlines()[-1])


# ------------------------------------------------------------------------------ fixtures


@pytest.fixture(scope="module")
def keys(tmp_path_factory) -> dict[str, object]:
    """A builder key (trusted as builder-v1-*.pem) and a verifier key, in one trusted dir."""
    base = tmp_path_factory.mktemp("keys")
    trusted = base / "trusted"
    trusted.mkdir()
    builder = SigningKey.generate(Role.BUILDER, 1)
    verifier = SigningKey.generate(Role.VERIFIER, 1)
    for k in (builder, verifier):
        assert k.role is not None
        (trusted / dsse.key_filename(k.role, k.version, k.keyid)).write_bytes(k.public_pem())
    return {"builder": builder, "verifier": verifier, "trusted": trusted, "base": base}


def _envelope(payload: bytes, key: SigningKey, payload_type: str) -> dict:
    return dsse.sign(payload_type, payload, key)


def _ckpt_dir(tmp_path: Path) -> Path:
    d = tmp_path / "ckpt"
    d.mkdir(exist_ok=True)
    (d / "w.bin").write_bytes(b"x" * 100)
    return d


def _checkpoint_payload(tmp_path: Path) -> dict:
    return build_manifest(_ckpt_dir(tmp_path), "m", "v1", chunk_size=64, block_size=32).to_json()


def _snapshot_payload() -> dict:
    return {"schema": sm.SCHEMA, "purpose": "demo", "snapshotId": "sha256:" + "0" * 64}


def _bad_payloads(doc: dict) -> dict[str, bytes]:
    """Signed-but-hostile payload bytes, keyed by the check that must refuse them."""
    canonical = jcs.dumps(doc)
    first = next(iter(sorted(doc)))
    dup = canonical[:1] + json.dumps(first).encode() + b':"evil",' + canonical[1:]
    return {
        "payload-duplicate-key": dup,
        "payload-canonical": json.dumps(doc, indent=2).encode(),
        "payload-float": canonical[:-1] + b',"zz":1.5}',
        "payload-integer-range": canonical[:-1] + b',"zz":9007199254740993}',
        "payload-depth": canonical[:-1] + b',"zz":' + b"[" * 200_000 + b"]" * 200_000 + b"}",
        "payload-json": b"\xff\xfe{",
    }


CASES = [
    "payload-duplicate-key",
    "payload-canonical",
    "payload-float",
    "payload-integer-range",
    "payload-depth",
    "payload-json",
]


def _write(path: Path, envelope: dict | bytes) -> Path:
    path.write_bytes(envelope if isinstance(envelope, bytes) else json.dumps(envelope).encode())
    return path


def _envelope_cases(good: dict) -> dict[str, bytes]:
    """Hostile envelopes (not payloads), keyed by the refusing check."""
    non_string_sig = json.loads(json.dumps(good))
    non_string_sig["signatures"][0]["sig"] = 12345
    keyid_list = json.loads(json.dumps(good))
    keyid_list["signatures"][0]["keyid"] = ["x"]
    unsigned = {**good, "signatures": []}
    dup_env = json.dumps(good)[:-1] + ', "payload": "e30="}'
    bad_b64 = {**good, "payload": good["payload"][:-2] + "!!"}
    return {
        "envelope-shape": json.dumps(non_string_sig).encode(),
        "envelope-shape-keyid": json.dumps(keyid_list).encode(),
        "signature-present": json.dumps(unsigned).encode(),
        "envelope-duplicate-key": dup_env.encode(),
        "envelope-depth": b"[" * 200_000 + b"]" * 200_000,
        "envelope-json": b'{"payloadType": ',
        "envelope-base64": json.dumps(bad_b64).encode(),
    }


# ------------------------------------------------------------------------------ both CLIs


@pytest.mark.parametrize("check", CASES)
def test_hostile_payload_refused_by_both_clis(tmp_path: Path, keys, check: str) -> None:
    builder = keys["builder"]
    assert isinstance(builder, SigningKey)
    core_env = _envelope(_bad_payloads(_snapshot_payload())[check], builder, sm.PAYLOAD_TYPE)
    core = relgate(
        tmp_path / "no-home",
        "verify-manifest",
        str(_write(tmp_path / "core.json", core_env)),
        "--trusted-key",
        str(keys["trusted"]),
        expect=3,
    )
    assert core["check"] == check and core["error"] == "rejected", core
    agent_env = _envelope(
        _bad_payloads(_checkpoint_payload(tmp_path))[check], builder, CHECKPOINT_TYPE
    )
    out = agent_verify(_write(tmp_path / "agent.json", agent_env), keys["trusted"], 3)
    assert out["check"] == check and out["error"] == "rejected", out


@pytest.mark.parametrize(
    "check",
    [
        "envelope-shape",
        "envelope-shape-keyid",
        "signature-present",
        "envelope-duplicate-key",
        "envelope-depth",
        "envelope-json",
        "envelope-base64",
    ],
)
def test_hostile_envelope_refused_by_both_clis(tmp_path: Path, keys, check: str) -> None:
    builder = keys["builder"]
    assert isinstance(builder, SigningKey)
    want = check.removesuffix("-keyid")
    canonical = jcs.dumps
    core_good = _envelope(canonical(_snapshot_payload()), builder, sm.PAYLOAD_TYPE)
    agent_good = _envelope(canonical(_checkpoint_payload(tmp_path)), builder, CHECKPOINT_TYPE)
    core_file = _write(tmp_path / "core.json", _envelope_cases(core_good)[check])
    agent_file = _write(tmp_path / "agent.json", _envelope_cases(agent_good)[check])
    core = relgate(
        tmp_path / "no-home",
        "verify-manifest",
        str(core_file),
        "--trusted-key",
        str(keys["trusted"]),
        expect=3,
    )
    assert core["check"] == want, core
    assert agent_verify(agent_file, keys["trusted"], 3)["check"] == want


def test_wrong_role_refused_by_both_clis(tmp_path: Path, keys) -> None:
    """A checkpoint or snapshot manifest signed by the verifier key: key-role."""
    verifier = keys["verifier"]
    assert isinstance(verifier, SigningKey)
    canonical = jcs.dumps
    core_env = _envelope(canonical(_snapshot_payload()), verifier, sm.PAYLOAD_TYPE)
    core = relgate(
        tmp_path / "no-home",
        "verify-manifest",
        str(_write(tmp_path / "c.json", core_env)),
        "--trusted-key",
        str(keys["trusted"]),
        expect=3,
    )
    assert core["check"] == "key-role" and core["digest"] == verifier.keyid
    agent_env = _envelope(canonical(_checkpoint_payload(tmp_path)), verifier, CHECKPOINT_TYPE)
    out = agent_verify(_write(tmp_path / "a.json", agent_env), keys["trusted"], 3)
    assert out["check"] == "key-role"


def test_tampered_payload_is_signature_valid_in_both(tmp_path: Path, keys) -> None:
    builder = keys["builder"]
    assert isinstance(builder, SigningKey)
    canonical = jcs.dumps
    for cmd, doc, ptype in (
        ("core", _snapshot_payload(), sm.PAYLOAD_TYPE),
        ("agent", _checkpoint_payload(tmp_path), CHECKPOINT_TYPE),
    ):
        env = _envelope(canonical(doc), builder, ptype)
        env["payload"] = base64.b64encode(canonical({**doc, "model": "evil"})).decode()
        path = _write(tmp_path / f"{cmd}.json", env)
        if cmd == "core":
            out = relgate(
                tmp_path / "x", "verify-manifest", str(path), "--trusted-key", str(keys["trusted"]),
                expect=3,
            )  # fmt: skip
            assert out["error"] == "integrity"
        else:
            out = agent_verify(path, keys["trusted"], 3)
        assert out["check"] == "signature-valid"


# ------------------------------------------------------------------------------ workspace keys


@pytest.fixture
def home(tmp_path, db_url):
    ws = make_workspace(tmp_path / "home", db_url)
    digest = build_validated(ws).digest
    ws.close()
    return tmp_path / "home", db_url, digest


def _stored_envelope(home: Path, db_url: str, digest: str, out: Path) -> Path:

    config = json.loads((home / "relgate.json").read_text())
    ws = Workspace(home, {**config, "catalog": {"url": db_url}})
    try:
        row = get_snapshot(ws.db, digest)
        out.write_bytes(ws.store.get(sm.envelope_key(digest), row.envelope_version))
    finally:
        ws.close()
    return out


def test_roles_rotation_and_revocation(home, tmp_path) -> None:
    path, db_url, first = home
    cfg = json.loads((path / "relgate.json").read_text())
    roles = cfg["keys"]["roles"]
    assert set(roles) == {"builder", "verifier", "approver", "gate"}
    ids = relgate(path, "init", db_url=db_url)["keys"]
    assert len(set(ids.values())) == 4  # distinct keys per role
    env1 = _stored_envelope(path, db_url, first, tmp_path / "first.json")
    envelope = json.loads(env1.read_text())
    assert envelope["signatures"][0]["keyVersion"] == 1
    assert envelope["signatures"][0]["keyid"] == ids["builder"]

    rotated = relgate(path, "key", "rotate", "builder", db_url=db_url)
    assert rotated["version"] == 2 and rotated["keyid"] != ids["builder"]
    # old builder key keeps verifying after rotation
    assert relgate(path, "verify-manifest", str(env1), db_url=db_url)["snapshot"] == first
    # a new snapshot is signed by builder v2
    second = relgate(path, "snapshot", "build", "--no-validate", db_url=db_url)["snapshot"]
    env2 = _stored_envelope(path, db_url, second, tmp_path / "second.json")
    sig = json.loads(env2.read_text())["signatures"][0]
    assert sig["keyVersion"] == 2 and sig["keyid"] == rotated["keyid"]

    # the current key cannot be revoked
    assert (
        relgate(path, "key", "revoke", rotated["keyid"], expect=3, db_url=db_url)["check"]
        == "key-current"
    )
    revoked = relgate(path, "key", "revoke", ids["builder"], db_url=db_url)
    assert revoked["revoked"] is True and revoked["version"] == 1
    refused = relgate(path, "verify-manifest", str(env1), expect=3, db_url=db_url)
    assert refused["check"] == "key-revoked" and refused["digest"] == ids["builder"]
    assert relgate(path, "verify-manifest", str(env2), db_url=db_url)["snapshot"] == second
    # the same trusted directory, handed to another process with no workspace: still refused
    trusted = path / "keys" / "trusted"
    out = relgate(
        tmp_path / "none", "verify-manifest", str(env1), "--trusted-key", str(trusted), expect=3
    )
    assert out["check"] == "key-revoked"
    # ... and by the agent: a checkpoint manifest signed by the revoked builder v1 key

    old = SigningKey.load(cfg["keys"]["roles"]["builder"]["path"], Role.BUILDER, 1)
    manifest = build_manifest(_ckpt_dir(tmp_path), "m", "v1", chunk_size=64, block_size=32)
    env = _write(tmp_path / "ckpt.json", sign_manifest(manifest, old))
    assert agent_verify(env, trusted, 3)["check"] == "key-revoked"
    new = SigningKey.load(
        json.loads((path / "relgate.json").read_text())["keys"]["roles"]["builder"]["path"],
        Role.BUILDER,
        2,
    )
    ok = _write(tmp_path / "ckpt2.json", sign_manifest(manifest, new))
    assert agent_verify(ok, trusted, 0)["manifestDigest"] == manifest.digest
    listed = relgate(path, "key", "list", db_url=db_url)
    assert {(k["role"], k["version"], k["revoked"]) for k in listed["keys"]} >= {
        ("builder", 1, True),
        ("builder", 2, False),
        ("verifier", 1, False),
    }


def test_report_signed_by_builder_is_refused(home, tmp_path) -> None:
    path, db_url, _ = home
    cfg = json.loads((path / "relgate.json").read_text())
    builder = SigningKey.load(cfg["keys"]["roles"]["builder"]["path"], Role.BUILDER, 1)
    verifier = SigningKey.load(cfg["keys"]["roles"]["verifier"]["path"], Role.VERIFIER, 1)
    report = jcs.dumps({"root": "sha256:" + "1" * 64, "outcome": "VERIFIED"})
    forged = _write(tmp_path / "r.json", dsse.sign(REPORT_TYPE, report, builder))
    out = relgate(path, "verify-manifest", str(forged), expect=3, db_url=db_url)
    assert out["check"] == "key-role" and out["digest"] == builder.keyid
    good = _write(tmp_path / "g.json", dsse.sign(REPORT_TYPE, report, verifier))
    ok = relgate(path, "verify-manifest", str(good), db_url=db_url)
    assert ok["valid"] is True and ok["signedBy"]["role"] == "verifier"


def test_approval_is_signed_by_the_approver_key(home, tmp_path) -> None:

    path, db_url, digest = home
    out = relgate(path, "snapshot", "approve", digest, "--approver", "alice", db_url=db_url)
    assert out["state"] == "APPROVED" and out["approval"].startswith("sha256:")
    config = json.loads((path / "relgate.json").read_text())
    ws = Workspace(path, {**config, "catalog": {"url": db_url}})
    try:
        approval = verify_approval(ws, "snapshot", digest)
        assert approval.approver == "alice" and approval.subject == digest

        row = latest_report(ws.db, digest, "snapshot-approval")
        assert row is not None
        raw = ws.cas.get(row.report_digest, row.report_version)
        signed = _write(tmp_path / "approval.json", raw)
        shown = relgate(path, "verify-manifest", str(signed), db_url=db_url)
        assert shown["signedBy"]["role"] == "approver" and shown["payloadType"] == PAYLOAD_TYPE
        # the same statement signed by the builder key is refused for the role
        body = base64.b64decode(json.loads(raw)["payload"])
        forged = _write(tmp_path / "f.json", dsse.sign(PAYLOAD_TYPE, body, ws.key("builder")))
        refused = relgate(path, "verify-manifest", str(forged), expect=3, db_url=db_url)
        assert refused["check"] == "key-role"
    finally:
        ws.close()
