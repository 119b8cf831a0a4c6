"""DocumentKind (relgate/documents/kind.py): seal, sign, open and load through the shared DSSE parser.

Every refusal is exit 3 and names its check; the builder role is required for manifests.
"""

from __future__ import annotations

import base64
import json

import pytest
import rfc8785

from relgate.documents.kind import DocumentKind
from relgate.errors import IntegrityError, RejectedError
from relgate.integrity.canonical import manifest_digest
from relgate.integrity.signing import Role, SigningKey, TrustedKeys, sign_envelope
from relgate.objects.local import LocalObjectStore

KIND = DocumentKind(
    "training.dataset.snapshot.v1",
    "application/vnd.relgate.dataset-snapshot.v1+json",
    "snapshotId",
    ("schema", "purpose"),
)
BUILDER = SigningKey.generate(Role.BUILDER, 2)
VERIFIER = SigningKey.generate(Role.VERIFIER, 1)
TRUSTED = TrustedKeys.of(BUILDER.public_key, role=Role.BUILDER, version=2).merged(
    TrustedKeys.of(VERIFIER.public_key, role=Role.VERIFIER)
)


def sealed(**extra):
    return KIND.seal({"schema": KIND.schema, "purpose": "demo", **extra})


def refused(envelope, cls=RejectedError, **kw) -> RejectedError:
    with pytest.raises(cls) as err:
        KIND.open(envelope, TRUSTED, **kw)
    assert err.value.exit_code == 3
    return err.value


def test_seal_sign_open_round_trip() -> None:
    doc = sealed(n=1)
    env = KIND.sign(doc, BUILDER)
    assert env["signatures"][0]["keyVersion"] == 2
    assert KIND.open(env, TRUSTED) == doc
    assert KIND.open(json.dumps(env).encode(), TRUSTED, expected=doc["snapshotId"]) == doc
    # the id field and signatures never take part in the digest
    assert KIND.seal({**doc, "snapshotId": "sha256:" + "f" * 64}) == doc


def test_seal_requires_fields() -> None:
    with pytest.raises(RejectedError) as err:
        KIND.seal({"schema": KIND.schema})
    assert err.value.check == "required-fields"


def test_open_refusals() -> None:
    doc = sealed()
    assert refused(KIND.sign(doc, VERIFIER)).check == "key-role"
    other = sealed(purpose="other")
    env = KIND.sign(doc, BUILDER)
    assert refused(env, expected=other["snapshotId"], cls=IntegrityError).check == (
        "manifest-identity"
    )
    for schema in ("other", "zzz", 5):  # sorting before and after the expected schema
        wrong_schema = {**doc, "schema": schema}
        env = sign_envelope(KIND.payload_type, rfc8785.dumps(wrong_schema), BUILDER)
        assert refused(env).check == "schema"
    lying = {**doc, "purpose": "evil"}  # snapshotId no longer matches the body
    env = sign_envelope(KIND.payload_type, rfc8785.dumps(lying), BUILDER)
    err = refused(env, cls=IntegrityError)
    assert err.check == "manifest-digest" and err.digest == doc["snapshotId"]
    bad_id = {**doc, "snapshotId": "nope"}
    assert refused(sign_envelope(KIND.payload_type, rfc8785.dumps(bad_id), BUILDER)).check == (
        "digest-syntax"
    )
    not_object = sign_envelope(KIND.payload_type, b"[1]", BUILDER)
    assert refused(not_object).check == "schema"
    missing = {k: v for k, v in doc.items() if k != "purpose"}
    missing["snapshotId"] = KIND.seal({**missing, "purpose": "x"})["snapshotId"]

    missing["snapshotId"] = manifest_digest(missing)
    err = refused(sign_envelope(KIND.payload_type, rfc8785.dumps(missing), BUILDER))
    assert err.check == "required-fields"
    tampered = KIND.sign(doc, BUILDER)
    tampered["payload"] = base64.b64encode(rfc8785.dumps(lying)).decode()
    assert refused(tampered, cls=IntegrityError).check == "signature-valid"
    dup = rfc8785.dumps(doc)[:-1] + b',"purpose":"evil"}'
    assert refused(sign_envelope(KIND.payload_type, dup, BUILDER)).check == (
        "payload-duplicate-key"
    )


def test_load_reads_exact_version(tmp_path) -> None:
    store = LocalObjectStore(tmp_path / "objects")
    doc = sealed()
    version = store.create("m.dsse.json", json.dumps(KIND.sign(doc, BUILDER)).encode())
    got = KIND.load(
        store, TRUSTED, key="m.dsse.json", digest=doc["snapshotId"], version_id=version.version_id
    )
    assert got == doc
    bad = store.create("bad.dsse.json", b"{not json")
    with pytest.raises(RejectedError) as err:
        KIND.load(
            store, TRUSTED, key="bad.dsse.json", digest=doc["snapshotId"], version_id=bad.version_id
        )
    assert err.value.check == "envelope-json" and err.value.object == "bad.dsse.json"


def test_digest_and_identity_checks_are_exact() -> None:
    """Mismatches in either direction (a recomputed digest sorting before or after the claimed
    one; an expected digest below or above the found one) are refused."""

    doc = sealed()
    env = KIND.sign(doc, BUILDER)
    for expected in ("sha256:" + "0" * 64, "sha256:" + "f" * 64):
        assert refused(env, expected=expected, cls=IntegrityError).check == "manifest-identity"
    seen = set()
    for n in range(64):
        lying = {**doc, "n": n}
        seen.add(manifest_digest(lying) < doc["snapshotId"])
        env = sign_envelope(KIND.payload_type, rfc8785.dumps(lying), BUILDER)
        assert refused(env, cls=IntegrityError).check == "manifest-digest"
    assert seen == {True, False}
