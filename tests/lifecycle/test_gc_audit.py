"""The audit trail outlives the bytes (issue 28, item 5): a collected version keeps its
signed manifest, membership table, reports and approvals; lineage, prove and check-proof
keep working for it; the audit retention policy decides for how long."""

import shutil

import pytest
from support.lifecycle import release_of, set_state, shard_keys
from support.snapshots import build_approved
from support.workspaces import make_workspace

from relgate.catalog.db import rows
from relgate.catalog.release_table import get_release
from relgate.catalog.snapshot_table import get_snapshot
from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.errors import NotFoundError
from relgate.lifecycle.audit_trail import AuditPolicy, set_audit_policy
from relgate.lifecycle.collector import plan_gc, sweep
from relgate.lifecycle.lineage import lineage
from relgate.objects.layout import cas_key
from relgate.release import proofs


@pytest.fixture
def collected(tmp_path):
    """A snapshot and its release, both no longer retained, swept (grace 0)."""
    ws = make_workspace(tmp_path / "home")
    snapshot = build_approved(ws)
    release = release_of(ws, snapshot.digest)
    set_state(ws, "release", release.digest, "INVALID")
    set_state(ws, "snapshot", snapshot.digest, "REJECTED")
    result = sweep(ws, actor="gc", grace_seconds=0)
    yield ws, snapshot, release, result
    ws.close()


def _trail(ws, snapshot, release):
    snap_row, rel_row = get_snapshot(ws.db, snapshot.digest), get_release(ws.db, release.digest)
    return {
        (sm.envelope_key(snapshot.digest), snap_row.envelope_version),
        (rm.envelope_key(release.digest), rel_row.envelope_version),
        (cas_key(snap_row.members_digest), snap_row.members_version),
    }


def test_a_collected_version_keeps_its_audit_trail(collected):
    ws, snapshot, release, result = collected
    deleted = {(d.key, d.version_id) for d in result.deleted}
    assert set(shard_keys(release).values()) <= deleted  # the bytes are gone
    for key, version in shard_keys(release).values():
        with pytest.raises(NotFoundError):
            ws.store.head(key, version)
    trail = _trail(ws, snapshot, release)
    assert not trail & deleted
    for key, version in trail:
        assert ws.store.head(key, version).version_id == version
    with ws.db.tx() as conn:
        marked = {r["digest"] for r in rows(conn, "SELECT digest FROM gc_collected")}
    assert release.digest in marked

    # Lineage and proofs against the collected versions, read from the stored trail.
    shutil.rmtree(ws.home / "cache", ignore_errors=True)
    manifest = sm.load(
        ws.store,
        ws.trusted_keys,
        snapshot.digest,
        get_snapshot(ws.db, snapshot.digest).envelope_version,
    )
    sample = ws.membership.read(manifest.members_ref)["sampleId"][0]
    found = {v.subject: v for v in lineage(ws, sample).versions}
    assert set(found) == {snapshot.digest, release.digest}
    assert all(v.proof.verified and not v.held_by for v in found.values())
    bundle = proofs.bundle(ws, sample, snapshot=None, release=release.digest)
    checked = bundle.check(ws.trusted_keys)
    assert checked["subject"] == release.digest

    # The plan says what it keeps for audit, and why.
    report = plan_gc(ws, grace_seconds=0).report()
    kept = {k.subject: k for k in report.audit_kept}
    assert {snapshot.digest, release.digest} <= set(kept)
    assert report.audit_policy.keep_days is None and report.audit_objects >= len(trail)
    assert any(o.startswith("members ") for o in kept[release.digest].objects)
    assert not {(c.key, c.version_id) for c in report.candidates} & trail


def test_the_audit_policy_ends_the_trail(collected):
    ws, snapshot, release, _ = collected
    trail = _trail(ws, snapshot, release)
    set_audit_policy(ws.db, AuditPolicy(keep_days=0))  # created before now: expired
    plan = plan_gc(ws, grace_seconds=0)
    assert trail <= {(c.key, c.version_id) for c in plan.candidates}
    assert plan.report().audit_kept == []
    # Kept again between plan and sweep: the sweep re-reads the policy inside the gate.
    set_audit_policy(ws.db, AuditPolicy())
    swept = sweep(ws, actor="gc", grace_seconds=0, plan=plan)
    assert swept.skipped == {"audit-trail": plan.candidate_count} and not swept.deleted
    set_audit_policy(ws.db, AuditPolicy(keep_days=0))
    gone = {(d.key, d.version_id) for d in sweep(ws, actor="gc", grace_seconds=0).deleted}
    assert trail <= gone
    set_audit_policy(ws.db, AuditPolicy(keep_days=3650))
    assert plan_gc(ws, grace_seconds=0).report().audit_objects == 0  # nothing left to keep
