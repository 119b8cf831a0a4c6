"""The gate re-verifies the stored envelope of whatever it moves (SQLite and PostgreSQL).

A payload byte flipped in the stored envelope, or the envelope swapped for another
validly signed manifest's envelope, is refused with exit 3 by ``snapshot activate``,
``release publish``, ``release rollback`` and ``run create``, and nothing moves: the
alias generation and the subject's state are unchanged.  Also here: the mutations the
gate's tests must kill (activation ignoring the benchmark fence, hit counts forced to 0,
rollback ignoring later fence hits).
"""

import base64
import json
import subprocess
import sys

import pytest
from support.releases import overwrite_in_place
from support.runs import create_run
from support.snapshots import build_approved, build_validated

from relgate.catalog.audit import latest_report, record_report
from relgate.catalog.db import execute, utcnow
from relgate.catalog.release_table import get_release
from relgate.catalog.snapshot_table import get_snapshot, insert_snapshot
from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.errors import ConflictError
from relgate.gate.approvals import PAYLOAD_TYPE, Approval, approval_kind
from relgate.gate.transitions import open_gate
from relgate.holds.retention import RetentionPolicy, set_policy
from relgate.integrity.canonical import canonical_bytes
from relgate.integrity.signing import sign_envelope
from relgate.release.publication import approve_release, publish, rollback_release
from relgate.snapshot import activation as lifecycle
from relgate.snapshot.validate import validate_snapshot
from tests.release.test_runs import PURPOSE, _published, _verified

SIGNATURE_CHECKS = {"signature-valid", "signature-trusted"}


def _cli(home, *args, expect):
    proc = subprocess.run(
        [sys.executable, "-m", "relgate.cli", "--home", str(home), *args, "--json"],
        capture_output=True,
        text=True,
    )
    assert proc.returncode == expect, (args, proc.stdout, proc.stderr)
    lines = [line for line in proc.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, proc.stdout
    return json.loads(lines[0])


def _envelope_path(ws, kind, digest):
    if kind == "snapshot":
        return ws.store.local_path(
            sm.envelope_key(digest), get_snapshot(ws.db, digest).envelope_version
        )
    return ws.store.local_path(rm.envelope_key(digest), get_release(ws.db, digest).envelope_version)


def _flip_payload_byte(path):
    envelope = json.loads(path.read_bytes())
    payload = bytearray(base64.b64decode(envelope["payload"]))
    at = payload.index(b'"tombstoneWatermark":') + len(b'"tombstoneWatermark":')
    payload[at] = ord("7") if payload[at] != ord("7") else ord("8")  # still valid JSON
    envelope["payload"] = base64.b64encode(bytes(payload)).decode()
    overwrite_in_place(path, json.dumps(envelope, sort_keys=True).encode())


def _tamper(ws, kind, victim, donor, how):
    path = _envelope_path(ws, kind, victim)
    if how == "flip":
        _flip_payload_byte(path)
    else:  # another validly signed manifest's envelope under the victim's key and version
        overwrite_in_place(path, _envelope_path(ws, kind, donor).read_bytes())


def _assert_refused(out, how, digest):
    assert out["digest"] == digest
    if how == "flip":
        assert out["check"] in SIGNATURE_CHECKS, out
    else:
        assert out["check"] == "manifest-identity", out


@pytest.mark.parametrize("how", ["flip", "swap"])
def test_snapshot_activate_refuses_a_tampered_stored_envelope(ws, how):
    victim = build_validated(ws)
    donor = build_validated(ws, parents=[victim.digest])
    for snap in (victim, donor):
        lifecycle.approve(ws, snap.digest, approver="alice")
    _tamper(ws, "snapshot", victim.digest, donor.digest, how)
    out = _cli(ws.home, "snapshot", "activate", victim.digest, "--alias", "prod", expect=3)
    _assert_refused(out, how, victim.digest)
    alias = open_gate(ws).alias("prod")
    assert (alias.generation, alias.active_digest) == (0, None)  # nothing moved
    assert get_snapshot(ws.db, victim.digest).state == "APPROVED"
    # The untouched donor still activates: the refusal is about the stored bytes.
    assert (
        _cli(ws.home, "snapshot", "activate", donor.digest, "--alias", "prod", expect=0)[
            "generation"
        ]
        == 1
    )


@pytest.mark.parametrize("how", ["flip", "swap"])
def test_publish_rollback_and_admission_refuse_a_tampered_stored_envelope(ws, how):
    snapshot = build_approved(ws)
    old = _published(ws, snapshot)
    candidate = _verified(ws, snapshot, records_per_shard=25)
    approve_release(ws, candidate.digest, approver="alice")
    donor = _verified(ws, snapshot, records_per_shard=30)
    _tamper(ws, "release", candidate.digest, donor.digest, how)
    out = _cli(ws.home, "release", "publish", candidate.digest, "--alias", "train", expect=3)
    _assert_refused(out, how, candidate.digest)
    alias = open_gate(ws).alias("train", "release")
    assert (alias.generation, alias.active_digest) == (1, old.digest)
    assert get_release(ws.db, candidate.digest).state == "APPROVED"

    newer = _published(ws, snapshot, records_per_shard=20)  # old is superseded, then tampered
    _tamper(ws, "release", old.digest, donor.digest, how)
    out = _cli(ws.home, "release", "rollback", "train", "--to", old.digest, expect=3)
    _assert_refused(out, how, old.digest)
    alias = open_gate(ws).alias("train", "release")
    assert (alias.generation, alias.active_digest) == (2, newer.digest)
    common = ["--purpose", PURPOSE, "--world-size", "1"]
    out = _cli(ws.home, "run", "create", "--root", old.digest, *common, expect=3)
    _assert_refused(out, how, old.digest)
    assert _cli(ws.home, "run", "list", expect=0)["runs"] == []  # no run, no permit
    assert _cli(ws.home, "permit", "list", expect=0)["permits"] == []
    assert create_run(ws, root=newer.digest, purpose=PURPOSE, world_size=1, actor="s")


def test_envelope_bound_to_a_row_that_lies_is_refused(ws):
    """A catalog row edited to claim other watermarks than its signed manifest."""
    snap = build_validated(ws)
    lifecycle.approve(ws, snap.digest, approver="alice")
    with ws.db.tx() as conn:
        execute(
            conn,
            "UPDATE snapshots SET member_count = member_count + 1 WHERE digest = :d",
            {"d": snap.digest},
        )
    out = _cli(ws.home, "snapshot", "activate", snap.digest, "--alias", "prod", expect=3)
    assert out["check"] == "envelope-binding" and out["details"]["fields"] == ["member_count"]
    assert open_gate(ws).alias("prod").generation == 0


# -- mutations the gate's tests must kill ----------------------------------------------------


@pytest.mark.parametrize("kind", ["snapshot", "release"])
def test_activation_refused_after_a_benchmark_advance_that_hits_nothing(ws, kind):
    snap = build_validated(ws)
    if kind == "snapshot":
        lifecycle.approve(ws, snap.digest, approver="alice")
        digest = snap.digest
    else:
        lifecycle.approve(ws, snap.digest, approver="alice")  # releases come from approved ones
        release = _verified(ws, snap)
        approve_release(ws, release.digest, approver="alice")
        digest = release.digest
    advance = lifecycle.add_benchmark_items(
        ws, ["sha256:" + "e" * 64], benchmark="unrelated", actor="evals"
    )
    assert advance.hits == {}
    with pytest.raises(ConflictError) as err:
        if kind == "snapshot":
            lifecycle.activate(ws, digest, alias="prod", actor="alice")
        else:
            publish(ws, digest, alias="prod", actor="alice")
    assert err.value.check == "fence-watermarks"
    assert err.value.details["manifest"]["benchmarkFence"] == 0
    assert err.value.details["gate"]["benchmarkFence"] == 1


def test_tombstone_hits_are_counted_per_entry_and_per_root(ws):
    snap = build_validated(ws)
    lifecycle.approve(ws, snap.digest, approver="alice")
    lifecycle.activate(ws, snap.digest, alias="prod", actor="alice")
    ids = ws.membership.read(snap.manifest.members_ref)["sampleId"].to_list()
    advance = lifecycle.add_tombstones(
        ws, [ids[3], "not-a-member", ids[0]], reason="gdpr", actor="dpo"
    )
    seqs = {
        v: advance.first_seq + i for i, v in enumerate(sorted([ids[3], "not-a-member", ids[0]]))
    }
    assert advance.hits == {snap.digest: sorted([seqs[ids[0]], seqs[ids[3]]])}
    assert advance.to_json()["hits"] == {snap.digest: 2}
    assert [h.fence_seq for h in open_gate(ws).hits_for(snap.digest)] == sorted(
        [seqs[ids[0]], seqs[ids[3]]]
    )


def test_rollback_refused_by_later_fence_entries_even_if_no_hit_was_recorded(ws):
    """The old root is outside every retention rule, so the advance recorded no hit on it:
    only the rollback's own check of entries since its watermarks can refuse it."""

    snap = build_approved(ws)
    set_policy(ws.db, RetentionPolicy("train", keep_last=1, keep_days=0, rollback_window=0))
    old = _published(ws, snap)
    _published(ws, snap, records_per_shard=25)
    member = ws.membership.read(snap.manifest.members_ref)["sampleId"][5]
    advance = lifecycle.add_tombstones(ws, [member], reason="gdpr", actor="dpo")
    assert old.digest not in advance.hits
    with pytest.raises(Exception) as err:
        rollback_release(ws, "train", old.digest, actor="ops")
    assert getattr(err.value, "check", None) == "rollback-fences"
    assert err.value.details == {"tombstone": 1}
    assert open_gate(ws).alias("train", "release").generation == 2


@pytest.mark.parametrize("fence", ["tombstone", "benchmark"])
def test_validation_counts_fenced_members_of_a_manifest_that_claims_the_new_watermark(ws, fence):
    """A signed manifest claiming a watermark that already covers one of its members (the
    builder was bypassed): validation must count the hit, not only reject for some reason."""
    import copy

    from support.snapshots import build

    base = build(ws)
    members = ws.membership.read(base.manifest.members_ref)
    if fence == "tombstone":
        lifecycle.add_tombstones(ws, [members["sampleId"][6]], reason="gdpr", actor="dpo")
    else:
        lifecycle.add_benchmark_items(
            ws, [members["logicalContentDigest"][6]], benchmark="b", actor="evals"
        )
    body = copy.deepcopy(base.manifest.body)
    body["tombstoneWatermark" if fence == "tombstone" else "benchmarkFence"] = 1
    body["parents"] = [base.digest]
    forged = sm.seal(body)
    version = sm.store_envelope(ws.store, forged, sm.sign(forged, ws.signing_key))
    with ws.db.tx() as conn:
        insert_snapshot(conn, forged, version, actor="forger")
    report = validate_snapshot(ws, forged.digest, actor="test")
    assert report.outcome == "REJECTED"
    key = "tombstoneHits" if fence == "tombstone" else "benchmarkHits"
    assert report.checks[key] == 1, report.checks


# -- the gate re-verifies the signed approval, not the APPROVED state -------------------------


def _forge_approval(ws, kind, digest, role):
    """An approval of ``digest`` signed with ``role``'s key, recorded as the newest one."""

    statement = Approval(kind, digest, "mallory", "sha256:" + "0" * 64, utcnow()).to_json()
    envelope = sign_envelope(PAYLOAD_TYPE, canonical_bytes(statement), ws.key(role))
    ref = ws.cas.put(json.dumps(envelope, sort_keys=True).encode())
    with ws.db.tx() as conn:
        record_report(conn, approval_kind(kind), digest, ref.digest, ref.version_id, True)


def _mark_approved_in_the_catalog(ws, table, digest):

    with ws.db.tx() as conn:
        execute(conn, f"UPDATE {table} SET state = 'APPROVED' WHERE digest = :d", {"d": digest})


def test_snapshot_row_edited_to_approved_without_a_signed_approval_is_refused(ws):
    snap = build_validated(ws)
    _mark_approved_in_the_catalog(ws, "snapshots", snap.digest)
    out = _cli(ws.home, "snapshot", "activate", snap.digest, "--alias", "prod", expect=3)
    assert (out["check"], out["digest"]) == ("approval", snap.digest), out
    assert open_gate(ws).alias("prod").generation == 0
    assert get_snapshot(ws.db, snap.digest).state == "APPROVED"  # nothing moved


@pytest.mark.parametrize("role", ["builder", "verifier", "gate"])
def test_approval_signed_by_another_role_is_refused(ws, role):
    snap = build_validated(ws)
    _mark_approved_in_the_catalog(ws, "snapshots", snap.digest)
    _forge_approval(ws, "snapshot", snap.digest, role)
    out = _cli(ws.home, "snapshot", "activate", snap.digest, "--alias", "prod", expect=3)
    assert (out["check"], out["digest"]) == ("key-role", snap.digest), out
    assert open_gate(ws).alias("prod").generation == 0


def test_release_published_only_with_its_signed_approval(ws):
    snap = build_approved(ws)
    forged = _verified(ws, snap)
    _mark_approved_in_the_catalog(ws, "releases", forged.digest)
    out = _cli(ws.home, "release", "publish", forged.digest, "--alias", "train", expect=3)
    assert (out["check"], out["digest"]) == ("approval", forged.digest), out
    # an approval of another digest does not carry over
    other = _verified(ws, snap, records_per_shard=25)
    approve_release(ws, other.digest, approver="alice")
    out = _cli(ws.home, "release", "publish", forged.digest, "--alias", "train", expect=3)
    assert out["check"] == "approval", out
    _forge_approval(ws, "release", forged.digest, "approver")  # trusted key, right subject
    assert _cli(ws.home, "release", "publish", forged.digest, "--alias", "train", expect=0)
    assert get_release(ws.db, forged.digest).state == "PUBLISHED"


def test_approval_row_pointing_at_another_digests_approval_is_refused(ws):
    """A reports row for snapshot A that names the (validly signed) approval of snapshot B."""

    a = build_validated(ws)
    b = build_approved(ws, parents=[a.digest])
    _mark_approved_in_the_catalog(ws, "snapshots", a.digest)
    theirs = latest_report(ws.db, b.digest, approval_kind("snapshot"))
    with ws.db.tx() as conn:
        record_report(
            conn,
            approval_kind("snapshot"),
            a.digest,
            theirs.report_digest,
            theirs.report_version,
            True,
        )
    out = _cli(ws.home, "snapshot", "activate", a.digest, "--alias", "prod", expect=3)
    assert (out["check"], out["digest"]) == ("approval-subject", a.digest), out
    assert open_gate(ws).alias("prod").generation == 0
