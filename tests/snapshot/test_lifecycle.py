import pytest
from support.snapshots import build, build_active, build_validated, state_of

from relgate.catalog.snapshot_table import snapshot_history
from relgate.errors import ConflictError, RejectedError
from relgate.integrity.merkle import check_proof
from relgate.snapshot import activation as lifecycle
from relgate.snapshot import selection
from relgate.snapshot.diff import diff, load_manifest, prove
from relgate.snapshot.replay import replay


def test_build_validate_approve_activate(ws):
    result = build_validated(ws)
    assert state_of(ws, result.digest) == "VALIDATED"
    body = load_manifest(ws, result.digest).body
    assert body["schema"] == "training.dataset.snapshot.v1"
    assert {s["id"] for s in body["sources"]} == {"tickets-eu", "forum", "chat-cdc"}
    assert all(isinstance(v, int) for v in body["splits"].values())
    assert sum(body["splits"].values()) == body["members"]["count"] == result.manifest.member_count
    assert "text" not in str(body["members"])  # no sample text in the manifest
    lifecycle.approve(ws, result.digest, approver="alice")
    out = lifecycle.activate(ws, result.digest, alias="default", actor="alice")
    assert out.generation == 1
    assert state_of(ws, result.digest) == "ACTIVE"
    states = [h["to_state"] for h in snapshot_history(ws.db, result.digest)]
    assert states == ["BUILDING", "VALIDATED", "APPROVED", "ACTIVE"]


def test_states_only_move_forward(ws):
    result = build_validated(ws)
    with pytest.raises(RejectedError) as err:
        lifecycle.activate(ws, result.digest, alias="default", actor="x")  # not approved
    assert err.value.check == "state"
    first = lifecycle.approve(ws, result.digest, approver="alice")
    assert first.existing == "false"
    # Approving an approved (or active) snapshot again moves nothing: the first approval
    # stands and is reported, whoever asks.
    again = lifecycle.approve(ws, result.digest, approver="bob")
    assert again.existing == "true" and again.state == "APPROVED"
    assert (again.approver, again.approval) == ("alice", first.approval)
    lifecycle.activate(ws, result.digest, alias="default", actor="alice")
    active = lifecycle.approve(ws, result.digest, approver="bob")
    assert (active.state, active.approval) == ("ACTIVE", first.approval)
    states = [h["to_state"] for h in snapshot_history(ws.db, result.digest)]
    assert states == ["BUILDING", "VALIDATED", "APPROVED", "ACTIVE"]


def test_approval_needs_a_name(ws):
    result = build_validated(ws)
    with pytest.raises(RejectedError) as err:
        lifecycle.approve(ws, result.digest, approver="  ")
    assert err.value.check == "approver"


def test_cas_retry_is_idempotent_only_with_the_same_digest(ws):
    first = build_validated(ws)
    lifecycle.approve(ws, first.digest, approver="alice")
    a = lifecycle.activate(ws, first.digest, alias="default", actor="a", expected_generation=0)
    again = lifecycle.activate(ws, first.digest, alias="default", actor="a", expected_generation=0)
    assert again.idempotent_retry and again.generation == a.generation == 1
    second = build_validated(ws)
    lifecycle.approve(ws, second.digest, approver="alice")
    with pytest.raises(ConflictError) as err:
        lifecycle.activate(ws, second.digest, alias="default", actor="b", expected_generation=0)
    assert err.value.check == "alias-generation" and err.value.exit_code == 4
    assert (
        lifecycle.activate(
            ws, second.digest, alias="default", actor="b", expected_generation=1
        ).generation
        == 2
    )


def test_rollback_appends_a_generation_and_is_refused_after_a_hit(ws):
    first = build_active(ws)
    second = build_validated(ws)
    lifecycle.approve(ws, second.digest, approver="alice")
    lifecycle.activate(ws, second.digest, alias="default", actor="a")
    back = lifecycle.rollback(ws, "default", first.digest, actor="ops")
    assert back.generation == 3 and back.active_digest == first.digest
    # A tombstone that hits the first snapshot's members: rolling back to it again is refused.
    lifecycle.rollback(ws, "default", second.digest, actor="ops")
    member = ws.membership.read(first.manifest.members_ref)["sampleId"][0]
    lifecycle.add_tombstones(ws, [member], reason="gdpr", actor="dpo")
    with pytest.raises(RejectedError) as err:
        lifecycle.rollback(ws, "default", first.digest, actor="ops")
    assert err.value.check == "rollback-fences" and err.value.digest == first.digest


def test_tombstone_after_build_blocks_activation_and_rebuild_excludes_it(ws):
    result = build_validated(ws)
    lifecycle.approve(ws, result.digest, approver="alice")
    member = ws.membership.read(result.manifest.members_ref)["sampleId"][3]
    adv = lifecycle.add_tombstones(ws, [member], reason="gdpr", actor="dpo")
    assert adv.hits == {result.digest: [1]}
    with pytest.raises(ConflictError) as err:
        lifecycle.activate(ws, result.digest, alias="default", actor="a")
    assert err.value.check == "fence-watermarks"
    assert state_of(ws, result.digest) == "APPROVED"
    rebuilt = build_validated(ws)
    members = ws.membership.read(rebuilt.manifest.members_ref)
    assert member not in members["sampleId"].to_list()
    assert rebuilt.manifest.body["tombstoneWatermark"] == 1


def test_benchmark_fence_excludes_by_content(ws):
    result = build_validated(ws)
    digest = ws.membership.read(result.manifest.members_ref)["logicalContentDigest"][0]
    lifecycle.add_benchmark_items(ws, [digest], benchmark="mmlu-canary", actor="eval")
    rebuilt = build_validated(ws)
    assert (
        digest
        not in ws.membership.read(rebuilt.manifest.members_ref)["logicalContentDigest"].to_list()
    )
    assert rebuilt.counts["excludedBenchmark"] >= 1


def test_diff_reports_additions_deletions_and_deltas(ws):
    first = build_validated(ws)
    members = ws.membership.read(first.manifest.members_ref)
    gone = members["sampleId"][0]
    lifecycle.add_tombstones(ws, [gone], reason="gdpr", actor="dpo")
    ws.store.put(
        "raw/forum/thread-9999.jsonl",
        b'{"id": "forum/new-1", "lang": "en", "text": "a brand new forum post about routers"}\n',
    )
    second = build_validated(ws)
    d = diff(ws, first.digest, second.digest).to_json()
    assert d["additions"] == 1 and d["deletions"] == 1
    assert d["examples"]["added"] == ["forum/new-1"] and d["examples"]["deleted"] == [gone]
    assert (
        d["bySource"]["forum"]["delta"]
        + d["bySource"].get("tickets-eu", {"delta": 0})["delta"]
        + d["bySource"]["chat-cdc"]["delta"]
        == 0
    )
    assert d["splitMigrations"] == {}


def test_replay_reproduces_the_member_set(ws):
    result = build_validated(ws)
    out = replay(ws, result.digest, canary_bp=3000).to_json()
    assert out["result"] == "REPRODUCED" and out["missing"] == out["extra"] == 0
    full = replay(ws, result.digest).to_json()
    assert full["replayedIds"] == result.manifest.member_count


def test_proofs_verify_independently(ws):
    result = build_validated(ws)
    sample = ws.membership.read(result.manifest.members_ref)["sampleId"][5]
    inclusion = prove(ws, result.digest, sample).to_json()
    assert inclusion["kind"] == "inclusion" and check_proof(inclusion)
    absent = prove(ws, result.digest, sample + "-nope").to_json()
    assert absent["kind"] == "non-inclusion" and check_proof(absent)
    forged = {**inclusion, "sampleId": sample + "-nope"}
    assert not check_proof(forged)
    lying = {**absent, "kind": "inclusion"}
    assert not check_proof(lying)


def test_build_parents_and_prov_lineage(ws):
    first = build_active(ws)
    second = build(ws, parents=[first.digest])
    prov = second.manifest.body["provenance"]
    assert second.manifest.body["parents"] == [first.digest]
    assert {"entity": first.digest, "kind": "snapshot"} in prov["wasDerivedFrom"]
    assert prov["wasAssociatedWith"]["keyid"] == ws.signing_key.keyid
    assert prov["wasGeneratedBy"]["transform"].startswith("registry.local/normalize@sha256:")


def test_batched_selection_gives_the_same_membership(ws, monkeypatch):

    whole = build_validated(ws)
    monkeypatch.setattr(selection, "BATCH_ROWS", 7)
    batched = build_validated(ws)
    assert batched.manifest.body["members"]["uri"] == whole.manifest.body["members"]["uri"]
    assert batched.counts == whole.counts
