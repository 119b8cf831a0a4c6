"""Deletion propagation you can watch (issue 28, item 6): a version a tombstone hit is no
longer held for rollback, only by runs, pins and leases; `fence show TOMBSTONE
--propagation` names every stored object still holding the erased sample, its holders
and when it becomes deletable, and reports the bytes gone after the holders end and a
sweep runs."""

import json

import pytest
from click.testing import CliRunner
from support.lifecycle import forge_release, publish, release_of
from support.runs import create_run
from support.snapshots import build_approved
from support.workspaces import make_workspace

from relgate.catalog.db import one
from relgate.catalog.snapshot_table import get_snapshot
from relgate.cli.main import main
from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.errors import NotFoundError
from relgate.gate.transitions import open_gate
from relgate.holds.pins import add_pin, remove_pin
from relgate.holds.retention import parse_time
from relgate.lifecycle.collector import plan_gc, sweep
from relgate.lifecycle.propagation import Holder, _deletable_at, propagation
from relgate.snapshot import activation as snap_lifecycle

PURPOSE = "demo-model-training"
EXPIRY = "2999-01-01T00:00:00.000000Z"


def _cli(home, *args):
    result = CliRunner().invoke(main, ["--home", str(home), *args, "--json"])
    return result.exit_code, json.loads(result.stdout.strip().splitlines()[-1])


@pytest.fixture
def erased(tmp_path):
    """v1 then v2 published on `train` (v1 in the rollback window), a run on v2, a pin on
    v1, then one of their samples tombstoned."""
    ws = make_workspace(tmp_path / "home")
    snapshot = build_approved(ws)
    v1 = release_of(ws, snapshot.digest)
    publish(ws, v1.digest, "train")
    v2 = forge_release(ws, v1, {d["id"] for d in rm.wire_shards(v1.document())[1:]}, tag="v2")
    publish(ws, v2.digest, "train")
    run = create_run(ws, alias="train", purpose=PURPOSE, world_size=1, actor="sched")
    pin = add_pin(ws, v1.digest, owner="auditor", reason="hold", expires_at=EXPIRY)
    keep = add_pin(ws, v2.digest, owner="legal", reason="hold")  # no expiry
    row = get_snapshot(ws.db, snapshot.digest)
    manifest = sm.load(ws.store, ws.trusted_keys, snapshot.digest, row.envelope_version)
    sample = ws.membership.read(manifest.members_ref)["sampleId"][0]
    snap_lifecycle.add_tombstones(ws, [sample], reason="gdpr erasure", actor="dpo")
    yield ws, (v1, v2), run, (pin, keep), sample
    ws.close()


def test_a_tombstoned_version_is_held_only_by_runs_pins_and_leases(erased):
    ws, (v1, v2), run, (pin, keep), _ = erased
    # The fence advance revoked the run on v2; v2 is still the alias's active digest and
    # v1 in its rollback window, yet only the pins hold them.
    with ws.db.tx() as conn:
        state = one(conn, "SELECT state FROM runs WHERE run_id = :r", {"r": run["runId"]})
    assert state["state"] == "REVOKED"
    assert open_gate(ws).alias("train", "release").active_digest == v2.digest
    plan = plan_gc(ws, grace_seconds=0)
    held = plan.retained
    assert {v.subject for v in plan.report().erasure_held} >= {v1.digest, v2.digest}
    assert held[("release", v1.digest)] == [f"explicit pin {pin.pin_id} (auditor)"]
    assert held[("release", v2.digest)] == [f"explicit pin {keep.pin_id} (legal)"]
    remove_pin(ws, keep.pin_id, actor="legal")
    assert ("release", v2.digest) not in plan_gc(ws, grace_seconds=0).retained


def test_propagation_names_holders_then_reports_the_bytes_gone(erased):
    ws, (v1, v2), run, (pin, keep), sample = erased
    before = propagation(ws, sample, grace_seconds=0)
    assert before.tombstones == [1] and not before.gone
    assert before.held and all(o.inspected and o.role == "shard" for o in before.held)
    shard = before.held[0]
    names = {h.name: h.until for h in shard.held_by}
    assert names[f"explicit pin {pin.pin_id} (auditor)"] == EXPIRY
    if v2.digest in shard.releases:  # the sample's shard is in both versions
        assert names[f"explicit pin {keep.pin_id} (legal)"] is None
        assert shard.deletable_at is None  # a pin without expiry ends only when removed
    else:
        assert shard.deletable_at == EXPIRY
    assert set(before.audit_trail) >= {v1.digest, v2.digest}

    assert run["runId"]  # revoked by the fence advance: holds nothing
    remove_pin(ws, pin.pin_id, actor="auditor")
    remove_pin(ws, keep.pin_id, actor="legal")
    waiting = propagation(ws, "1", grace_seconds=0)  # by tombstone sequence number
    assert all(not o.held_by and o.deletable_at for o in waiting.held)
    sweep(ws, actor="gc", grace_seconds=0)
    code, after = _cli(ws.home, "fence", "show", "1", "--propagation", "--grace", "0s")
    assert code == 0 and after["gone"] is True and after["held"] == []
    assert {(e["key"], e["versionId"]) for e in after["erased"]} >= {
        (o.key, o.version_id) for o in before.held
    }


def test_an_unknown_tombstone_is_refused(erased):
    ws = erased[0]
    with pytest.raises(NotFoundError) as err:
        propagation(ws, "99", grace_seconds=0)
    assert err.value.check == "tombstone"
    code, out = _cli(ws.home, "fence", "show", "no-such-sample", "--propagation")
    assert code == 3 and out["check"] == "tombstone"
    code, out = _cli(ws.home, "fence", "show", "--propagation")
    assert code == 2 and out["check"] == "tombstone"


def test_a_damaged_shard_is_listed_not_assumed_gone(erased):
    """A stored shard that no longer matches its descriptor (truncated on disk) cannot be
    read to confirm: it is listed as holding the sample, uninspected."""
    ws, _, _, _, sample = erased
    shard = propagation(ws, sample, grace_seconds=0).held[0]
    path = ws.store.local_path(shard.key, shard.version_id)
    path.write_bytes(path.read_bytes()[: shard.size // 2])
    damaged = {(o.key, o.version_id): o for o in propagation(ws, sample, grace_seconds=0).held}
    assert damaged[(shard.key, shard.version_id)].inspected is False


def test_when_an_object_becomes_deletable():
    seen, now = "2026-01-01T00:00:00.000000Z", parse_time("2026-06-01T00:00:00.000000Z")
    later = "2026-03-01T00:00:00.000000Z"
    assert _deletable_at([], seen, now, 3600) == "2026-01-01T01:00:00.000000Z"
    assert _deletable_at([Holder(name="pin", until=later)], seen, now, 3600) == later
    assert (
        _deletable_at([Holder(name="a", until=later), Holder(name="b", until=None)], seen, now, 0)
        is None
    )
    assert _deletable_at([], None, now, 60) == "2026-06-01T00:01:00.000000Z"  # never seen yet
