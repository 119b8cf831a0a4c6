"""Happy path, writer refusals, the encryption envelope and the verifier entry point."""

import json
import subprocess
import sys

import polars as pl
import pytest
from support.releases import read_shard, shard_format, shard_path, state, write
from support.snapshots import build

from relgate.catalog.audit import Approved
from relgate.catalog.snapshot_table import insert_snapshot
from relgate.catalog.states import history, transition
from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.documents.membership import put_membership, tuple_root
from relgate.errors import IntegrityError, ObjectExistsError, RejectedError
from relgate.gate.approvals import sign_approval
from relgate.integrity.signing import verify_envelope
from relgate.release import crypto
from relgate.release.verify import attest
from relgate.release.verify.checks import ZERO_CHECKS
from relgate.release.verify.report import load_report
from relgate.release.verify.verifier import verify_release
from relgate.release.writer import shard_key
from relgate.snapshot.validate import recompute


def test_write_then_verify_in_worker_processes(ws, snapshot):
    release = write(ws, snapshot.digest)
    body = release.document()
    assert state(ws, release.digest) == "STAGED"
    assert body["orderedMemberTupleRoot"] == snapshot.manifest.tuple_root
    assert body["totals"]["records"] == snapshot.manifest.member_count
    assert body["totals"]["shards"] == len(body["shards"]) > 1
    assert body["tombstoneWatermark"] == snapshot.manifest.body["tombstoneWatermark"]
    assert body["recordSchema"] == shard_format(ws).digest
    assert body["recordSchemaDocument"] == shard_format(ws).document.to_json()
    for d in body["shards"]:
        assert set(rm.DESCRIPTOR_FIELDS) <= set(d)
        assert shard_key(d["digest"], encrypted=False) == (
            f"shards/sha256/{d['digest'].removeprefix('sha256:')}.parquet"
        )
    # Records are in sort-seed order, not sampleId order, and none is repeated.
    first = read_shard(ws, body["shards"][0])
    ids = first["sampleId"].to_pylist()
    assert ids != sorted(ids)

    report = verify_release(ws, release.digest, workers=2, actor="test")
    assert report.ok, report.failing
    assert report.counts == dict.fromkeys(ZERO_CHECKS, 0)
    assert report.state == state(ws, release.digest) == "VERIFIED"
    assert report.facts["orderedMemberTupleRoot"] == snapshot.manifest.tuple_root
    assert all(s["ok"] for s in report.shards) and len(report.shards) == len(body["shards"])
    stored = load_report(ws, report.report_digest, report.report_version)
    assert stored.root == release.digest and stored.outcome == "VERIFIED"
    assert stored == report.payload()
    envelope = json.loads(ws.cas.get(report.provenance_digest, report.provenance_version))
    statement = json.loads(
        verify_envelope(
            envelope, ws.trusted_keys, payload_type=attest.PAYLOAD_TYPE, subject="provenance"
        )
    )
    assert statement["_type"] == attest.STATEMENT_TYPE
    assert statement["predicateType"] == attest.PREDICATE_TYPE
    assert statement["subject"][0]["digest"]["sha256"] == release.digest.removeprefix("sha256:")
    byproduct = statement["predicate"]["runDetails"]["byproducts"][0]
    assert byproduct["digest"]["sha256"] == report.report_digest.removeprefix("sha256:")
    with ws.db.tx() as conn:
        assert [e["to_state"] for e in history(conn, "release", release.digest)] == [
            "STAGED",
            "VERIFIED",
        ]
    # Same snapshot and parameters: the same bytes and root, staged idempotently.
    assert write(ws, snapshot.digest).digest == release.digest


def test_shard_size_cut_keeps_record_boundaries(ws, snapshot):
    release = write(ws, snapshot.digest, records_per_shard=None, shard_mb=1)
    assert release.document()["writer"]["shardingFunction"]["targetBytes"] == 1024 * 1024
    assert len(rm.wire_shards(release.document())) == 1
    report = verify_release(ws, release.digest, workers=0, actor="test")
    assert report.ok, report.failing


def test_writer_refuses_a_snapshot_that_is_not_validated(ws):
    result = build(ws)  # BUILDING
    with pytest.raises(RejectedError) as err:
        write(ws, result.digest)
    assert err.value.check == "snapshot-state" and err.value.digest == result.digest


def test_writer_refuses_a_member_whose_content_differs(ws, snapshot):
    members = ws.membership.read(snapshot.manifest.members_ref)
    forged_digest = "sha256:" + "ab" * 32
    victim = members["sampleId"][3]
    members = members.with_columns(
        pl.when(pl.col("sampleId") == victim)
        .then(pl.lit(forged_digest))
        .otherwise(pl.col("logicalContentDigest"))
        .alias("logicalContentDigest")
    )
    ref = put_membership(ws.cas, members.to_arrow())
    body = dict(snapshot.manifest.body)
    body["members"] = {
        **body["members"],
        "uri": ref.uri,
        "objectVersion": ref.version_id,
        "size": ref.size,
        "tupleRoot": tuple_root(members, body["recordSchema"]),
    }
    sealed = sm.seal(body)
    version = sm.store_envelope(ws.store, sealed, sm.sign(sealed, ws.signing_key))
    with ws.db.tx() as conn:
        insert_snapshot(conn, sealed, version, actor="forger")
        transition(conn, "snapshot", sealed.digest, "VALIDATED", actor="forger", reason="forged")
        transition(conn, "snapshot", sealed.digest, "APPROVED", actor="forger", reason="forged")
    # a forger holding the approver key too: only the writer's own recompute can catch it
    sign_approval(
        ws,
        Approved(
            kind="snapshot",
            digest=sealed.digest,
            state="APPROVED",
            approver="forger",
            report="sha256:" + "0" * 64,
        ),
    )
    with pytest.raises(IntegrityError) as err:
        write(ws, sealed.digest)
    assert err.value.check == "member-content"
    assert err.value.digest == forged_digest and victim in err.value.object
    # Named by id and digests only: the member's text is nowhere in the error.
    fresh = recompute(ws, snapshot.manifest, keep_content=True)
    text = fresh.filter(pl.col("sampleId") == victim)["text"][0]
    assert text not in json.dumps(err.value.to_json()) and text not in str(err.value)


def test_writer_never_overwrites_a_staged_key_with_other_bytes(ws, snapshot):
    release = write(ws, snapshot.digest)
    d = rm.wire_shards(release.document())[1]
    path = shard_path(ws, d)
    data = path.read_bytes()
    path.chmod(0o644)
    path.write_bytes(data[:-1] + bytes([data[-1] ^ 1]))  # the key now holds other bytes
    with pytest.raises(IntegrityError) as err:
        write(ws, snapshot.digest)
    assert err.value.check == "staged-bytes" and err.value.digest == d["digest"]
    with pytest.raises(ObjectExistsError):
        ws.store.create(shard_key(d["digest"], encrypted=False), data)


def test_encrypted_release_verifies_with_the_right_key(ws, snapshot):
    key = bytes(range(32))
    release = write(ws, snapshot.digest, encrypt_key=key, key_version="kms-v1")
    assert release.document()["writer"]["keyVersion"] == "kms-v1"
    assert all(
        d["mediaType"] == rm.ENCRYPTED_SHARD_MEDIA_TYPE for d in rm.wire_shards(release.document())
    )
    stored = shard_path(ws, rm.wire_shards(release.document())[0]).read_bytes()
    assert stored.startswith(crypto.MAGIC) and b"PAR1" not in stored[:64]
    report = verify_release(ws, release.digest, workers=0, keys={"kms-v1": key}, actor="test")
    assert report.ok, report.failing


def test_writer_needs_key_and_key_version_together(ws, snapshot):
    with pytest.raises(RejectedError) as err:
        write(ws, snapshot.digest, encrypt_key=bytes(32))
    assert err.value.check == "key-version"


def test_decrypt_errors_name_shard_check_and_digest():
    aad = crypto.shard_aad(
        snapshot="sha256:" + "0" * 64,
        shard="shard-00000-of-00001",
        logical_digest="sha256:" + "1" * 64,
        record_schema="sha256:" + "2" * 64,
        key_version="v1",
    )
    blob = crypto.encrypt_shard(b"records", bytes(32), aad, key_version="v1")
    assert crypto.decrypt_shard(blob, bytes(32), aad, key_version="v1", shard="s", digest="d") == (
        b"records"
    )
    with pytest.raises(IntegrityError) as err:
        crypto.decrypt_shard(blob, b"\x01" * 32, aad, key_version="v1", shard="s0", digest="d0")
    assert (err.value.object, err.value.check, err.value.digest) == (
        "s0",
        "decrypt-authenticate",
        "d0",
    )
    with pytest.raises(IntegrityError):
        crypto.decrypt_shard(blob, bytes(32), aad + b"x", key_version="v1", shard="s", digest="d")


def test_release_verify_shard_checks_a_subset_of_shards(ws, snapshot):
    release = write(ws, snapshot.digest)
    wanted = [
        rm.wire_shards(release.document())[0]["id"],
        rm.wire_shards(release.document())[2]["id"],
    ]
    args = [sys.executable, "-m", "relgate", "--home", str(ws.home), "release"]
    args += ["verify", release.digest, "--workers", "2", "--json"]
    for sid in wanted:
        args += ["--shard", sid]
    out = subprocess.run(args, capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert [s["id"] for s in result["shards"]] == wanted
    assert all(s["ok"] for s in result["shards"]) and result["unknownShards"] == []
    assert state(ws, release.digest) == "STAGED"  # a subset never moves the state
    unknown = [*args[: args.index("--shard")], "--shard", "shard-99999-of-99999"]
    out = subprocess.run(unknown, capture_output=True, text=True, timeout=120, check=False)
    refused = json.loads(out.stdout)
    assert out.returncode == 3, out.stderr
    assert (refused["check"], refused["digest"]) == ("verification", release.digest)
    assert refused["unknownShards"] == ["shard-99999-of-99999"]
