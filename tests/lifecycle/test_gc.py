"""Garbage collection against the real catalog (SQLite and PostgreSQL) and the local
versioned store: the seed's example, and every Lifecycle row of the fault matrix.

After every sweep, every retained version is verified end to end (signed manifests,
every referenced object read from its exact version and hashed)."""

import json

import pytest
from relgate_trust.digests import sha256_digest
from support.lifecycle import (
    candidate_set,
    forge_release,
    publish,
    set_state,
    shard_keys,
    stored_set,
)
from support.releases import overwrite_in_place

from relgate.catalog.release_table import get_release
from relgate.documents import release_root as rm
from relgate.errors import RejectedError
from relgate.gate.transitions import open_gate
from relgate.holds.pins import acquire_lease, add_pin, get_lease, release_lease, remove_pin
from relgate.holds.retention import RetentionPolicy, set_policy
from relgate.lifecycle.collector import deletions, list_stored, plan_gc, sweep, verify_retained
from relgate.objects.layout import canonical_key
from relgate.release.verify.verifier import verify_release
from relgate.release.writer import shard_key, stage_object, write_release


def _seed_versions(ws, release):
    """v1 = {A, B}, v2 = {A, C}, v3 = {D}; the base release is INVALID (not retained)."""
    ids = [d["id"] for d in rm.wire_shards(release.document())]
    assert len(ids) >= 4
    a, b, c, d = ids[:4]
    set_policy(ws.db, RetentionPolicy("train", keep_last=1, keep_days=0, rollback_window=0))
    set_state(ws, "release", release.digest, "INVALID")
    v1 = forge_release(ws, release, {a, b}, tag="v1")
    v2 = forge_release(ws, release, {a, c}, tag="v2")
    v3 = forge_release(ws, release, {d}, tag="v3")
    for version in (v1, v2, v3):
        publish(ws, version.digest, "train")
    return (a, b, c, d), v1, v2, v3


def test_seed_example_only_c_is_a_candidate(ws, release):
    (a, b, c, d), v1, v2, _v3 = _seed_versions(ws, release)
    keys = shard_keys(release)
    position = {"root": v1.digest, "seed": 7, "shards": [a, b], "data_pass": 0}
    pin = add_pin(
        ws,
        v1.digest,
        owner="trainer",
        reason="checkpoint step 1000",
        kind="checkpoint",
        position=position,
    )
    example = {keys[s] for s in (a, b, c)}
    plan = plan_gc(ws, grace_seconds=0)
    assert candidate_set(plan) & example == {keys[c]}
    assert keys[d] not in candidate_set(plan)  # v3 is active
    reason = next(x.reason for x in plan.candidates if (x.key, x.version_id) == keys[c])
    assert "not retained" in reason

    # Both retained: no candidates among the example's objects.
    both = add_pin(
        ws, v2.digest, owner="auditor", reason="audit", expires_at="2999-01-01T00:00:00Z"
    )
    assert candidate_set(plan_gc(ws, grace_seconds=0)) & example == set()
    remove_pin(ws, both.pin_id, actor="auditor")

    result = sweep(ws, actor="gc", grace_seconds=0)
    gone = {(x["key"], x["versionId"]) for x in result.to_json()["deleted"]}
    assert keys[c] in gone and not gone & {keys[a], keys[b], keys[d]}
    stored = stored_set(ws, "shards/")
    assert {keys[a], keys[b], keys[d]} <= stored and keys[c] not in stored
    logged = {(x.object_key, x.version_id): x.reason for x in deletions(ws, result.gc_run)}
    assert "not retained" in logged[keys[c]]
    assert verify_retained(ws).versions >= 2
    assert pin.kind == "checkpoint" and pin.position["root"] == v1.digest


def test_missing_retained_manifest_fails_closed(ws, release):
    row = get_release(ws.db, release.digest)
    key = rm.envelope_key(release.digest)
    ws.store.delete_version(key, row.envelope_version)
    before = stored_set(ws)
    for action in (
        lambda: plan_gc(ws, grace_seconds=0),
        lambda: sweep(ws, actor="gc", grace_seconds=0),
    ):
        with pytest.raises(RejectedError) as err:
            action()
        assert err.value.check == "retained-manifest"
        assert err.value.object == f"{key}@{row.envelope_version}"
        assert err.value.digest == release.digest
    assert stored_set(ws) == before  # nothing deleted


def test_unreadable_retained_manifest_fails_closed(ws, release):
    row = get_release(ws.db, release.digest)
    key = rm.envelope_key(release.digest)
    overwrite_in_place(ws.store.local_path(key, row.envelope_version), b"{not json")
    with pytest.raises(RejectedError) as err:
        plan_gc(ws, grace_seconds=0)
    assert (err.value.check, err.value.digest) == ("retained-manifest", release.digest)


def test_missing_retained_object_fails_closed(ws, release):
    key, version = next(iter(shard_keys(release).values()))
    ws.store.delete_version(key, version)
    before = stored_set(ws)
    with pytest.raises(RejectedError) as err:
        sweep(ws, actor="gc", grace_seconds=0)
    assert err.value.check == "retained-object-present"
    assert err.value.object == f"{key}@{version}"
    assert err.value.digest == release.digest
    assert stored_set(ws) == before


def test_in_progress_publisher_staged_objects_survive(ws, release):
    data = b"staged shard bytes of a publisher that has not committed"

    key = shard_key(sha256_digest(data), encrypted=False)
    lease = acquire_lease(ws, holder="writer-1", purpose="publisher", ttl_seconds=3600, keys=[key])
    version = stage_object(ws.store, key, data)
    plan = plan_gc(ws, grace_seconds=0)
    assert (key, version) not in candidate_set(plan)
    assert plan.excluded["publisher-lease"] >= 1
    sweep(ws, actor="gc", grace_seconds=0)
    assert (key, version) in stored_set(ws, "shards/")
    # Without the lease, the grace period still protects a young object...
    release_lease(ws, lease.lease_id)
    assert (key, version) not in candidate_set(plan_gc(ws, grace_seconds=3600))
    # ...and once both are gone it is an orphan.
    assert (key, version) in candidate_set(plan_gc(ws, grace_seconds=0))
    verify_retained(ws)


def test_candidate_rereferenced_within_grace_survives(ws, release):
    set_state(ws, "release", release.digest, "INVALID")
    ids = [d["id"] for d in rm.wire_shards(release.document())]
    keys = shard_keys(release)
    plan = plan_gc(ws, grace_seconds=0)
    assert keys[ids[0]] in candidate_set(plan)
    # Between the plan and the sweep a new version re-references the candidate.
    again = forge_release(ws, release, {ids[0]}, tag="again")
    result = sweep(ws, actor="gc", grace_seconds=0, plan=plan)
    assert result.skipped.get("re-referenced", 0) >= 1
    assert keys[ids[0]] in stored_set(ws, "shards/")
    assert keys[ids[1]] not in stored_set(ws, "shards/")  # not re-referenced: deleted
    assert ("release", again.digest) in plan_gc(ws, grace_seconds=0).retained
    verify_retained(ws)


def test_pin_after_plan_is_honoured_by_sweep(ws, release):
    set_state(ws, "release", release.digest, "INVALID")
    plan = plan_gc(ws, grace_seconds=0)
    assert plan.candidates
    add_pin(ws, release.digest, owner="auditor", reason="legal hold")
    result = sweep(ws, actor="gc", grace_seconds=0, plan=plan)
    assert not any(x["key"].startswith("shards/") for x in result.to_json()["deleted"])
    assert set(shard_keys(release).values()) <= stored_set(ws, "shards/")
    verify_retained(ws)


def test_same_object_under_two_spellings_is_not_an_orphan(ws, release):
    key, version = next(iter(shard_keys(release).values()))
    data = ws.store.get(key, version)
    hexpart = key.rsplit("/", 1)[1].split(".")[0]
    spelled = key.replace("shards/sha256/", "shards//sha256/./").replace(hexpart, hexpart.upper())
    assert spelled != key and canonical_key(spelled) == key
    copy = ws.store.create(spelled, data)
    plan = plan_gc(ws, grace_seconds=0)
    assert (spelled, copy.version_id) not in candidate_set(plan)
    assert plan.excluded["other-spelling-of-required-key"] == 1
    sweep(ws, actor="gc", grace_seconds=0)
    assert (spelled, copy.version_id) in stored_set(ws, "shards/")
    verify_retained(ws)
    # A lease spelled as a full URI protects the canonical stored key too.
    set_state(ws, "release", release.digest, "INVALID")
    acquire_lease(
        ws,
        holder="w",
        purpose="publisher",
        ttl_seconds=3600,
        keys=[
            f"s3://bucket/{spelled}",
            "./" + key.upper().replace("SHARDS/SHA256", "shards/sha256"),
        ],
    )
    assert (key, version) not in candidate_set(plan_gc(ws, grace_seconds=0))


def test_unknown_publication_outcome_is_never_acted_on(ws, release):
    set_state(ws, "release", release.digest, "INVALID")
    ids = [d["id"] for d in rm.wire_shards(release.document())]
    keys = shard_keys(release)
    orphan = forge_release(ws, release, {ids[0]}, tag="crashed", insert=False)
    plan = plan_gc(ws, grace_seconds=0)
    assert any(rm.envelope_key(orphan.digest) in n for n in plan.unknown_outcome)
    found = candidate_set(plan)
    assert keys[ids[0]] not in found
    assert not any(k == rm.envelope_key(orphan.digest) for k, _ in found)
    assert keys[ids[1]] in found


def test_published_release_still_verifies_after_sweep(ws, release):
    other = forge_release(ws, release, {rm.wire_shards(release.document())[0]["id"]}, tag="junk")
    set_state(ws, "release", other.digest, "INVALID")
    publish(ws, release.digest, "prod")
    result = sweep(ws, actor="gc", grace_seconds=0)
    # The INVALID release's root is its audit trail: kept (item 5 of issue 28).
    assert not any(rm.envelope_key(other.digest) == x["key"] for x in result.to_json()["deleted"])
    report = verify_release(ws, release.digest, workers=0, actor="test")
    assert report.ok, report.problems
    verify_retained(ws)


def test_alias_retention_window(ws, release):
    versions = [
        forge_release(ws, release, {d["id"]}, tag=f"g{i}")
        for i, d in enumerate(rm.wire_shards(release.document())[:3])
    ]
    set_state(ws, "release", release.digest, "INVALID")
    for v in versions:
        publish(ws, v.digest, "nightly")
    set_policy(ws.db, RetentionPolicy("nightly", keep_last=1, keep_days=0, rollback_window=1))
    held = plan_gc(ws, grace_seconds=0).retained
    assert ("release", versions[2].digest) in held  # active
    assert any("rollback window" in r for r in held[("release", versions[1].digest)])
    assert ("release", versions[0].digest) not in held
    set_policy(ws.db, RetentionPolicy("nightly", keep_last=1, keep_days=7, rollback_window=0))
    held = plan_gc(ws, grace_seconds=0).retained
    assert ("release", versions[0].digest) in held  # retired less than 7 days ago
    set_policy(ws.db, RetentionPolicy("nightly", keep_last=3, keep_days=0, rollback_window=0))
    assert ("release", versions[0].digest) in plan_gc(ws, grace_seconds=0).retained


def test_expired_pin_protects_nothing(ws, release):
    set_state(ws, "release", release.digest, "INVALID")
    add_pin(ws, release.digest, owner="a", reason="r", expires_at="2000-01-01T00:00:00Z")
    assert set(shard_keys(release).values()) <= candidate_set(plan_gc(ws, grace_seconds=0))


def test_plan_json_is_one_object(ws, release):
    doc = plan_gc(ws, grace_seconds=0).to_json()
    json.dumps(doc)
    assert doc["mode"] == "plan" and doc["requiredObjects"] > 0


def test_rollback_to_a_purged_version_is_refused(ws, release):
    versions = [
        forge_release(ws, release, {d["id"]}, tag=f"r{i}")
        for i, d in enumerate(rm.wire_shards(release.document())[:3])
    ]
    set_state(ws, "release", release.digest, "INVALID")
    for v in versions:
        publish(ws, v.digest, "serve")
    set_policy(ws.db, RetentionPolicy("serve", keep_last=2, keep_days=0, rollback_window=1))
    sweep(ws, actor="gc", grace_seconds=0)
    gate = open_gate(ws)
    generation = gate.alias("serve", "release").generation
    with pytest.raises(RejectedError) as err:
        gate.rollback(
            "release", "serve", versions[0].digest, expected_generation=generation, actor="ops"
        )
    assert (err.value.check, err.value.digest) == ("rollback-purged", versions[0].digest)
    # Inside the window the rollback still works, and the version verifies.
    gate.rollback(
        "release", "serve", versions[1].digest, expected_generation=generation, actor="ops"
    )
    verify_retained(ws)


def test_writer_under_a_publisher_lease_is_never_swept(ws, snapshot):
    lease = acquire_lease(ws, holder="writer", purpose="publisher", ttl_seconds=600)
    manifest = write_release(
        ws, snapshot.digest, records_per_shard=40, actor="test", lease_id=lease.lease_id
    )
    leased = set(get_lease_keys(ws, lease.lease_id))
    assert {k for k, _ in shard_keys(manifest).values()} | {
        rm.envelope_key(manifest.digest)
    } <= leased
    # Even INVALID (not retained) its objects stay while the publisher holds the lease.
    set_state(ws, "release", manifest.digest, "INVALID")
    sweep(ws, actor="gc", grace_seconds=0)
    assert set(shard_keys(manifest).values()) <= stored_set(ws, "shards/")
    release_lease(ws, lease.lease_id)
    sweep(ws, actor="gc", grace_seconds=0)
    assert not set(shard_keys(manifest).values()) & stored_set(ws, "shards/")
    verify_retained(ws)


def get_lease_keys(ws, lease_id):
    return get_lease(ws, lease_id).keys


def test_plan_never_counts_more_required_than_stored_objects(ws, release):
    """The demo's plan once said "23 stored objects, 34 required": the required count took
    in the raw-source objects the snapshot pins, which live outside the managed prefixes
    the stored count lists.  Required now counts stored managed objects only; the raw
    sources are counted apart."""
    publish(ws, release.digest, "train")
    plan = plan_gc(ws, grace_seconds=0)
    report = plan.report(limit=0)
    listed = list_stored(ws)
    stored = set(
        zip(listed["canonical"].to_pylist(), listed["version_id"].to_pylist(), strict=True)
    )
    required = plan.required
    assert report.stored_objects == len(stored)
    assert report.required_objects == len(required & stored) > 0
    assert report.raw_source_objects == len(required - stored) > 0
    assert report.required_objects <= report.stored_objects
    assert report.required_objects + report.candidate_count <= report.stored_objects
    doc = report.to_json()
    assert doc["requiredObjects"] == report.required_objects
    assert doc["rawSourceObjects"] == report.raw_source_objects
