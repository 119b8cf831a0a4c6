"""The typed release contracts reproduce the stored documents exactly.

The root's digest and the report's bytes are over the models' JSON, so a model that
dropped, renamed, added or nulled a field would change every root id; these tests fail
on any such drift (absent and null are different documents).
"""

import json

import pytest
from support.releases import write

from relgate.documents import release_root as rm
from relgate.documents.shard_descriptor import descriptor_problems
from relgate.errors import RejectedError
from relgate.integrity.canonical import canonical_bytes
from relgate.integrity.signing import verify_envelope
from relgate.release.verify.checks import ZERO_CHECKS, Check, Outcome, outcome_of
from relgate.release.verify.report import REPORT_PAYLOAD_TYPE, VerificationPayload
from relgate.release.verify.verifier import verify_release


@pytest.mark.parametrize(
    "kw",
    [
        {"records_per_shard": 40},
        {"shard_mb": 1},
        {"records_per_shard": 50, "encrypt_key": b"k" * 32, "key_version": "kms-v1"},
    ],
    ids=["by-records", "by-bytes", "encrypted"],
)
def test_the_typed_root_is_the_signed_document(ws, snapshot, kw):
    release = write(ws, snapshot.digest, **kw)
    typed = release
    assert typed.to_json() == release.document()
    assert rm.seal(typed.model_copy(update={"root_id": ""})).digest == release.digest
    function = release.document()["writer"]["shardingFunction"]
    # The other variant's fields are absent, not null; keyVersion/encryption are null.
    assert ("recordsPerShard" in function) != ("targetBytes" in function)
    assert (
        "keyVersion" in release.document()["writer"]
        and "encryption" in release.document()["writer"]
    )
    assert (release.document()["writer"]["encryption"] is None) == ("encrypt_key" not in kw)
    d = typed.shards[0]
    assert d.to_json() == rm.wire_shards(release.document())[0]
    assert d.object_key.endswith(".parquet.aesgcm" if "encrypt_key" in kw else ".parquet")


def test_a_malformed_root_is_refused_by_its_typed_view(ws, snapshot):
    release = write(ws, snapshot.digest)
    broken = {**release.document(), "shards": [{"id": "shard-00000-of-00001"}]}
    with pytest.raises(RejectedError) as err:
        rm.ReleaseManifest.from_document(broken)
    assert err.value.check == "schema"


def test_the_stored_report_is_the_payload_model(ws, snapshot):
    release = write(ws, snapshot.digest)
    report = verify_release(ws, release.digest, workers=0, actor="test")
    envelope = json.loads(ws.cas.get(report.report_digest, report.report_version))
    payload = verify_envelope(
        envelope, ws.trusted_keys, payload_type=REPORT_PAYLOAD_TYPE, subject="report"
    )
    assert payload == canonical_bytes(report.payload().to_json())
    stored = VerificationPayload.parse(json.loads(payload))
    assert stored == report.payload()
    assert set(stored.counts) == {c.value for c in ZERO_CHECKS}
    assert stored.outcome is Outcome.VERIFIED


def test_outcome_rule():
    zero = {c.value: 0 for c in ZERO_CHECKS}
    assert outcome_of(zero) == (Outcome.VERIFIED, [])
    assert outcome_of({**zero, Check.EXTRA_MEMBERS.value: 1})[0] is Outcome.INVALID
    partial = {**zero, Check.OBJECT_UNAVAILABLE.value: 1, Check.MISSING_MEMBERS.value: 40}
    assert outcome_of(partial) == (Outcome.UNAVAILABLE, ["object-unavailable"])
    assert outcome_of({**partial, Check.DUPLICATE_MEMBERS.value: 1})[0] is Outcome.INVALID
    assert outcome_of({**zero, "fatal:signature": 1})[0] is Outcome.INVALID


@pytest.mark.parametrize(
    "ident",
    [
        "shard-00000-of-00001\\n",  # a trailing newline ($ would have let it by)
        "shard-\\u0660\\u0660\\u0660\\u0660\\u0660-of-00001",  # Arabic-Indic digits int() reads as 0
        "shard-0000-of-00001",
        " shard-00000-of-00001",
    ],
)
def test_a_shard_id_is_spelled_in_ascii_digits_and_nothing_else(ident):
    descriptor = {
        "id": ident,
        "mediaType": rm.SHARD_MEDIA_TYPE,
        "digest": "sha256:" + "a" * 64,
        "size": 1,
        "objectVersion": "v",
        "logicalDigest": "sha256:" + "b" * 64,
        "records": 1,
        "tokens": 0,
        "memberSetDigest": "sha256:" + "c" * 64,
    }
    assert descriptor_problems([{**descriptor, "id": "shard-00000-of-00001"}], 1) == []
    assert descriptor_problems([descriptor], 1) == [
        f"descriptor 0 has id {ident!r}, expected position 0 of 1"
    ]


def test_a_root_that_does_not_read_back_byte_for_byte_is_refused(ws, snapshot):
    """``totals.shards`` signed as the string "3": the lax model reads it as 3, so the typed
    view would not be the signed document; refused (check ``schema``), not silently
    normalised."""
    release = write(ws, snapshot.digest)
    document = release.document()
    lax = {
        **document,
        "totals": {**document["totals"], "shards": str(document["totals"]["shards"])},
    }
    with pytest.raises(RejectedError) as err:
        rm.ReleaseManifest.from_document(lax)
    assert (err.value.check, err.value.digest) == ("schema", release.digest)
    assert rm.ReleaseManifest.from_document(document) == release
