"""Proof bundles: ``relgate prove`` emits the signed envelope with the proof; ``relgate
check-proof BUNDLE --trusted-key K`` verifies signature (builder), root and size binding and
the path with no workspace.  Forged, malformed and hostile bundles exit 3 naming the check.
Hypothesis: the bundle parser raises nothing but a RejectedError on any input."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from relgate_trust.dsse import Signer
from support.releases import write
from support.snapshots import build_validated
from support.workspaces import make_workspace

from relgate.documents import snapshot_manifest as sm
from relgate.errors import RejectedError
from relgate.integrity.merkle import LeafProof, MerkleTree
from relgate.integrity.signing import Role, SigningKey, TrustedKeys
from relgate.integrity.tuples import MemberTuple
from relgate.release.proofs import Proof, ProofBundle
from relgate.snapshot.activation import approve
from tests.integrity.test_envelope_cli import relgate


@pytest.fixture
def proved(tmp_path, db_url):
    """A workspace with a validated+approved snapshot, a release on it, and its trusted dir."""
    home = tmp_path / "home"
    ws = make_workspace(home, db_url)
    snap = build_validated(ws).digest
    approve(ws, snap, approver="alice")
    root = write(ws, snap).digest
    ws.close()
    return home, db_url, snap, root, home / "keys" / "trusted"


def _check(tmp_path: Path, bundle: dict | bytes, trusted: Path, expect: int) -> dict:
    path = tmp_path / "bundle.json"
    path.write_bytes(bundle if isinstance(bundle, bytes) else json.dumps(bundle).encode())
    # No workspace at all: --home points nowhere.
    return relgate(
        tmp_path / "nowhere", "check-proof", str(path), "--trusted-key", str(trusted), expect=expect
    )


def test_bundles_verify_without_workspace(proved, tmp_path) -> None:
    home, db_url, snap, root, trusted = proved
    inc = relgate(home, "prove", "forum/0000001", "--snapshot", snap, db_url=db_url)
    assert inc["schema"] == "relgate.proof-bundle.v1" and inc["proof"]["kind"] == "inclusion"
    ok = _check(tmp_path, inc, trusted, 0)
    assert ok["valid"] is True and ok["subject"] == snap and ok["kind"] == "inclusion"
    non = relgate(home, "prove", "forum/zzz-not-there", "--snapshot", snap, db_url=db_url)
    assert non["proof"]["kind"] == "non-inclusion"
    assert _check(tmp_path, non, trusted, 0)["valid"] is True
    rel = relgate(home, "prove", "forum/0000001", "--release", root, db_url=db_url)
    assert rel["subjectKind"] == "release" and rel["subject"] == root
    assert _check(tmp_path, rel, trusted, 0)["valid"] is True
    # the same bundle with only the verifier key trusted: the builder signature is not trusted
    verifier_only = tmp_path / "vk"
    verifier_only.mkdir()
    for pem in trusted.glob("verifier-*.pem"):
        (verifier_only / pem.name).write_bytes(pem.read_bytes())
    assert _check(tmp_path, inc, verifier_only, 3)["check"] == "signature-trusted"
    # a builder PEM handed over under another role is refused for the role
    builder_pem = next(trusted.glob("builder-*.pem"))
    out = _check(tmp_path, inc, Path(f"verifier={builder_pem}"), 3)
    assert out["check"] == "key-role"

    # -- forgeries -------------------------------------------------------------------------
    # A one-leaf proof carrying its own root (a tree of just the forged tuple).
    fake = MemberTuple("forum/evil", "forum", "v1", "sha256:" + "a" * 64, "train", "s")
    tree = MerkleTree([fake.encode()])
    forged = copy.deepcopy(inc)
    forged["proof"].update(
        kind="inclusion",
        sampleId="forum/evil",
        root="sha256:" + tree.root.hex(),
        size=1,
        leaves=[LeafProof(0, fake, tree.audit_path(0)).to_json()],
    )
    assert _check(tmp_path, forged, trusted, 3)["check"] == "proof-root-binding"
    # Right root, wrong size.
    resized = copy.deepcopy(inc)
    resized["proof"]["size"] += 1
    assert _check(tmp_path, resized, trusted, 3)["check"] == "proof-size-binding"
    # Right root and size, a tuple changed (the path no longer reaches the root).
    changed = copy.deepcopy(inc)
    changed["proof"]["leaves"][0]["tuple"]["split"] = "test"
    assert _check(tmp_path, changed, trusted, 3)["check"] == "proof-path"
    # A release's envelope with the snapshot's subject: identity refused.
    swapped = copy.deepcopy(inc)
    swapped["envelope"] = rel["envelope"]
    assert _check(tmp_path, swapped, trusted, 3)["check"] == "payload-type"
    # A non-inclusion proof whose neighbours are not adjacent.
    gap = copy.deepcopy(non)
    if len(gap["proof"]["leaves"]) == 2:
        gap["proof"]["leaves"][1]["index"] += 1
        assert _check(tmp_path, gap, trusted, 3)["check"] == "proof-path"
    # A bare, old-style proof (no signed envelope) is not a bundle.
    assert _check(tmp_path, inc["proof"], trusted, 3)["check"] == "proof-shape"


@pytest.mark.parametrize(
    ("raw", "check"),
    [
        (b"not json", "proof-json"),
        (b'{"schema": "relgate.proof-bundle.v1"', "proof-json"),
        (b"[" * 200_000 + b"]" * 200_000, "proof-depth"),
        (b'{"schema":"a","schema":"b"}', "proof-duplicate-key"),
        (b'{"schema": 1.5}', "proof-float"),
        (b"[]", "proof-shape"),
        (b'{"schema": "relgate.proof-bundle.v1", "subjectKind": "snapshot"}', "proof-shape"),
        (b"\xff\xfe", "proof-json"),
    ],
)
def test_malformed_bundle_files_exit_3(tmp_path, raw: bytes, check: str) -> None:
    trusted = tmp_path / "t"
    trusted.mkdir()

    key = SigningKey.generate(Role.BUILDER)
    (trusted / "builder-v1-x.pem").write_bytes(key.public_pem())
    out = _check(tmp_path, raw, trusted, 3)
    assert out["check"] == check and out["error"] == "rejected"


# ------------------------------------------------------------------------------ properties

_hex64 = st.text(alphabet="0123456789abcdef", min_size=64, max_size=64)
_tuple = st.fixed_dictionaries(
    {
        f: st.text(max_size=8)
        for f in (
            "sampleId",
            "sourceId",
            "sourceVersion",
            "logicalContentDigest",
            "split",
            "schemaDigest",
        )
    }
)
_leaf = st.fixed_dictionaries(
    {
        "index": st.integers(-3, 2**60) | st.text(max_size=3) | st.none(),
        "tuple": _tuple | st.integers(),
        "path": st.lists(_hex64 | st.text(max_size=5) | st.integers(), max_size=4),
    }
)
_proof = st.fixed_dictionaries(
    {
        "kind": st.sampled_from(["inclusion", "non-inclusion", "other"]) | st.integers(),
        "sampleId": st.text(max_size=8) | st.none(),
        "root": _hex64.map(lambda h: "sha256:" + h) | st.text(max_size=8),
        "size": st.integers(-2, 2**60) | st.booleans(),
        "leaves": st.lists(_leaf, max_size=3),
    }
)
_bundle = st.fixed_dictionaries(
    {
        "schema": st.just("relgate.proof-bundle.v1") | st.text(max_size=4),
        "subjectKind": st.sampled_from(["snapshot", "release", "x"]),
        "subject": _hex64.map(lambda h: "sha256:" + h) | st.text(max_size=4),
        "envelope": st.dictionaries(st.text(max_size=4), st.text(max_size=4), max_size=3),
        "proof": _proof | st.integers(),
    }
)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=400) | _bundle.map(lambda b: json.dumps(b).encode()))
def test_bundle_parser_only_raises_rejected(data: bytes) -> None:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    trusted = TrustedKeys.of(Signer(Ed25519PrivateKey.generate()).public_key, role=Role.BUILDER)
    try:
        bundle = ProofBundle.parse(data)
    except RejectedError as exc:
        assert exc.check and exc.exit_code == 3
        return
    # A shape-valid bundle must still be refused (no valid signature), typed.
    with pytest.raises(RejectedError) as err:
        bundle.check(trusted)
    assert err.value.exit_code == 3


@settings(max_examples=100, deadline=None)
@given(st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=30, unique=True))
def test_proof_round_trip_through_parser(ids: list[str]) -> None:
    """Any honest inclusion proof survives to_json -> parse -> path check."""

    tuples = sorted(MemberTuple(i, "s", "v", "d", "train", "x") for i in ids)
    tree = MerkleTree([t.encode() for t in tuples])
    for index in range(len(tuples)):
        proof = Proof(
            "inclusion",
            tuples[index].sample_id,
            "sha256:" + tree.root.hex(),
            len(tuples),
            (LeafProof(index, tuples[index], tree.audit_path(index)),),
        )
        again = Proof.from_json(json.loads(json.dumps(proof.to_json())))
        assert again == proof and again.path_valid()


def test_signed_manifest_without_a_root_is_refused_not_crashed() -> None:
    """A trusted builder signed a snapshot whose members block is malformed: exit 3."""

    key = SigningKey.generate(Role.BUILDER)
    body = {f: "x" for f in sm.REQUIRED_FIELDS}
    body.update(schema=sm.SCHEMA, members="not-an-object")
    sealed = sm.KIND.seal(body)
    envelope = sm.KIND.sign(sealed, key)
    proof = Proof("inclusion", "a", "sha256:" + "0" * 64, 1, ())
    bundle = ProofBundle("snapshot", sealed["snapshotId"], envelope, proof)
    with pytest.raises(RejectedError) as err:
        bundle.check(TrustedKeys.of(key.public_key, role=Role.BUILDER))
    assert err.value.check == "manifest-shape"
