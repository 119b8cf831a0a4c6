"""The Release rows of DESIGN.md's fault matrix that concern bytes and sets, each injected
for real on stored objects or by a root manifest forged with the trusted workspace key.
Every one must end with the release INVALID and the report naming the class counts."""

import io
import json
import os
import socket
import subprocess
import sys
import uuid
from collections import Counter

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from relgate_trust.digests import sha256_digest
from support.releases import (
    RECORDS_PER_SHARD,
    encrypt_for,
    forge,
    member_schema,
    overwrite_in_place,
    read_shard,
    rewrite_record,
    shard_format,
    shard_path,
    state,
    store_shard,
    tokens_of,
    write,
)
from support.snapshots import build_approved, build_validated

from relgate.catalog.audit import latest_report
from relgate.catalog.release_table import get_release, verification_attempts
from relgate.catalog.snapshot_table import get_snapshot
from relgate.catalog.states import history
from relgate.demo.corpus import seed_demo
from relgate.documents import release_root as rm
from relgate.documents import shard_format as rr
from relgate.documents import snapshot_manifest as sm
from relgate.errors import RejectedError
from relgate.integrity.signing import SigningKey
from relgate.objects.s3 import S3ObjectStore
from relgate.records.record_schema import TEXT_SCHEMA
from relgate.records.values import content_digest
from relgate.release import crypto
from relgate.release.publication import approve_release
from relgate.release.verify.checks import SHARD_CHECKS
from relgate.release.verify.verifier import verify_release
from relgate.release.verify.worker import ShardTask, verify_shard
from relgate.release.writer import ParquetParams, serialize_shard, shard_key
from relgate.runs.shard_fetch import fetch_shard
from relgate.snapshot import activation as lifecycle
from relgate.snapshot import tokenizer
from relgate.snapshot.transform_tags import tag_transform
from relgate.workspace import Workspace, build_object_store, default_config


def verify(ws, release, **kw):
    kw.setdefault("workers", 0)
    return verify_release(ws, release.digest, actor="test", **kw)


def assert_invalid(ws, release, report, **expected):
    assert report.outcome == "INVALID"
    assert state(ws, release.digest) == "INVALID"
    for name, count in expected.items():
        assert report.counts[name] == count, (name, report.failing)
    unexpected = {k: v for k, v in report.failing.items() if k not in expected}
    return unexpected


def test_truncated_shard(ws, snapshot):
    release = write(ws, snapshot.digest)
    d = rm.wire_shards(release.document())[1]
    path = shard_path(ws, d)
    overwrite_in_place(path, path.read_bytes()[: d["size"] // 2])
    report = verify(ws, release, workers=2)
    extra = assert_invalid(
        ws, release, report, sizeMismatch=1, storageDigestMismatch=1, missingMembers=40
    )
    assert extra.keys() == {"tupleRootMismatch", "totalsMismatch"}  # decoded < declared
    bad = [s for s in report.shards if not s["ok"]]
    assert [s["id"] for s in bad] == [d["id"]]
    assert {f["check"] for f in bad[0]["failures"]} == {"sizeMismatch", "storageDigestMismatch"}


def test_two_shards_swapped(ws, snapshot):
    release = write(ws, snapshot.digest)

    def swap(body):
        a, b = body["shards"][0], body["shards"][1]
        for f in ("digest", "size", "objectVersion"):
            a[f], b[f] = b[f], a[f]

    forged = forge(ws, release, swap)
    report = verify(ws, forged)
    extra = assert_invalid(
        ws, forged, report, logicalDigestMismatch=2, memberSetDigestMismatch=2, missingMembers=0
    )
    # The set is intact (both shards are still there): only the descriptors catch a swap.
    assert extra.keys() <= {"tokenCountMismatch", "recordCountMismatch"}


@pytest.mark.parametrize(
    ("field", "check"),
    [
        ("text", "contentSubstitutions"),
        ("sourceVersion", "sourceVersionSubstitutions"),
        ("split", "splitConflicts"),
    ],
)
def test_member_replaced_under_the_same_sample_id(ws, snapshot, field, check):
    release = write(ws, snapshot.digest)
    schema = member_schema(ws, release)
    d = rm.wire_shards(release.document())[2]
    table = read_shard(ws, d)
    row = table.slice(5, 1).to_pylist()[0]
    if field == "text":
        text = row["text"] + " and one more sentence"
        changes = {
            "text": text,
            "logicalContentDigest": content_digest(
                {"lang": row["lang"], "text": text}, TEXT_SCHEMA
            ),
            "tokens": tokens_of(ws, release, text),
        }
    elif field == "sourceVersion":
        changes = {"sourceVersion": row["sourceVersion"] + "-older"}
    else:
        changes = {"split": "test" if row["split"] != "test" else "train"}
    new = store_shard(ws, rewrite_record(table, 5, **changes), d, schema)

    forged = forge(ws, release, lambda body: body["shards"].__setitem__(2, new))
    report = verify(ws, forged)
    extra = assert_invalid(ws, forged, report, **{check: 1})
    # Per-shard checks all pass on the re-stored bytes: only the set diff catches it.
    assert all(report.counts[c] == 0 for c in SHARD_CHECKS)
    assert extra == {"tupleRootMismatch": 1}


def test_text_replaced_but_content_digest_column_left_alone(ws, snapshot):
    release = write(ws, snapshot.digest)
    schema = member_schema(ws, release)
    d = rm.wire_shards(release.document())[0]
    table = read_shard(ws, d)
    row = table.slice(0, 1).to_pylist()[0]
    changed = rewrite_record(table, 0, text=row["text"].upper())
    new = store_shard(ws, changed, d, schema)
    forged = forge(ws, release, lambda body: body["shards"].__setitem__(0, new))
    report = verify(ws, forged)
    # The tuple uses the digest recomputed from the decoded text, never the stored column.
    assert_invalid(ws, forged, report, storedContentDigestMismatches=1, contentSubstitutions=1)


def test_descriptor_omitted(ws, snapshot):
    release = write(ws, snapshot.digest)
    forged = forge(ws, release, lambda body: body["shards"].pop(), renumber=True)
    report = verify(ws, forged)
    last = rm.wire_shards(release.document())[-1]["records"]
    extra = assert_invalid(ws, forged, report, missingMembers=last)
    assert extra == {"tupleRootMismatch": 1}


def test_descriptor_lacking_a_field(ws, snapshot):
    release = write(ws, snapshot.digest)
    forged = forge(ws, release, lambda body: body["shards"][1].pop("memberSetDigest"))
    report = verify(ws, forged)
    assert_invalid(
        ws,
        forged,
        report,
        descriptorIncomplete=1,
        missingMembers=rm.wire_shards(release.document())[1]["records"],
    )
    assert any("lacks ['memberSetDigest']" in p for p in report.problems)


def test_extra_member(ws, snapshot):
    release = write(ws, snapshot.digest)
    schema = member_schema(ws, release)
    d = rm.wire_shards(release.document())[0]
    table = read_shard(ws, d)
    row = table.slice(0, 1).to_pylist()[0]
    row["sampleId"] = "forum/never-a-member"
    grown = pa.concat_tables(
        [table, pa.Table.from_pylist([row], schema=shard_format(ws).arrow_schema)]
    )
    new = store_shard(ws, grown, d, schema)
    forged = forge(ws, release, lambda body: body["shards"].__setitem__(0, new))
    report = verify(ws, forged)
    assert_invalid(ws, forged, report, extraMembers=1, missingMembers=0, duplicateMembers=0)


def test_duplicate_member_across_shards(ws, snapshot):
    release = write(ws, snapshot.digest)
    schema = member_schema(ws, release)
    d = rm.wire_shards(release.document())[0]
    table = read_shard(ws, d)
    copied = read_shard(ws, rm.wire_shards(release.document())[1]).slice(0, 1)
    new = store_shard(ws, pa.concat_tables([table, copied]), d, schema)
    forged = forge(ws, release, lambda body: body["shards"].__setitem__(0, new))
    report = verify(ws, forged)
    assert_invalid(ws, forged, report, duplicateMembers=1, extraMembers=0, missingMembers=0)


def test_duplicate_descriptor(ws, snapshot):
    release = write(ws, snapshot.digest)

    def repeat(body):
        body["shards"].append(dict(body["shards"][0]))

    forged = forge(ws, release, repeat, renumber=True)
    report = verify(ws, forged)
    assert_invalid(ws, forged, report, duplicateMembers=RECORDS_PER_SHARD, missingMembers=0)


def test_stale_listing_is_never_consulted(ws, snapshot):
    release = write(ws, snapshot.digest)
    # An extra, perfectly valid shard object appears under the prefix...
    extra = read_shard(ws, rm.wire_shards(release.document())[0])
    rogue = serialize_shard(extra.slice(0, 3), ParquetParams(), shard_format(ws))
    ws.store.create(shard_key(sha256_digest(rogue), encrypted=False), rogue)
    # ...and a newer version of a pinned shard key holds other bytes.
    d = rm.wire_shards(release.document())[1]
    key = shard_key(d["digest"], encrypted=False)
    newer = ws.store.put(key, b"not the pinned version")
    assert ws.store.head(key).version_id == newer.version_id != d["objectVersion"]
    report = verify(ws, release)
    assert report.ok, report.failing  # descriptors + exact versions only
    assert state(ws, release.digest) == "VERIFIED"
    assert report.facts["shards"] == len(rm.wire_shards(release.document()))
    read = {s["id"]: s["objectVersion"] for s in report.shards}
    assert read[d["id"]] == d["objectVersion"]


def test_root_built_from_a_stale_listing(ws, snapshot):
    release = write(ws, snapshot.digest)
    # A writer that listed the prefix before the last shard landed would name only these.
    forged = forge(ws, release, lambda body: body["shards"].pop(), renumber=True)
    report = verify(ws, forged, workers=2)
    assert_invalid(
        ws, forged, report, missingMembers=rm.wire_shards(release.document())[-1]["records"]
    )


def test_old_cache_entry_is_detected_and_never_used(ws, snapshot, tmp_path):
    release = write(ws, snapshot.digest)
    d = rm.wire_shards(release.document())[0]
    cache = tmp_path / "cache"
    data, status = fetch_shard(ws.store, d, cache)
    assert status == "miss"
    assert fetch_shard(ws.store, d, cache) == (data, "hit")
    cached = cache / (d["digest"].removeprefix("sha256:") + ".shard")
    cached.write_bytes(
        read_shard_bytes_of(ws, rm.wire_shards(release.document())[1])
    )  # stale: another shard
    again, status = fetch_shard(ws.store, d, cache)
    assert status == "rejected" and again == data
    assert cached.read_bytes() == data
    # A corrupt pinned object is never papered over by a good cache entry in the verifier.
    overwrite_in_place(shard_path(ws, d), data[:-8])
    report = verify(ws, release)
    assert_invalid(ws, release, report, sizeMismatch=1, storageDigestMismatch=1)


def read_shard_bytes_of(ws, descriptor):
    return shard_path(ws, descriptor).read_bytes()


def _with_invalid_utf8(table: pa.Table) -> pa.Table:
    """``table`` with one byte of its ``text`` values replaced by 0xFF (not UTF-8), built
    from buffers so Arrow does not refuse it before it reaches the file."""
    text = table.column("text").combine_chunks()
    validity, offsets, values = text.buffers()
    data = bytearray(values.to_pybytes())
    data[3] = 0xFF
    bad = pa.Array.from_buffers(pa.string(), len(text), [validity, offsets, pa.py_buffer(data)])
    return table.set_column(table.schema.get_field_index("text"), table.schema.field("text"), bad)


def test_a_signed_shard_whose_text_is_not_utf8_is_a_decode_failure(ws, snapshot):
    """Parquet decoding does not check UTF-8: a shard whose stored bytes match its signed
    descriptor but carry invalid UTF-8 is a decode finding, never a crash of the verifier
    that would report a malformed root (the flaky ``fatal:root-shape``)."""
    release = write(ws, snapshot.digest)
    d = rm.wire_shards(release.document())[1]
    table = read_shard(ws, d)
    sink = io.BytesIO()
    pq.write_table(_with_invalid_utf8(table), sink, compression="zstd")
    new = store_shard(ws, table, d, member_schema(ws, release), raw=sink.getvalue())
    forged = forge(ws, release, lambda body: body["shards"].__setitem__(1, new))
    report = verify(ws, forged)
    extra = assert_invalid(ws, forged, report, decodeFailures=1, missingMembers=d["records"])
    assert not any(k.startswith("fatal:") for k in report.counts), report.counts
    assert extra.keys() <= {"tupleRootMismatch", "totalsMismatch"}
    bad = [s for s in report.shards if not s["ok"]]
    assert [f["check"] for f in bad[0]["failures"]] == ["decodeFailures"]
    assert "UnicodeDecodeError" not in json.dumps(bad[0]) and "Invalid" in json.dumps(bad[0])


def test_every_flipped_byte_of_a_shard_is_a_storage_mismatch_and_nothing_else(ws, snapshot):
    """One byte flipped anywhere in a stored shard (every 3rd offset, so data pages,
    page headers and the footer are all hit) is exactly ``storageDigestMismatch`` for that
    shard; whatever the damaged bytes decode to never escapes as an error."""
    release = write(ws, snapshot.digest)
    d = rm.wire_shards(release.document())[1]
    row = get_snapshot(ws.db, snapshot.digest)
    snap = sm.load(ws.store, ws.trusted_keys, snapshot.digest, row.envelope_version)
    task = ShardTask(
        ws.config["objectStore"],
        d,
        snapshot.digest,
        snap.record_schema_document,
        snap.record_schema,
        None,
        tokenizer=tokenizer.pinned_bytes(ws, snap),
    )
    path = shard_path(ws, d)
    original = path.read_bytes()
    outcomes = Counter()
    for offset in range(0, len(original), 3):
        flipped = bytearray(original)
        flipped[offset] ^= 0xFF
        overwrite_in_place(path, bytes(flipped))
        result = verify_shard(task)
        outcomes[tuple(f["check"] for f in result.failures)] += 1
    overwrite_in_place(path, original)
    assert outcomes == {("storageDigestMismatch",): len(range(0, len(original), 3))}
    assert verify_shard(task).ok


def test_mixed_record_schemas(ws, snapshot):
    release = write(ws, snapshot.digest)
    d = rm.wire_shards(release.document())[1]
    table = read_shard(ws, d)
    other = pa.schema(
        [
            f if f.name != "tokens" else pa.field("tokens", pa.int32(), False)
            for f in shard_format(ws).arrow_schema
        ]
    )
    other = other.with_metadata({rr.SCHEMA_METADATA_KEY: b"sha256:" + b"9" * 64})
    sink = io.BytesIO()
    pq.write_table(table.cast(other), sink, compression="zstd")
    raw = sink.getvalue()
    new = store_shard(ws, table, d, member_schema(ws, release), raw=raw)
    forged = forge(ws, release, lambda body: body["shards"].__setitem__(1, new))
    report = verify(ws, forged)
    assert_invalid(
        ws,
        forged,
        report,
        recordSchemaMismatch=1,
        mixedRecordSchemas=1,
        missingMembers=d["records"],
    )


KEY = bytes(range(32))


def _encrypted(ws, snapshot):
    return write(ws, snapshot.digest, encrypt_key=KEY, key_version="kms-v1")


def test_wrong_key_then_right_key(ws, snapshot):
    """One try with the wrong key proves nothing: STAGED, attempt recorded, then VERIFIED."""
    release = _encrypted(ws, snapshot)
    report = verify(ws, release, keys={"kms-v1": b"\x07" * 32})
    assert report.outcome == "UNAVAILABLE" and report.unavailable == ["key-unavailable"]
    assert report.state == state(ws, release.digest) == "STAGED"
    assert report.counts["keyUnavailable"] == len(rm.wire_shards(release.document()))
    assert report.counts["decryptFailures"] == 0
    assert report.shards[0]["failures"][0]["failedCheck"] == "decrypt-authenticate"
    good = verify(ws, release, keys={"kms-v1": KEY})
    assert good.outcome == "VERIFIED" and state(ws, release.digest) == "VERIFIED"
    attempts = verification_attempts(ws.db, release.digest)
    assert [(a.outcome, a.state, a.checks) for a in attempts] == [
        ("UNAVAILABLE", "STAGED", ("key-unavailable",)),
        ("VERIFIED", "VERIFIED", ()),
    ]


def test_wrong_aad_on_an_encrypted_shard(ws, snapshot):
    release = _encrypted(ws, snapshot)
    d0, d1 = rm.wire_shards(release.document())[0], rm.wire_shards(release.document())[1]
    # Shard 0's records encrypted with the right key but bound to shard 1's identity.
    plain = serialize_shard(read_plain(ws, release, d0), ParquetParams(), shard_format(ws))
    digest, size, version = encrypt_for(
        ws,
        plain,
        KEY,
        snapshot=snapshot.digest,
        shard=d1["id"],
        logical=d0["logicalDigest"],
        key_version="kms-v1",
    )
    new = {**d0, "digest": digest, "size": size, "objectVersion": version}
    forged = forge(ws, release, lambda body: body["shards"].__setitem__(0, new))
    report = verify(ws, forged, keys={"kms-v1": KEY})
    assert_invalid(ws, forged, report, decryptFailures=1, missingMembers=d0["records"])


def test_wrong_reader_on_an_encrypted_shard(ws, snapshot):
    release = _encrypted(ws, snapshot)
    # A reader holding only another key version cannot open the release: not proof.
    report = verify(ws, release, keys={"kms-v2": KEY})
    assert report.outcome == "UNAVAILABLE" and state(ws, release.digest) == "STAGED"
    assert report.counts["keyUnavailable"] == len(rm.wire_shards(release.document()))
    # ...and a plaintext parquet reader pointed at the ciphertext finds no footer.
    release2 = _encrypted(ws, snapshot)  # fresh nonces: a new root, still STAGED
    d = rm.wire_shards(release2.document())[0]
    cipher = shard_path(ws, d).read_bytes()
    ws.store.create(shard_key(d["digest"], encrypted=False), cipher)

    def as_plain(body):
        body["shards"][0]["mediaType"] = rm.SHARD_MEDIA_TYPE
        body["shards"][0]["objectVersion"] = ws.store.head(
            shard_key(d["digest"], encrypted=False)
        ).version_id
        body["writer"]["keyVersion"] = None

    forged = forge(ws, release2, as_plain)
    report = verify(ws, forged, keys={"kms-v1": KEY})
    assert_invalid(ws, forged, report, footerUnreadable=1)


def read_plain(ws, release, d):
    aad = crypto.shard_aad(
        snapshot=release.snapshot,
        shard=d["id"],
        logical_digest=d["logicalDigest"],
        record_schema=release.document()["recordSchema"],
        key_version="kms-v1",
    )
    plain = crypto.decrypt_shard(
        shard_path(ws, d).read_bytes(),
        KEY,
        aad,
        key_version="kms-v1",
        shard=d["id"],
        digest=d["digest"],
    )
    return pq.read_table(io.BytesIO(plain))


def test_root_signed_by_an_untrusted_key(ws, snapshot):
    release = write(ws, snapshot.digest)
    forged = forge(
        ws, release, lambda body: body.update(note="re-signed"), key=SigningKey.generate()
    )
    report = verify(ws, forged)
    assert_invalid(ws, forged, report, **{"fatal:signature-trusted": 1})


def test_verified_release_whose_shard_later_rots_goes_invalid(ws, snapshot):
    release = write(ws, snapshot.digest)
    assert verify(ws, release).state == "VERIFIED"
    assert verify(ws, release).state == "VERIFIED"  # re-verification is recorded, no move
    d = rm.wire_shards(release.document())[0]
    overwrite_in_place(shard_path(ws, d), b"PAR1")
    report = verify(ws, release)
    assert_invalid(ws, release, report, sizeMismatch=1, storageDigestMismatch=1)
    # INVALID is terminal: a later clean report cannot bring it back.

    with ws.db.tx() as conn:
        moves = [e["to_state"] for e in history(conn, "release", release.digest)]
    assert moves == ["STAGED", "VERIFIED", "INVALID"]


# -- unavailable vs proven wrong (issue 8, item 9) ----------------------------------------


def _moves(ws, digest):
    with ws.db.tx() as conn:
        return [e["to_state"] for e in history(conn, "release", digest)]


def test_shard_missing_then_restored_stays_staged_then_verifies(ws, snapshot):
    release = write(ws, snapshot.digest)
    path = shard_path(ws, rm.wire_shards(release.document())[2])
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)  # the exact pinned version is gone for a while
    report = verify(ws, release)
    assert report.outcome == "UNAVAILABLE" and report.unavailable == ["object-unavailable"]
    assert report.state == state(ws, release.digest) == "STAGED"
    assert report.counts["objectUnavailable"] == 1
    # The members of the unread shard are "missing" only because it was not read.
    assert report.counts["missingMembers"] == rm.wire_shards(release.document())[2]["records"]

    assert not latest_report(ws.db, release.digest, "release").ok
    with pytest.raises(RejectedError) as err:
        approve_release(ws, release.digest, approver="alice")
    assert err.value.check == "verification-report"
    aside.rename(path)
    again = verify(ws, release)
    assert again.outcome == "VERIFIED" and state(ws, release.digest) == "VERIFIED"
    approve_release(ws, release.digest, approver="alice")
    assert state(ws, release.digest) == "APPROVED"
    assert _moves(ws, release.digest) == ["STAGED", "VERIFIED", "APPROVED"]
    assert [a.outcome for a in verification_attempts(ws.db, release.digest)] == [
        "UNAVAILABLE",
        "VERIFIED",
    ]


def test_unreadable_shard_is_unavailable_not_invalid(ws, snapshot):
    if os.geteuid() == 0:  # root reads through mode 000: make the path a directory instead
        release = write(ws, snapshot.digest)
        path = shard_path(ws, rm.wire_shards(release.document())[0])
        data = path.read_bytes()
        os.chmod(path, 0o644)
        path.unlink()
        path.mkdir()
        report = verify(ws, release)
        path.rmdir()
        path.write_bytes(data)
    else:
        release = write(ws, snapshot.digest)
        path = shard_path(ws, rm.wire_shards(release.document())[0])
        os.chmod(path, 0)
        report = verify(ws, release)
        os.chmod(path, 0o444)
    assert report.outcome == "UNAVAILABLE" and state(ws, release.digest) == "STAGED"
    failure = report.shards[0]["failures"][0]
    assert failure["check"] == "objectUnavailable" and "could not be read" in failure["message"]
    assert verify(ws, release).state == "VERIFIED"


def test_proven_wrong_beside_a_missing_shard_is_invalid_for_good(ws, snapshot):
    release = write(ws, snapshot.digest)
    missing, rotten = rm.wire_shards(release.document())[0], rm.wire_shards(release.document())[1]
    path = shard_path(ws, missing)
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)
    overwrite_in_place(shard_path(ws, rotten), b"PAR1")
    report = verify(ws, release)
    assert report.outcome == "INVALID" and state(ws, release.digest) == "INVALID"
    assert report.unavailable == ["object-unavailable"]  # recorded, but proof wins
    assert report.counts["storageDigestMismatch"] == 1
    aside.rename(path)
    # INVALID is final: a later attempt can only confirm it.
    assert verify(ws, release).state == "INVALID"
    assert _moves(ws, release.digest) == ["STAGED", "INVALID"]


def test_verified_release_whose_shard_goes_missing_keeps_its_state(ws, snapshot):
    release = write(ws, snapshot.digest)
    assert verify(ws, release).state == "VERIFIED"
    path = shard_path(ws, rm.wire_shards(release.document())[0])
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)
    report = verify(ws, release)
    assert report.outcome == "UNAVAILABLE" and report.state == "VERIFIED"

    assert not latest_report(ws.db, release.digest, "release").ok
    aside.rename(path)
    assert verify(ws, release).outcome == "VERIFIED"
    assert _moves(ws, release.digest) == ["STAGED", "VERIFIED"]


def test_missing_snapshot_membership_is_unavailable(ws, snapshot):
    release = write(ws, snapshot.digest)
    ref = snapshot.manifest.members_ref
    path = ws.store.local_path(ref.key, ref.version_id)
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)
    report = verify(ws, release)
    assert report.outcome == "UNAVAILABLE" and state(ws, release.digest) == "STAGED"
    assert report.counts["unavailable:object-unavailable"] == 1
    aside.rename(path)
    assert verify(ws, release).state == "VERIFIED"


def _cli(home, *args, expect):
    proc = subprocess.run(
        [sys.executable, "-m", "relgate.cli", "--home", str(home), *args, "--json"],
        capture_output=True,
        text=True,
        env={**os.environ, "RELGATE_HASH_WORKERS": "1"},
    )
    assert proc.returncode == expect, (args, proc.returncode, proc.stdout, proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


def test_cli_exit_code_and_state_agree_with_the_catalog(ws):
    snap = build_validated(ws)
    # Item 3: a VALIDATED snapshot nobody approved cannot be released.
    refused = _cli(ws.home, "release", "build", snap.digest, "--records-per-shard", "40", expect=3)
    assert refused["check"] == "snapshot-state" and refused["digest"] == snap.digest
    assert refused["details"]["state"] == "VALIDATED" and snap.digest in refused["object"]
    lifecycle.approve(ws, snap.digest, approver="alice")
    built = _cli(ws.home, "release", "build", snap.digest, "--records-per-shard", "40", expect=0)
    root = built["release"]
    assert built["state"] == "STAGED"
    descriptor = rm.wire_shards(get_release_manifest(ws, root).document())[1]
    path = shard_path(ws, descriptor)
    aside = path.with_name(path.name + ".aside")
    path.rename(aside)
    out = _cli(ws.home, "release", "verify", root, "--workers", "0", expect=3)
    assert (out["outcome"], out["state"], out["check"]) == (
        "UNAVAILABLE",
        "STAGED",
        "object-unavailable",
    )
    assert state(ws, root) == "STAGED"
    aside.rename(path)
    out = _cli(ws.home, "release", "verify", root, "--workers", "0", expect=0)
    assert (out["outcome"], out["state"]) == ("VERIFIED", "VERIFIED") and state(
        ws, root
    ) == "VERIFIED"
    shown = _cli(ws.home, "release", "show", root, expect=0)
    assert [a["outcome"] for a in shown["verificationAttempts"]] == ["UNAVAILABLE", "VERIFIED"]

    # Proven wrong is final, and every later command says so with exit 3.
    good = path.read_bytes()
    overwrite_in_place(path, good[:-7])
    out = _cli(ws.home, "release", "verify", root, "--workers", "0", expect=3)
    assert (out["outcome"], out["state"], out["check"]) == ("INVALID", "INVALID", "verification")
    overwrite_in_place(path, good)
    out = _cli(ws.home, "release", "verify", root, "--workers", "0", expect=3)
    assert (out["outcome"], out["state"], out["check"]) == ("VERIFIED", "INVALID", "release-state")
    rebuilt = _cli(ws.home, "release", "build", snap.digest, "--records-per-shard", "40", expect=3)
    assert rebuilt["release"] == root
    assert (rebuilt["state"], rebuilt["check"]) == ("INVALID", "release-state")
    assert state(ws, root) == "INVALID"


def get_release_manifest(ws, root):
    return rm.load(ws.store, ws.trusted_keys, root, get_release(ws.db, root).envelope_version)


@pytest.mark.s3
def test_s3_shard_unreachable_then_back(tmp_path, moto_s3_endpoint):
    """On moto S3: the shard store unreachable for the verifier's reads (connection
    refused), then reachable again; and a pinned version deleted for real."""

    bucket = f"relgate-rel-{uuid.uuid4().hex[:20]}"
    store = S3ObjectStore(bucket, endpoint_url=moto_s3_endpoint)
    store.ensure_bucket()
    home = tmp_path / "home"
    config = default_config(home)
    config["objectStore"] = {"kind": "s3", "bucket": bucket, "endpointUrl": moto_s3_endpoint}
    ws = Workspace.init(home, config)
    try:
        tag_transform(ws.db, "registry.local/normalize:v1")
        seed_demo(ws, tickets=60, forum_objects=2, per_object=10, chat_events=30)
        snapshot = build_approved(ws)
        release = write(ws, snapshot.digest, records_per_shard=25)
        with socket.socket() as s:  # a loopback port with nothing listening
            s.bind(("127.0.0.1", 0))
            dead = f"http://127.0.0.1:{s.getsockname()[1]}"
        live = dict(ws.config["objectStore"])
        ws.config["objectStore"] = {**live, "endpointUrl": dead}
        report = verify_release(ws, release.digest, workers=0, actor="test")
        assert report.outcome == "UNAVAILABLE" and state(ws, release.digest) == "STAGED"
        assert report.counts["objectUnavailable"] == len(rm.wire_shards(release.document()))
        # The whole store unreachable (root manifest too): still not proof.

        reachable = ws.store
        ws.__dict__["store"] = build_object_store(ws.config["objectStore"])
        report = verify_release(ws, release.digest, workers=0, actor="test")
        assert report.outcome == "UNAVAILABLE" and state(ws, release.digest) == "STAGED"
        assert report.counts["unavailable:object-unavailable"] == 1
        ws.__dict__["store"] = reachable
        ws.config["objectStore"] = live
        report = verify_release(ws, release.digest, workers=0, actor="test")
        assert report.outcome == "VERIFIED" and state(ws, release.digest) == "VERIFIED"

        second = write(ws, snapshot.digest, records_per_shard=30)
        d = rm.wire_shards(second.document())[0]
        ws.store.delete_version(shard_key(d["digest"], encrypted=False), d["objectVersion"])
        report = verify_release(ws, second.digest, workers=0, actor="test")
        assert report.outcome == "UNAVAILABLE" and report.unavailable == ["object-unavailable"]
        assert state(ws, second.digest) == "STAGED"
    finally:
        ws.close()
        store.destroy_bucket()


def test_per_record_token_counts_are_recounted_not_only_the_total(ws, snapshot):
    """Two records' token counts shifted by +3/-3: the shard total, descriptor and every
    digest the forger can recompute agree; only the per-record recount catches it."""
    release = write(ws, snapshot.digest)
    schema = member_schema(ws, release)
    d = rm.wire_shards(release.document())[1]
    table = read_shard(ws, d)
    first, second = table.slice(0, 2).to_pylist()
    assert second["tokens"] >= 3
    changed = rewrite_record(
        rewrite_record(table, 0, tokens=first["tokens"] + 3), 1, tokens=second["tokens"] - 3
    )
    new = store_shard(ws, changed, d, schema)
    assert new["tokens"] == d["tokens"]
    forged = forge(ws, release, lambda body: body["shards"].__setitem__(1, new))
    report = verify(ws, forged)
    assert report.outcome == "INVALID" and state(ws, forged.digest) == "INVALID"
    assert report.failing == {"tokenCountMismatch": 1}
    bad = [s for s in report.shards if not s["ok"]]
    assert [f["message"] for f in bad[0]["failures"]] == [
        "a record's token count is not its recount"
    ]


@pytest.mark.parametrize("delta", [1, -1])
def test_descriptor_record_count_off_by_one(ws, snapshot, delta):
    """The descriptor claims one record more / less than the shard holds (everything
    else consistent): the per-shard record count catches it in both directions."""
    release = write(ws, snapshot.digest)

    def miscount(body):
        body["shards"][2]["records"] += delta

    forged = forge(ws, release, miscount)
    report = verify(ws, forged)
    assert report.outcome == "INVALID" and state(ws, forged.digest) == "INVALID"
    assert report.counts["recordCountMismatch"] == 1
    assert set(report.failing) == {"recordCountMismatch", "totalsMismatch"}


@pytest.mark.parametrize("delta", [1, -1])
def test_descriptor_token_total_off_by_one(ws, snapshot, delta):
    release = write(ws, snapshot.digest)

    def miscount(body):
        body["shards"][0]["tokens"] += delta

    forged = forge(ws, release, miscount)
    report = verify(ws, forged)
    assert report.outcome == "INVALID" and report.counts["tokenCountMismatch"] == 1
    assert set(report.failing) == {"tokenCountMismatch", "totalsMismatch"}


def test_objects_that_are_not_ciphertext_are_proof_not_a_wrong_key(ws, snapshot):
    """Every encrypted descriptor points at bytes that are not AES-GCM shards at all (the
    digests vouch for them): no key could open them, so this is INVALID, never
    'key unavailable' (only an authentication failure of real ciphertext is)."""
    release = _encrypted(ws, snapshot)
    plain = write(ws, snapshot.digest)

    def not_ciphertext(body):
        for i, d in enumerate(body["shards"]):
            data = shard_path(ws, rm.wire_shards(plain.document())[i]).read_bytes()
            digest = sha256_digest(data)
            version = ws.store.create(shard_key(digest, encrypted=True), data).version_id
            d.update(digest=digest, size=len(data), objectVersion=version)

    forged = forge(ws, release, not_ciphertext)
    report = verify(ws, forged, keys={"kms-v1": KEY})
    assert report.outcome == "INVALID" and state(ws, forged.digest) == "INVALID"
    assert report.counts["decryptFailures"] == len(rm.wire_shards(release.document()))
    assert report.counts["keyUnavailable"] == 0
    assert report.shards[0]["failures"][0]["failedCheck"] == "ciphertext-format"
