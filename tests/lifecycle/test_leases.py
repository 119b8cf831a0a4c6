"""Publisher leases by default, and the sweep-time rechecks (issue 8, items 4 and 12).

Each recheck test is built so that deleting the recheck from ``sweep`` makes it fail:
the plan handed to the sweep lists the object as a candidate, and only the in-gate
recheck at sweep time can still save it.  The writer tests inject a real sweep (grace 0)
at the exact moment a writer has staged its objects but not yet committed its row.
"""

import dagster as dg
import pytest
from relgate_trust.digests import sha256_digest
from support.lifecycle import candidate_set, shard_keys, stored_set
from support.snapshots import build, build_validated

from relgate.catalog.db import rows
from relgate.catalog.release_table import get_release, list_releases
from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.errors import RejectedError
from relgate.holds.pins import acquire_lease, get_lease, release_lease
from relgate.lifecycle.collector import plan_gc, sweep, verify_retained
from relgate.objects.layout import canonical_key
from relgate.release.verify.verifier import verify_release
from relgate.release.writer import shard_key, stage_object, write_release
from relgate.snapshot.validate import validate_snapshot


def _orphan(ws, tag):
    data = f"bytes staged by a publisher that never committed ({tag})".encode()
    key = shard_key(sha256_digest(data), encrypted=False)
    return key, data, stage_object(ws.store, key, data)


def test_sweep_rechecks_a_publisher_lease_taken_after_the_plan(ws, release):
    key, data, version = _orphan(ws, "lease")
    plan = plan_gc(ws, grace_seconds=0)
    assert (key, version) in candidate_set(plan)
    # A publisher now re-stages identical bytes: it leases the key and reuses the version.
    lease = acquire_lease(ws, holder="writer-2", purpose="publisher", ttl_seconds=600, keys=[key])
    assert stage_object(ws.store, key, data) == version
    result = sweep(ws, actor="gc", grace_seconds=0, plan=plan)
    assert result.skipped["publisher-lease"] == 1
    assert (key, version) in stored_set(ws, "shards/")
    release_lease(ws, lease.lease_id)
    # Released: the next sweep takes it (so the lease, not something else, kept it).
    sweep(ws, actor="gc", grace_seconds=0)
    assert (key, version) not in stored_set(ws, "shards/")
    verify_retained(ws)


def test_sweep_rechecks_the_grace_period_at_sweep_time(ws, release):
    key, _, version = _orphan(ws, "grace")
    plan = plan_gc(ws, grace_seconds=0)  # e.g. a plan made with another grace period
    assert (key, version) in candidate_set(plan)
    result = sweep(ws, actor="gc", grace_seconds=3600, plan=plan)
    assert result.deleted_count == 0
    assert result.skipped["younger-than-grace"] == len(plan.candidates)
    assert (key, version) in stored_set(ws, "shards/")


def test_sweep_never_deletes_a_version_it_has_no_first_seen_record_of(ws, release):
    key, _, version = _orphan(ws, "unseen")
    plan = plan_gc(ws, grace_seconds=0, record=False)
    assert (key, version) in candidate_set(plan)
    result = sweep(ws, actor="gc", grace_seconds=0, plan=plan)
    assert (key, version) in stored_set(ws, "shards/")
    assert result.skipped["younger-than-grace"] >= 1


def test_expired_publisher_lease_protects_nothing(ws, release):
    key, _, version = _orphan(ws, "expired")
    lease = acquire_lease(ws, holder="w", purpose="publisher", ttl_seconds=1, keys=[key])
    import datetime as dt

    later = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=5)
    assert (key, version) in candidate_set(plan_gc(ws, grace_seconds=0, now=later))
    assert get_lease(ws, lease.lease_id).keys == [key]


def _sweep_at(monkeypatch, module, name, ws):
    """Run a real sweep (grace 0) just before ``module.name`` is called."""
    original = getattr(module, name)
    swept = []

    def hooked(*args, **kwargs):
        swept.append(sweep(ws, actor="gc-racer", grace_seconds=0))
        return original(*args, **kwargs)

    monkeypatch.setattr(module, name, hooked)
    return swept


def test_release_writer_holds_a_publisher_lease_by_default(ws, snapshot, monkeypatch):
    swept = _sweep_at(monkeypatch, rm, "store_envelope", ws)
    manifest = write_release(ws, snapshot.digest, records_per_shard=40, actor="t")
    monkeypatch.undo()
    assert len(swept) == 1
    assert swept[0].skipped.get("publisher-lease", 0) + swept[0].excluded.get(
        "publisher-lease", 0
    ) >= len(rm.wire_shards(manifest.document()))
    assert set(shard_keys(manifest).values()) <= stored_set(ws, "shards/")
    assert verify_release(ws, manifest.digest, workers=0, actor="t").state == "VERIFIED"
    with ws.db.tx() as conn:
        leases = rows(
            conn, "SELECT lease_id, holder, state FROM leases WHERE holder LIKE 'release-%'"
        )
    assert [(x["holder"], x["state"]) for x in leases] == [("release-writer:t", "RELEASED")]
    keys = set(get_lease(ws, leases[0]["lease_id"]).keys)
    assert {k for k, _ in shard_keys(manifest).values()} | {
        rm.envelope_key(manifest.digest)
    } <= keys


def test_snapshot_builder_holds_a_publisher_lease_by_default(ws, monkeypatch):
    swept = _sweep_at(monkeypatch, sm, "store_envelope", ws)
    result = build(ws)
    monkeypatch.undo()
    assert len(swept) == 1
    ref = result.manifest.members_ref
    ws.store.head(ref.key, ref.version_id)  # the just-staged membership table survived
    report = validate_snapshot(ws, result.digest, actor="t")
    assert report.outcome == "VALIDATED", (report.checks, report.problems)
    with ws.db.tx() as conn:
        leases = rows(conn, "SELECT holder, state FROM leases")
    assert len(leases) == 1 and leases[0]["holder"].startswith("snapshot-builder:test:")
    assert leases[0]["state"] == "RELEASED"


def test_release_build_refused_from_an_unapproved_snapshot(ws):
    snap = build_validated(ws)
    with pytest.raises(RejectedError) as err:
        write_release(ws, snap.digest, records_per_shard=40, actor="t")
    assert err.value.check == "snapshot-state" and err.value.digest == snap.digest
    assert err.value.details["state"] == "VALIDATED"


def test_dagster_release_depends_on_the_activated_snapshot_and_refuses_an_unapproved_one(ws):
    from assets.releases import shard_release
    from resources.relgate import RelgateResource

    deps = {key.to_user_string() for key in shard_release.dependency_keys}
    assert deps == {"snapshot_alias"}  # never the raw dataset_snapshot

    nightly = build_validated(ws)  # built and validated, nobody approved it

    @dg.asset(name="snapshot_alias")
    def forged_alias() -> dict:
        return {"activeDigest": nightly.digest, "generation": 1}

    with dg.instance_for_test() as instance:
        result = dg.materialize(
            [forged_alias, shard_release],
            instance=instance,
            resources={"relgate": RelgateResource(home=str(ws.home))},
            run_config={"ops": {"shard_release": {"config": {"records_per_shard": 40}}}},
            raise_on_error=False,
        )
    assert not result.success
    failure = next(e for e in result.all_events if e.event_type_value == "STEP_FAILURE")
    assert failure.step_key == "shard_release"
    text = str(failure.event_specific_data.error)
    assert "snapshot-state" in text and nightly.digest in text and "VALIDATED" in text

    assert list_releases(ws.db) == []


def test_dagster_writers_hold_publisher_leases_and_release_from_the_activated_snapshot(ws):
    from assets.releases import shard_release
    from assets.snapshots import snapshot_assets, snapshot_checks
    from resources.relgate import RelgateResource

    resources = {"relgate": RelgateResource(home=str(ws.home))}
    with dg.instance_for_test() as instance:
        snap = dg.materialize(
            [*snapshot_assets, *snapshot_checks],
            instance=instance,
            resources=resources,
            run_config={
                "ops": {"snapshot_alias": {"config": {"alias": "default", "approver": "carol"}}}
            },
        )
        assert snap.success
        active = snap.output_for_node("snapshot_alias")["activeDigest"]
        rel = dg.materialize(
            [*snapshot_assets, shard_release],
            instance=instance,
            resources=resources,
            selection=[shard_release],
            run_config={"ops": {"shard_release": {"config": {"records_per_shard": 40}}}},
        )
        assert rel.success
        root = rel.output_for_node("shard_release")
    assert get_release(ws.db, root).snapshot_digest == active
    with ws.db.tx() as conn:
        held = rows(conn, "SELECT holder, state, purpose FROM leases ORDER BY created_at")
    holders = [
        (h["holder"].split(":")[0] + ":" + h["holder"].split(":")[1], h["state"]) for h in held
    ]
    assert ("snapshot-builder:dagster", "RELEASED") in holders
    assert ("release-writer:dagster", "RELEASED") in holders
    assert {h["purpose"] for h in held} == {"publisher"}


def test_other_spelling_of_a_key_rereferenced_after_the_plan_survives(ws, release):
    """Both spellings of one shard are candidates at plan time (their release is not
    retained); a version re-referencing the shard between plan and sweep must keep the
    other spelling too (the sweep compares canonical keys, not spellings)."""

    from support.lifecycle import forge_release, set_state

    set_state(ws, "release", release.digest, "INVALID")
    shard_id, (key, version) = next(iter(shard_keys(release).items()))
    data = ws.store.get(key, version)
    hexpart = key.rsplit("/", 1)[1].split(".")[0]
    spelled = key.replace("shards/sha256/", "shards//sha256/./").replace(hexpart, hexpart.upper())
    assert canonical_key(spelled) == key
    ws.store.create(spelled, data)
    copy = ws.store.put(spelled, data).version_id  # a version id the canonical key lacks
    assert copy != version
    plan = plan_gc(ws, grace_seconds=0)
    assert {(key, version), (spelled, copy)} <= candidate_set(plan)
    forge_release(ws, release, {shard_id}, tag="again")  # re-references the shard
    result = sweep(ws, actor="gc", grace_seconds=0, plan=plan)
    assert result.skipped["re-referenced"] >= 2
    assert {(key, version), (spelled, copy)} <= stored_set(ws, "shards/")


def test_a_candidate_already_gone_at_sweep_time_is_counted_not_failed(ws, release):
    key, _, version = _orphan(ws, "gone")
    plan = plan_gc(ws, grace_seconds=0)
    assert (key, version) in candidate_set(plan)
    ws.store.delete_version(key, version)  # someone else removed it meanwhile
    result = sweep(ws, actor="gc", grace_seconds=0, plan=plan)
    assert result.skipped["already-gone"] == 1
    assert not any(d["key"] == key for d in result.to_json()["deleted"])


def test_an_orphan_under_an_odd_spelling_is_still_collected(ws, release):
    """Liveness: a non-canonical spelling protects only what its canonical key needs."""
    data = b"orphan bytes stored under a non-canonical spelling"
    key = shard_key(sha256_digest(data), encrypted=False)
    hexpart = key.rsplit("/", 1)[1].split(".")[0]
    spelled = key.replace("shards/sha256/", "shards//sha256/./").replace(hexpart, hexpart.upper())
    version = ws.store.create(spelled, data).version_id
    plan = plan_gc(ws, grace_seconds=0)
    assert (spelled, version) in candidate_set(plan)
    result = sweep(ws, actor="gc", grace_seconds=0, plan=plan)
    assert any(d["key"] == spelled for d in result.to_json()["deleted"])
    assert (spelled, version) not in stored_set(ws, "shards/")
