"""Run, permit, checkpoint, explicit and lease holds; the CLI; lineage of a sample."""

import json

import pytest
from click.testing import CliRunner
from support.lifecycle import (
    candidate_set,
    forge_release,
    publish,
    release_of,
    set_state,
    shard_keys,
)
from support.runs import create_run
from support.snapshots import build_approved
from support.workspaces import make_workspace

from relgate.catalog.release_table import get_release
from relgate.catalog.snapshot_table import get_snapshot
from relgate.cli.main import main
from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.errors import ConflictError, UsageError
from relgate.holds.pins import acquire_lease, add_pin, release_lease, renew_lease
from relgate.holds.retention import RetentionPolicy, set_policy
from relgate.lifecycle.collector import plan_gc, verify_retained
from relgate.lifecycle.lineage import lineage
from relgate.runs.run_end import fail_run
from relgate.snapshot import activation as snap_lifecycle

PURPOSE = "demo-model-training"


def test_runs_and_permits_hold_their_root(ws, release):
    set_policy(ws.db, RetentionPolicy("train", keep_last=1, keep_days=0, rollback_window=0))
    publish(ws, release.digest, "train")
    run = create_run(ws, alias="train", purpose=PURPOSE, world_size=1, actor="sched")
    newer = forge_release(ws, release, {rm.wire_shards(release.document())[0]["id"]}, tag="newer")
    publish(ws, newer.digest, "train")
    held = plan_gc(ws, grace_seconds=0).retained[("release", release.digest)]
    assert any(r.startswith(f"run {run['runId']}") for r in held)
    assert any(r.startswith("permit ") for r in held)
    fail_run(ws.db, run["runId"], "test over")
    held = plan_gc(ws, grace_seconds=0).retained.get(("release", release.digest), [])
    assert held == []  # a failed run holds nothing, and its failure closed the permit


def test_reader_lease_holds_a_version_until_released(ws, release):
    set_state(ws, "release", release.digest, "INVALID")
    lease = acquire_lease(
        ws, holder="reader-7", purpose="reader", ttl_seconds=600, digest=release.digest
    )
    plan = plan_gc(ws, grace_seconds=0)
    assert any("reader lease" in r for r in plan.retained[("release", release.digest)])
    assert not set(shard_keys(release).values()) & candidate_set(plan)
    renew_lease(ws, lease.lease_id, ttl_seconds=600)
    release_lease(ws, lease.lease_id)
    with pytest.raises(ConflictError) as err:
        renew_lease(ws, lease.lease_id, ttl_seconds=600)
    assert err.value.check == "lease-live"
    assert set(shard_keys(release).values()) <= candidate_set(plan_gc(ws, grace_seconds=0))


def test_pin_validation(ws, release, snapshot):
    with pytest.raises(UsageError) as err:
        add_pin(
            ws, release.digest, owner="t", reason="r", kind="checkpoint", position={"root": "x"}
        )
    assert err.value.check == "checkpoint-position"
    with pytest.raises(UsageError):
        add_pin(ws, release.digest, owner="", reason="r")
    pin = add_pin(
        ws, snapshot.digest, owner="auditor", reason="audit 2027", expires_at="2030-01-01T00:00:00Z"
    )
    assert (pin.subject_kind, pin.expires_at) == ("snapshot", "2030-01-01T00:00:00.000000Z")


def _first_sample(ws, digest):
    row = get_snapshot(ws.db, digest)
    manifest = sm.load(ws.store, ws.trusted_keys, digest, row.envelope_version)
    return ws.membership.read(manifest.members_ref)["sampleId"][0]


def _cli(home, *args):
    result = CliRunner().invoke(main, ["--home", str(home), *args, "--json"])
    return result.exit_code, json.loads(result.stdout.strip().splitlines()[-1])


def test_cli_pin_gc_lineage(tmp_path):
    ws = make_workspace(tmp_path / "home")
    snap = build_approved(ws)
    release = release_of(ws, snap.digest)
    home = ws.home

    code, pin = _cli(home, "pin", "add", release.digest[7:19], "--owner", "bob", "--reason", "eval")
    assert code == 0 and pin["digest"] == release.digest
    code, listed = _cli(home, "pin", "list")
    assert code == 0 and [p["pinId"] for p in listed["pins"]] == [pin["pinId"]]

    code, plan = _cli(home, "gc", "plan", "--grace", "0s")
    assert code == 0 and plan["mode"] == "plan"
    code, refused = _cli(home, "gc", "sweep", "--grace", "0s")
    assert code == 2 and refused["check"] == "sweep-confirmed"
    code, swept = _cli(home, "gc", "sweep", "--grace", "0s", "--yes")
    assert code == 0 and swept["mode"] == "sweep"
    verify_retained(ws)
    code, _ = _cli(home, "gc", "log")
    assert code == 0

    code, removed = _cli(home, "pin", "remove", pin["pinId"])
    assert code == 0 and removed["state"] == "RELEASED"
    code, again = _cli(home, "pin", "remove", pin["pinId"])
    assert code == 4 and again["check"] == "pin-state"

    sample = _first_sample(ws, snap.digest)
    code, lin = _cli(home, "lineage", sample)
    assert code == 0
    assert {v["digest"] for v in lin["versions"]} == {snap.digest, release.digest}

    # A retained manifest deleted for real: plan fails closed, exit 3, naming it.
    row = get_release(ws.db, release.digest)
    ws.store.delete_version(rm.envelope_key(release.digest), row.envelope_version)
    code, err = _cli(home, "gc", "plan", "--grace", "0s")
    assert code == 3
    assert (err["check"], err["digest"]) == ("retained-manifest", release.digest)
    assert err["object"] == f"{rm.envelope_key(release.digest)}@{row.envelope_version}"
    ws.close()


def test_tombstone_propagation_lists_every_holder(ws, release, snapshot):
    sample = _first_sample(ws, snapshot.digest)
    pin = add_pin(ws, release.digest, owner="trainer", reason="checkpoint")
    snap_lifecycle.add_tombstones(ws, [sample], reason="gdpr erasure", actor="dpo")
    out = lineage(ws, sample).to_json()
    assert out["tombstoned"] is True
    found = {v["digest"]: v for v in out["versions"]}
    assert set(found) == {snapshot.digest, release.digest}
    assert all(v["reactivation"] == "refused" for v in found.values())
    assert all(v["proof"]["verified"] and v["proof"]["kind"] == "inclusion" for v in found.values())
    assert [p["pinId"] for p in out["pins"]] == [pin.pin_id]
    assert release.digest in out["heldVersions"]
    # A sample that is in no version is in no version.
    assert lineage(ws, "no-such-sample").versions == []
