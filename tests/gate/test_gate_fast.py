"""The gate and permits in-process on a copied template (fast; the mutation-testing suite).

Every refusal is asserted by its check name; every fence advance by the exact hits it
recorded, the permits it closed and the runs it revoked.
"""

import base64
import json

import pytest
from support.releases import overwrite_in_place
from support.runs import create_run

from relgate.catalog.db import execute, one, rows
from relgate.catalog.permit_table import close_permit, get_permit, list_permits
from relgate.catalog.release_table import get_release, insert_release
from relgate.catalog.snapshot_table import get_snapshot, insert_snapshot
from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.errors import (
    ConflictError,
    IntegrityError,
    NotFoundError,
    RejectedError,
    RelgateError,
    UsageError,
)
from relgate.gate.transitions import open_gate
from relgate.holds.pins import add_pin
from relgate.holds.retention import RetentionPolicy, set_policy
from relgate.objects.cas import ContentRef
from relgate.release.publication import approve_release, publish, rollback_release
from relgate.runs.store import get_run

from .conftest import PURPOSE


def _members(g):
    row = get_snapshot(g.ws.db, g.snapshot)

    return g.ws.membership.read(ContentRef(row.members_digest, row.members_version, 0))


def _admit(g, **kw):
    kw.setdefault("purpose", PURPOSE)
    return create_run(g.ws, world_size=1, actor="sched", **kw)


def _hit_rows(g, digest):
    return [(h.fence_kind, h.fence_seq) for h in open_gate(g.ws).hits_for(digest)]


# -- activation ------------------------------------------------------------------------------


def test_activation_is_a_cas_with_an_idempotent_retry(g):
    gate = open_gate(g.ws)
    with pytest.raises(ConflictError) as stale:
        gate.activate("snapshot", "prod", g.snapshot, expected_generation=1, actor="a")
    assert stale.value.check == "alias-generation"
    out = gate.activate("snapshot", "prod", g.snapshot, expected_generation=0, actor="a")
    assert (out.generation, out.active_digest, out.idempotent_retry) == (
        1,
        g.snapshot,
        False,
    )
    assert (out.tombstone_watermark, out.benchmark_fence) == (0, 0)
    again = gate.activate("snapshot", "prod", g.snapshot, expected_generation=0, actor="a")
    assert again.idempotent_retry and again.generation == 1
    assert get_snapshot(g.ws.db, g.snapshot).state == "ACTIVE"
    history = gate.alias_history("prod")
    assert [(h.generation, h.subject, h.action) for h in history] == [(1, g.snapshot, "activate")]
    state = gate.alias("prod")
    assert (state.generation, state.active_digest) == (1, g.snapshot)
    assert state.to_json()["activeDigest"] == g.snapshot
    with pytest.raises(RejectedError) as again_active:  # ACTIVE is not APPROVED
        gate.activate("snapshot", "prod2", g.snapshot, expected_generation=0, actor="a")
    assert again_active.value.check == "state"
    with pytest.raises(UsageError) as kind:  # a release alias is not a snapshot alias
        gate.activate("snapshot", "train", g.snapshot, expected_generation=None, actor="a")
    assert kind.value.check == "alias-kind"
    with pytest.raises(NotFoundError):
        gate.activate("snapshot", "prod", "sha256:" + "1" * 64, expected_generation=1, actor="a")


@pytest.mark.parametrize("fence", ["tombstone", "benchmark"])
def test_activation_refused_after_either_fence_moved(g, fence):
    gate = open_gate(g.ws)
    if fence == "tombstone":
        advance = gate.add_tombstones(["not-a-member"], reason="r", actor="dpo")
    else:
        advance = gate.add_benchmark_items(["sha256:" + "e" * 64], benchmark="b", actor="ev")
    assert advance.hits == {} and advance.watermark == 1 and advance.first_seq == 1
    with pytest.raises(ConflictError) as err:
        gate.activate("snapshot", "prod", g.snapshot, expected_generation=0, actor="a")
    assert err.value.check == "fence-watermarks"
    with pytest.raises(ConflictError) as rel:
        publish(g.ws, g.r3, alias="train", actor="a")
    assert rel.value.check == "fence-watermarks"
    assert gate.alias("prod").generation == 0 and gate.alias("train", "release").generation == 2


def test_publish_moves_the_release_alias(g):
    out = publish(g.ws, g.r3, alias="train", actor="a", expected_generation=2)
    assert (out.generation, out.active_digest) == (3, g.r3)
    assert get_release(g.ws.db, g.r3).state == "PUBLISHED"
    assert publish(g.ws, g.r3, alias="train", actor="a", expected_generation=2).idempotent_retry
    with pytest.raises(ConflictError):
        publish(g.ws, g.r1, alias="train", actor="a", expected_generation=2)


# -- fence advances --------------------------------------------------------------------------


def test_tombstones_hit_every_held_root_close_permits_and_revoke_runs(g):
    members = _members(g)
    ids = members["sampleId"].to_list()
    run = _admit(g, root=g.r1)  # R1 is superseded: only the run and its permit hold it
    bystander = _admit(g, alias="train")
    gate = open_gate(g.ws)
    advance = gate.add_tombstones([ids[7], "not-a-member", ids[2]], reason="gdpr", actor="dpo")
    order = sorted([ids[7], "not-a-member", ids[2]])
    seqs = sorted(1 + order.index(x) for x in (ids[7], ids[2]))
    assert (advance.first_seq, advance.watermark) == (1, 3)
    assert advance.hits == {g.snapshot: seqs, g.r1: seqs, g.r2: seqs, g.r3: seqs}
    assert advance.to_json()["hits"] == {d: 2 for d in advance.hits}
    assert sorted(advance.to_json()["closedPermits"]) == sorted(
        [run["permit"], bystander["permit"]]
    )
    for digest in advance.hits:
        assert _hit_rows(g, digest) == [("tombstone", s) for s in seqs]
    for admitted in (run, bystander):
        permit = get_permit(g.ws.db, admitted["permit"])
        assert permit.state == "CLOSED" and f"tombstone fence entries {seqs}" in (
            permit.closed_reason or ""
        )
        revoked = get_run(g.ws.db, admitted["runId"])
        assert revoked.state == "REVOKED" and revoked.ended_by == "gate"
        assert admitted["rootDigest"] in revoked.end_reason
    assert gate.fences().tombstone_watermark == 3
    assert [t.seq for t in gate.tombstones(since=1)] == [2, 3]
    assert list_permits(g.ws.db, state="OPEN") == []
    assert len(list_permits(g.ws.db, root=g.r1)) == 1


@pytest.mark.parametrize("hold", ["pin", "checkpoint", "nothing"])
def test_benchmark_hits_only_held_roots_and_admission_still_refuses(g, hold):
    if hold == "pin":
        add_pin(g.ws, g.r1, owner="audit", reason="hold")
    elif hold == "checkpoint":
        position = {"root": g.r1, "seed": 1, "shards": [], "data_pass": 0}
        add_pin(g.ws, g.r1, owner="ckpt", reason="step 9", kind="checkpoint", position=position)
    content = _members(g)["logicalContentDigest"][3]
    gate = open_gate(g.ws)
    advance = gate.add_benchmark_items([content, "sha256:" + "0" * 64], benchmark="b", actor="e")
    held = hold != "nothing"
    expected = {g.snapshot: [2], g.r2: [2], g.r3: [2]} | ({g.r1: [2]} if held else {})
    order = sorted([content, "sha256:" + "0" * 64])
    assert order.index(content) + 1 == 2
    assert advance.hits == expected
    assert gate.fences().benchmark_fence == 2
    assert [b.seq for b in gate.benchmark_items()] == [1, 2]
    with pytest.raises(RejectedError) as refused:
        _admit(g, root=g.r1)
    assert refused.value.check == ("fence-hits" if held else "root-watermarks")
    if not held:
        assert refused.value.details["hits"] == {"benchmark": 1}
        assert refused.value.details["root"] == {"tombstoneWatermark": 0, "benchmarkFence": 0}
        assert refused.value.details["gate"] == {"tombstoneWatermark": 0, "benchmarkFence": 2}


def test_a_fence_that_hits_nothing_leaves_runs_alone(g):
    run = _admit(g, root=g.r1)
    gate = open_gate(g.ws)
    advance = gate.add_tombstones(["not-a-member"], reason="r", actor="dpo")
    assert advance.hits == {} and advance.closed_permits == []
    assert get_run(g.ws.db, run["runId"]).state == "ADMITTED"
    assert get_permit(g.ws.db, run["permit"]).state == "OPEN"
    again = _admit(g, root=g.r1)  # fences moved, nothing hit: admissible
    assert again["tombstoneWatermark"] == 1
    with pytest.raises(UsageError):
        gate.add_tombstones([], reason="r", actor="dpo")
    with pytest.raises(UsageError):
        gate.add_benchmark_items([], benchmark="b", actor="e")


# -- admission -------------------------------------------------------------------------------


def test_admission_checks(g):
    by_root = _admit(g, root=g.r1)
    permit = get_permit(g.ws.db, by_root["permit"])
    assert (permit.root_digest, permit.alias, permit.generation, permit.purpose) == (
        g.r1,
        "",
        -1,
        PURPOSE,
    )
    assert by_root["generation"] is None
    by_alias = _admit(g, alias="train", expected_generation=2)
    assert (by_alias["rootDigest"], by_alias["generation"]) == (g.r2, 2)
    assert get_permit(g.ws.db, by_alias["permit"]).alias == "train"
    checks = {
        "alias-generation": dict(alias="train", expected_generation=1),
        "alias-root": dict(alias="train", root=g.r1),
        "alias-active": dict(alias="nothing-here"),
        "purpose": dict(root=g.r1, purpose="ads"),
        "release-state": dict(root=g.r3),
        "exists": dict(root="sha256:" + "2" * 64),
        "expect-generation": dict(root=g.r1, expected_generation=2),
        "root": dict(),
    }
    for check, kw in checks.items():
        with pytest.raises(RelgateError) as err:
            _admit(g, **kw)
        assert err.value.check == check, (check, err.value)
    with pytest.raises(ConflictError) as stale:
        _admit(g, alias="train", expected_generation=1)
    assert stale.value.exit_code == 4
    with pytest.raises(RejectedError) as named:  # a refusal names what the caller gave
        _admit(g, alias="train", purpose="ads")
    assert (named.value.object, named.value.digest) == ("train", g.r2)
    with pytest.raises(RejectedError) as by_digest:
        _admit(g, root=g.r1, purpose="ads")
    assert by_digest.value.object == g.r1


def test_admission_compares_roots_states_and_purposes_exactly(g):
    """Equal is admitted and anything else refused, whichever side sorts first: a root named
    with its alias must be the alias's root (any other digest, below or above it, is
    alias-root), a state above or below PUBLISHED is release-state, a purpose above or
    below the admitted one is purpose."""
    same = _admit(g, alias="train", root=g.r2)  # the alias's own root: admitted
    assert same["rootDigest"] == g.r2
    for expected in (1, 3):  # the alias is at generation 2: behind and ahead are both stale
        with pytest.raises(ConflictError) as err:
            _admit(g, alias="train", expected_generation=expected)
        assert err.value.check == "alias-generation", expected
    for other in ("sha256:" + "0" * 64, "sha256:" + "f" * 64):
        with pytest.raises(ConflictError) as err:
            _admit(g, alias="train", root=other)
        assert (err.value.check, err.value.digest) == ("alias-root", other)
    for purpose in ("aaa-before", "zzz-after"):
        with pytest.raises(RejectedError) as err:
            _admit(g, root=g.r1, purpose=purpose)
        assert err.value.check == "purpose"
    for state in ("APPROVED", "VERIFIED"):  # below and above PUBLISHED
        with g.ws.db.tx() as conn:
            execute(
                conn, "UPDATE releases SET state = :s WHERE digest = :d", {"s": state, "d": g.r1}
            )
        with pytest.raises(RejectedError) as err:
            _admit(g, root=g.r1)
        assert err.value.check == "release-state", state


def test_close_permit_closes_once(g):
    run = _admit(g, root=g.r1)
    with g.ws.db.tx() as conn:
        assert close_permit(conn, run["permit"], "done") is True
        assert close_permit(conn, run["permit"], "again") is False
    permit = get_permit(g.ws.db, run["permit"])
    assert (permit.state, permit.closed_reason) == ("CLOSED", "done")
    assert permit.closed_at


# -- rollback --------------------------------------------------------------------------------


def test_rollback(g):
    gate = open_gate(g.ws)
    set_policy(g.ws.db, RetentionPolicy("train"))
    for target, check in ((g.r3, "rollback-target"), (g.r2, "rollback-target")):
        with pytest.raises(RejectedError) as err:
            rollback_release(g.ws, "train", target, actor="ops")
        assert err.value.check == check
    with pytest.raises(ConflictError):
        rollback_release(g.ws, "train", g.r1, actor="ops", expected_generation=1)
    out = rollback_release(g.ws, "train", g.r1, actor="ops", expected_generation=2)
    assert (out.generation, out.active_digest, out.idempotent_retry) == (3, g.r1, False)
    assert rollback_release(
        g.ws, "train", g.r1, actor="ops", expected_generation=2
    ).idempotent_retry
    with pytest.raises(ConflictError) as other:  # a retry is idempotent only with the same digest
        rollback_release(g.ws, "train", g.r2, actor="ops", expected_generation=2)
    assert other.value.check == "alias-generation"
    with pytest.raises(ConflictError):  # a rollback is not a publish to retry idempotently
        publish(g.ws, g.r1, alias="train", actor="a", expected_generation=2)
    assert gate.alias_history("train")[-1].action == "rollback"


def test_rollback_refused_by_fence_entries_since_the_old_watermarks(g):
    member = _members(g)["sampleId"][4]
    advance = open_gate(g.ws).add_tombstones([member], reason="gdpr", actor="dpo")
    assert g.r1 not in advance.hits  # nothing held R1: no hit was recorded
    with pytest.raises(RejectedError) as err:
        rollback_release(g.ws, "train", g.r1, actor="ops")
    assert err.value.check == "rollback-fences" and err.value.details == {"tombstone": 1}
    content = _members(g)["logicalContentDigest"][4]
    open_gate(g.ws).add_benchmark_items([content], benchmark="b", actor="e")
    with pytest.raises(RejectedError) as both:
        rollback_release(g.ws, "train", g.r1, actor="ops")
    assert both.value.details == {"tombstone": 1, "benchmark": 1}
    assert open_gate(g.ws).alias("train", "release").generation == 2


def test_rollback_refused_once_gc_purged_the_version(g):
    key = rm.envelope_key(g.r1)
    with g.ws.db.tx() as conn:
        execute(
            conn,
            "INSERT INTO gc_deletions (run_id, object_key, version_id, size, reason, at)"
            " VALUES ('gc-1', :k, 'v', 1, 'test', 'now')",
            {"k": key},
        )
    with pytest.raises(RejectedError) as err:
        rollback_release(g.ws, "train", g.r1, actor="ops")
    assert err.value.check == "rollback-purged"


# -- stored envelopes ------------------------------------------------------------------------


def _path(g, kind, digest):
    module, row = (
        (sm, get_snapshot(g.ws.db, digest))
        if kind == "snapshot"
        else (rm, get_release(g.ws.db, digest))
    )
    return g.ws.store.local_path(module.envelope_key(digest), row.envelope_version)


def _flip(path):
    envelope = json.loads(path.read_bytes())
    payload = bytearray(base64.b64decode(envelope["payload"]))
    payload[payload.index(b'"benchmarkFence":') + len(b'"benchmarkFence":')] = ord("5")
    envelope["payload"] = base64.b64encode(bytes(payload)).decode()
    overwrite_in_place(path, json.dumps(envelope).encode())


@pytest.mark.parametrize("how", ["flip", "swap"])
def test_tampered_envelopes_are_refused_everywhere(g, how):
    if how == "flip":
        for kind, digest in (("snapshot", g.snapshot), ("release", g.r1), ("release", g.r3)):
            _flip(_path(g, kind, digest))
    else:
        overwrite_in_place(_path(g, "release", g.r1), _path(g, "release", g.r2).read_bytes())
        overwrite_in_place(_path(g, "release", g.r3), _path(g, "release", g.r2).read_bytes())
    gate = open_gate(g.ws)
    attempts = [lambda: _admit(g, root=g.r1), lambda: publish(g.ws, g.r3, alias="t", actor="a")]
    if how == "flip":
        attempts.append(
            lambda: gate.activate("snapshot", "prod", g.snapshot, expected_generation=0, actor="a")
        )
    for attempt in attempts:
        with pytest.raises(IntegrityError) as err:
            attempt()
        assert err.value.exit_code == 3
        assert err.value.check != "envelope-binding"
        assert ".dsse.json@" in err.value.object
    assert gate.alias("t", "release").generation == 0 and gate.alias("prod").generation == 0
    with g.ws.db.tx() as conn:
        assert rows(conn, "SELECT run_id FROM runs") == []


@pytest.mark.parametrize(
    ("kind", "column", "value"),
    [
        ("snapshot", "purpose", "'other'"),
        ("snapshot", "member_count", "member_count + 1"),
        ("snapshot", "members_version", "'v0'"),
        ("snapshot", "members_digest", "'sha256:" + "3" * 64 + "'"),
        ("snapshot", "tombstone_watermark", "tombstone_watermark"),
        ("release", "snapshot_digest", "'sha256:" + "4" * 64 + "'"),
        ("release", "shard_count", "shard_count + 1"),
        ("release", "record_count", "record_count - 1"),
        ("release", "benchmark_fence", "benchmark_fence"),
    ],
)
def test_a_catalog_row_that_disagrees_with_its_envelope_is_refused(g, kind, column, value):
    table = "snapshots" if kind == "snapshot" else "releases"
    digest = g.snapshot if kind == "snapshot" else g.r3
    with g.ws.db.tx() as conn:
        execute(conn, f"UPDATE {table} SET {column} = {value} WHERE digest = :d", {"d": digest})
    gate = open_gate(g.ws)
    unchanged = column in ("tombstone_watermark", "benchmark_fence")
    if kind == "snapshot":
        out = lambda: gate.activate("snapshot", "p", digest, expected_generation=0, actor="a")  # noqa: E731
    else:
        out = lambda: publish(g.ws, digest, alias="t", actor="a")  # noqa: E731
    if unchanged:
        assert out().generation == 1
        return
    with pytest.raises(IntegrityError) as err:
        out()
    assert err.value.check == "envelope-binding" and err.value.details["fields"] == [column]


def test_a_signed_snapshot_payload_missing_a_field_is_refused_by_its_schema(g):
    """Validly signed by the trusted key, but ``members.count`` missing: the payload does not
    validate into the manifest model, so the gate refuses it (check ``schema``, exit 3),
    never an internal error, and the alias does not move."""
    import copy

    row = get_snapshot(g.ws.db, g.snapshot)
    base = sm.load(g.ws.store, g.ws.trusted_keys, g.snapshot, row.envelope_version)
    body = copy.deepcopy(base.body)
    del body["members"]["count"]
    body["parents"] = [g.snapshot]
    forged = sm.KIND.seal(body)  # the generic seal: no model validation on the forger's side
    envelope = sm.KIND.sign(forged, g.ws.signing_key)
    digest = str(forged["snapshotId"])
    version = g.ws.store.create(
        sm.envelope_key(digest), json.dumps(envelope, sort_keys=True).encode()
    ).version_id
    with g.ws.db.tx() as conn:
        # the catalog row repeats the base's fields under the forged digest
        insert_snapshot(conn, base.model_copy(update={"snapshot_id": digest}), version, actor="f")
        execute(conn, "UPDATE snapshots SET state = 'APPROVED' WHERE digest = :d", {"d": digest})
    with pytest.raises(RelgateError) as err:
        open_gate(g.ws).activate("snapshot", "p", digest, expected_generation=0, actor="a")
    assert (err.value.check, err.value.exit_code) == ("schema", 3)
    with g.ws.db.tx() as conn:
        assert one(conn, "SELECT COUNT(*) AS n FROM aliases WHERE name = 'p'")["n"] == 0


@pytest.mark.parametrize("fault", ["missing", "type"])
def test_a_signed_release_payload_missing_a_bound_field_is_refused_not_an_internal_error(g, fault):
    """Validly signed by the trusted key, but ``totals.records`` missing (or not an
    integer): the stored root does not validate into the root model, so the gate refuses
    it (check ``schema``, exit 3, as for a snapshot), never an internal error."""
    import copy

    row = get_release(g.ws.db, g.r3)
    body = copy.deepcopy(
        rm.load_document(g.ws.store, g.ws.trusted_keys, g.r3, row.envelope_version)
    )
    if fault == "missing":
        del body["totals"]["records"]
        body["writer"] = {**body["writer"], "forged": True}
    else:  # a signed integer field that is not an integer
        body["totals"]["shards"] = "many"
        body["writer"] = {**body["writer"], "forged": "type"}
    sealed = rm.seal_document(body)
    version = rm.store_envelope(g.ws.store, sealed, rm.sign(sealed, g.ws.signing_key))
    with g.ws.db.tx() as conn:
        sealed["totals"]["records"] = row.record_count
        sealed["totals"]["shards"] = row.shard_count
        insert_release(
            conn,
            sealed,
            members_digest=row.members_digest,
            members_version=row.members_version,
            envelope_version=version,
            actor="forger",
        )
        execute(
            conn,
            "UPDATE releases SET state = 'APPROVED' WHERE digest = :d",
            {"d": sealed["rootId"]},
        )
    with pytest.raises(IntegrityError) as err:
        publish(g.ws, sealed["rootId"], alias="t", actor="a")
    assert (err.value.check, err.value.digest) == ("schema", sealed["rootId"])
    assert err.value.exit_code == 3


# -- re-publication ---------------------------------------------------------------------------


def _approvals(g, digest):
    with g.ws.db.tx() as conn:
        return rows(conn, "SELECT approver FROM approvals WHERE digest = :d", {"d": digest})


def test_republishing_the_published_root_is_a_no_op_that_reports_it(g):
    """Approve and publish R2 (PUBLISHED, the alias's root) again: nothing moves, and the
    existing approval and generation are reported."""
    history = open_gate(g.ws).alias_history("train")
    again = approve_release(g.ws, g.r2, approver="bob")
    assert (again.existing, again.state, again.approver) == ("true", "PUBLISHED", "alice")
    assert again.digest == g.r2 and again.approval.startswith("sha256:")
    assert _approvals(g, g.r2) == [{"approver": "alice"}]
    out = publish(g.ws, g.r2, alias="train", actor="bob")
    assert (out.generation, out.active_digest, out.idempotent_retry) == (2, g.r2, True)
    pinned = publish(g.ws, g.r2, alias="train", actor="bob", expected_generation=2)
    assert (pinned.generation, pinned.idempotent_retry) == (2, True)
    assert open_gate(g.ws).alias_history("train") == history
    assert get_release(g.ws.db, g.r2).state == "PUBLISHED"


def test_republishing_with_another_digest_is_still_refused(g):
    """R1 was published before R2 took the alias: publishing it again is not a no-op (a
    rollback moves an alias back), and a re-run of the generation-1 publication with R3
    conflicts.  Each refusal names the object, the check and the digest."""
    with pytest.raises(RejectedError) as older:
        publish(g.ws, g.r1, alias="train", actor="bob")
    assert (older.value.object, older.value.check, older.value.digest) == ("release", "state", g.r1)
    assert older.value.exit_code == 3 and g.r2 in str(older.value)
    with pytest.raises(ConflictError) as stale:
        publish(g.ws, g.r3, alias="train", actor="bob", expected_generation=1)
    assert (stale.value.object, stale.value.check, stale.value.digest) == (
        "train",
        "alias-generation",
        g.r3,
    )
    alias = open_gate(g.ws).alias("train", "release")
    assert (alias.generation, alias.active_digest) == (2, g.r2)
