"""The shared DSSE parser (relgate_trust.dsse): every check by name (properties are in
test_dsse_properties.py; this file stays fast, it is the mutation-testing command)."""

from __future__ import annotations

import base64
import json

import pytest
import rfc8785
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from relgate_trust import dsse
from relgate_trust.dsse import DsseError, Role, Signer, TrustedKeys

PT = "application/vnd.test+json"
BUILDER = Signer(Ed25519PrivateKey.generate(), Role.BUILDER, 1)
VERIFIER = Signer(Ed25519PrivateKey.generate(), Role.VERIFIER, 2)
TRUST = TrustedKeys(
    {
        BUILDER.keyid: dsse.TrustedKey(BUILDER.public_key, Role.BUILDER, 1),
        VERIFIER.keyid: dsse.TrustedKey(VERIFIER.public_key, Role.VERIFIER, 2),
    }
)
ROLES = (Role.BUILDER,)


def verify(envelope, trusted=TRUST, roles=ROLES):
    return dsse.verify(envelope, trusted, payload_type=PT, roles=roles, subject="t")


def refused(envelope, **kw) -> str:
    with pytest.raises(DsseError) as err:
        verify(envelope, **kw)
    assert err.value.check in dsse.CHECKS
    return err.value.check


def signed(payload: bytes, signer: Signer = BUILDER) -> dict:
    return dsse.sign(PT, payload, signer)


# ------------------------------------------------------------------------------ unit checks


def test_round_trip_carries_key_version() -> None:
    env = signed(b'{"a":1}')
    assert env["signatures"][0]["keyVersion"] == 1
    out = verify(json.dumps(env).encode())
    assert out.body == {"a": 1} and out.role is Role.BUILDER and out.version == 1


@pytest.mark.parametrize(
    ("payload", "check"),
    [
        (b'{"purpose":"evil","purpose":"demo"}', "payload-duplicate-key"),
        (b'{"a": 1}', "payload-canonical"),
        (b'{"a":1.0}', "payload-float"),
        (b'{"a":1e3}', "payload-float"),
        (b'{"a":NaN}', "payload-float"),
        (b'{"a":9007199254740992}', "payload-integer-range"),
        (b'{"a":-9007199254740992}', "payload-integer-range"),
        (b'{"a":' + b"1" * 5000 + b"}", "payload-integer-range"),
        (b"[" * 65 + b"]" * 65, "payload-depth"),
        (b"[" * 200_000 + b"]" * 200_000, "payload-depth"),
        (b"\xff", "payload-json"),
        (b"{", "payload-json"),
        (b'"\\ud800"', "payload-canonical"),
    ],
)
def test_payload_checks(payload: bytes, check: str) -> None:
    assert refused(signed(payload)) == check


def test_integer_bounds_are_inclusive() -> None:
    top = b'{"a":9007199254740991,"b":-9007199254740991}'
    assert verify(signed(top)).body == {"a": 2**53 - 1, "b": -(2**53 - 1)}
    assert verify(signed(b"[" * 64 + b"]" * 64)).body is not None


def test_envelope_checks() -> None:
    good = signed(b"{}")
    assert refused(b"x" * 10, **{}) == "envelope-json"
    assert refused(b'{"payloadType":"a","payloadType":"b"}') == "envelope-duplicate-key"
    assert refused(b"[" * 100_000) == "envelope-depth"
    assert refused({**good, "extra": 1}) == "envelope-shape"
    assert refused({**good, "payload": 5}) == "envelope-shape"
    assert refused({**good, "signatures": [{"keyid": "k", "sig": 5}]}) == "envelope-shape"
    assert refused({**good, "signatures": [{"keyid": 1, "sig": "x"}]}) == "envelope-shape"
    assert refused({**good, "signatures": "abc"}) == "envelope-shape"
    assert refused({**good, "signatures": [good["signatures"][0]] * 17}) == "envelope-shape"
    entry = dict(good["signatures"][0])
    assert refused({**good, "signatures": [{**entry, "keyVersion": True}]}) == "envelope-shape"
    assert refused({**good, "signatures": [{**entry, "keyVersion": 0}]}) == "envelope-shape"
    assert refused({**good, "signatures": []}) == "signature-present"
    assert refused({k: v for k, v in good.items() if k != "signatures"}) == "signature-present"
    assert refused({**good, "payloadType": "other"}) == "payload-type"
    assert refused({**good, "payload": "e30"}) == "envelope-base64"  # missing padding
    assert refused({**good, "payload": "e31="}) == "envelope-base64"  # non-canonical bits
    assert refused({**good, "payload": "e30=\n"}) == "envelope-base64"
    with pytest.raises(DsseError) as err:
        dsse.verify(b"{}" * 10, TRUST, payload_type=PT, roles=ROLES, max_bytes=8)
    assert err.value.check == "envelope-size"


def test_signature_checks() -> None:
    good = signed(b"{}")
    other = Signer(Ed25519PrivateKey.generate(), Role.BUILDER, 1)
    assert refused(signed(b"{}", other)) == "signature-trusted"
    tampered = {**good, "payload": base64.b64encode(b'{"a":2}').decode()}
    assert refused(tampered) == "signature-valid"
    short = {**good, "signatures": [{**good["signatures"][0], "sig": "AAAA"}]}
    assert refused(short) == "signature-valid"
    assert refused(signed(b"{}", VERIFIER)) == "key-role"
    wrong_version = {**good, "signatures": [{**good["signatures"][0], "keyVersion": 7}]}
    assert refused(wrong_version) == "key-version"
    revoked = TrustedKeys(TRUST.keys, frozenset({BUILDER.keyid}))
    assert refused(good, trusted=revoked) == "key-revoked"
    assert refused(good, trusted=TrustedKeys()) == "trusted-keys"
    # a signature with no keyVersion (older envelopes) is not version-checked
    legacy = {**good, "signatures": [{k: v for k, v in good["signatures"][0].items() if k != "keyVersion"}]}  # fmt: skip
    assert verify(legacy).keyid == BUILDER.keyid
    # one good signature among unknown ones is enough; unroled keys only where allowed
    both = {**good, "signatures": [*signed(b"{}", other)["signatures"], *good["signatures"]]}
    assert verify(both).keyid == BUILDER.keyid
    unroled = TrustedKeys.of(other.public_key)
    assert refused(signed(b"{}", other), trusted=unroled) == "key-role"
    assert verify(signed(b"{}", other), trusted=unroled, roles=(None,)).role is None


def test_trusted_dir_roles_and_revocations(tmp_path) -> None:
    from cryptography.hazmat.primitives import serialization

    pem = BUILDER.public_key.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    (tmp_path / dsse.key_filename(Role.BUILDER, 4, BUILDER.keyid)).write_bytes(pem)
    (tmp_path / "plain.pem").write_bytes(
        VERIFIER.public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    loaded = TrustedKeys.load(tmp_path)
    assert loaded.keys[BUILDER.keyid].role is Role.BUILDER
    assert loaded.keys[BUILDER.keyid].version == 4
    assert loaded.keys[VERIFIER.keyid].role is None
    forced = TrustedKeys.load([f"verifier={tmp_path / 'plain.pem'}"])
    assert forced.keys[VERIFIER.keyid].role is Role.VERIFIER
    (tmp_path / dsse.REVOKED_FILE).write_bytes(dsse.revoked_bytes([BUILDER.keyid]))
    assert TrustedKeys.load(tmp_path).revoked == {BUILDER.keyid}
    (tmp_path / dsse.REVOKED_FILE).write_bytes(b'{"keyids":1,"keyids":2}')
    with pytest.raises(DsseError) as err:
        TrustedKeys.load(tmp_path)
    assert err.value.check == "payload-duplicate-key"
    with pytest.raises(DsseError) as err:
        TrustedKeys.load(tmp_path / "missing.pem")
    assert err.value.check == "trusted-keys"


def test_one_pae_encoder() -> None:
    assert dsse.pae("a", b"xy") == b"DSSEv1 1 a 2 xy"
    from relgate_trust import manifest

    assert manifest.pae is dsse.pae


def test_bounds_and_trust_file_edges(tmp_path) -> None:
    good = signed(b"{}")
    entry = dict(good["signatures"][0])
    assert refused({**good, "signatures": [{**entry, "keyVersion": 2**31}]}) == "envelope-shape"
    assert refused({**good, "signatures": [{**entry, "keyVersion": 2**31 - 1}]}) == "key-version"
    # a parsed (dict) envelope is size-bounded too, before any base64 decoding
    big = {**good, "payload": "A" * 400}
    with pytest.raises(DsseError) as err:
        dsse.verify(big, TRUST, payload_type=PT, roles=ROLES, max_bytes=100)
    assert err.value.check == "envelope-size"
    # a revocation list must carry its schema and a list of string keyids
    for doc in (
        {"schema": "other", "keyids": []},
        {"schema": dsse.REVOKED_SCHEMA, "keyids": "k"},
        {"schema": dsse.REVOKED_SCHEMA, "keyids": [1]},
        [dsse.REVOKED_SCHEMA],
    ):
        (tmp_path / dsse.REVOKED_FILE).write_bytes(rfc8785.dumps(doc))
        with pytest.raises(DsseError) as err:
            dsse.load_revoked(tmp_path / dsse.REVOKED_FILE)
        assert err.value.check == "trusted-keys"
    with pytest.raises(DsseError) as err:
        dsse.load_revoked(tmp_path / "absent" / dsse.REVOKED_FILE)
    assert err.value.check == "trusted-keys"
    (tmp_path / dsse.REVOKED_FILE).write_bytes(b" " * (4 * 1024 * 1024 + 1))
    with pytest.raises(DsseError) as err:
        dsse.load_revoked(tmp_path / dsse.REVOKED_FILE)
    assert err.value.check == "trusted-keys"


def test_exact_boundaries_and_orderings(tmp_path) -> None:
    """Off-by-one and ordering mutants: every bound is inclusive/exclusive exactly as stated,
    and every equality check refuses mismatches on both sides."""
    good = signed(b"{}")
    entry = dict(good["signatures"][0])
    # parsed-envelope payload bound: max_bytes * 4 // 3 + 4 characters (303 -> 408)
    for length, size_refused in ((408, False), (409, True)):
        env = {**good, "payload": "A" * length}
        with pytest.raises(DsseError) as err:
            dsse.verify(env, TRUST, payload_type=PT, roles=ROLES, max_bytes=303)
        assert (err.value.check == "envelope-size") is size_refused
    # exactly MAX_SIGNATURES entries are looked at; one more is a shape error
    sixteen = {**good, "signatures": [entry] * dsse.MAX_SIGNATURES}
    assert verify(sixteen).keyid == BUILDER.keyid
    assert refused({**good, "signatures": [{**entry, "keyVersion": 2**40}]}) == "envelope-shape"
    # payloadType / keyVersion / canonical form mismatches in both byte orders
    assert refused({**good, "payloadType": "zzz"}) == "payload-type"
    assert refused({**good, "payloadType": "aaa"}) == "payload-type"
    low = dsse.sign(PT, b"{}", Signer(VERIFIER.private_key, Role.VERIFIER, 1))  # trusted as v2
    assert refused(low, roles=(Role.VERIFIER,)) == "key-version"
    assert refused(signed(b'{"b":1,"a":2}')) == "payload-canonical"  # canonical sorts lower
    assert refused(signed(b'{"a": 1}')) == "payload-canonical"  # canonical sorts higher


def test_trusted_dir_ignores_other_files_and_bounds_revocations(tmp_path) -> None:
    from cryptography.hazmat.primitives import serialization

    def pem(signer: Signer) -> bytes:
        return signer.public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    (tmp_path / dsse.key_filename(Role.VERIFIER, 2, VERIFIER.keyid)).write_bytes(pem(VERIFIER))
    (tmp_path / "notes.txt").write_bytes(b"not a key")  # suffix sorts after .pem
    (tmp_path / "signer.key").write_bytes(b"not a key")  # suffix sorts before .pem
    loaded = TrustedKeys.load(tmp_path)
    assert set(loaded.keys) == {VERIFIER.keyid}
    assert loaded.keys[VERIFIER.keyid].role is Role.VERIFIER
    # a revocation list of exactly the 4 MiB bound loads; its schema is compared exactly
    doc = rfc8785.dumps({"schema": dsse.REVOKED_SCHEMA, "keyids": [BUILDER.keyid]})
    limit = 4 * 1024 * 1024
    (tmp_path / dsse.REVOKED_FILE).write_bytes(doc + b" " * (limit - len(doc)))
    assert dsse.load_revoked(tmp_path / dsse.REVOKED_FILE) == {BUILDER.keyid}
    (tmp_path / dsse.REVOKED_FILE).write_bytes(rfc8785.dumps({"schema": "zzz", "keyids": []}))
    with pytest.raises(DsseError) as err:
        dsse.load_revoked(tmp_path / dsse.REVOKED_FILE)
    assert err.value.check == "trusted-keys"


def test_documented_limits() -> None:
    """The bounds docs/manifest.md states (a change here is a contract change)."""
    assert dsse.MAX_ENVELOPE_BYTES == 64 * 1024 * 1024
    assert dsse.MAX_DEPTH == 64 and dsse.MAX_SIGNATURES == 16
    assert dsse.MAX_SAFE_INTEGER == 2**53 - 1


def test_more_mutation_kills(tmp_path) -> None:
    good = signed(b"{}")
    data = json.dumps(good).encode()
    # a byte envelope of exactly max_bytes is parsed; one byte more is not
    assert verify(data).keyid == BUILDER.keyid
    with pytest.raises(DsseError) as err:
        dsse.verify(data, TRUST, payload_type=PT, roles=ROLES, max_bytes=len(data) - 1)
    assert err.value.check == "envelope-size"
    assert dsse.verify(data, TRUST, payload_type=PT, roles=ROLES, max_bytes=len(data)).payload
    # non-canonical base64 whose canonical form sorts higher ("e38=" > "e3+=")
    assert refused({**good, "payload": "e3+="}) == "envelope-base64"
    # depth after a closed sibling still counts: [[], [[[...64...]]]] is 65 deep
    deep = b"[[]," + b"[" * 64 + b"]" * 64 + b"]"
    assert refused(signed(deep)) == "payload-depth"
    # the most specific refusal wins: revoked beats an unknown key's signature
    other = Signer(Ed25519PrivateKey.generate(), Role.BUILDER, 1)
    two = {**good, "signatures": [*good["signatures"], *signed(b"{}", other)["signatures"]]}
    revoked = TrustedKeys(TRUST.keys, frozenset({BUILDER.keyid}))
    assert refused(two, trusted=revoked) == "key-revoked"
    assert refused({**two, "signatures": two["signatures"][::-1]}, trusted=revoked) == (
        "key-revoked"
    )
    # no keyVersion (older envelopes): not version-checked, whatever the trusted version
    v2 = {
        **signed(b"{}", VERIFIER),
        "signatures": [
            {k: v for k, v in signed(b"{}", VERIFIER)["signatures"][0].items() if k != "keyVersion"}
        ],
    }
    assert verify(v2, roles=(Role.VERIFIER,)).version == 2
    # merged trust sets keep both sides' keys and revocations
    a = TrustedKeys.of(BUILDER.public_key, role=Role.BUILDER)
    b = TrustedKeys({}, frozenset({"sha256:x"}))
    merged = TrustedKeys(a.keys, frozenset({"sha256:y"})).merged(b)
    assert merged.revoked == {"sha256:x", "sha256:y"} and BUILDER.keyid in merged
    # '=' in a path that is not ROLE=PATH is just a path; unroled keys are version 1
    from cryptography.hazmat.primitives import serialization

    odd = tmp_path / "a=b"
    odd.mkdir()
    (odd / "k.pem").write_bytes(
        BUILDER.public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
    )
    loaded = TrustedKeys.load([str(odd / "k.pem")])
    assert loaded.keys[BUILDER.keyid].role is None and loaded.keys[BUILDER.keyid].version == 1


def test_wide_documents_are_not_deep() -> None:
    """Closing a list lowers the depth: 100 sibling lists are 2 levels, not 101."""
    wide = b"[" + b",".join([b"[]"] * 100) + b"]"
    assert verify(signed(wide)).body == [[]] * 100
    assert dsse.max_depth(wide, 64) == 2
