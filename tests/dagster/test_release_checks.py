"""The blocking release checks watch the counts the verifier really emits.

Materialized through the Dagster assets on a temp instance: the snapshot chain and the
shard release in one run, then (after the stored shard bytes were tampered with, or not)
the verification, its checks and the alias in a second run.  An INVALID release fails
exactly the checks of the counts the verifier reported and never reaches the alias; a
VERIFIED one passes every check and is published.
"""

import dagster as dg
import pytest
from relgate_trust.digests import sha256_digest
from support.instances import dagster_instance
from support.releases import overwrite_in_place, shard_path
from support.workspaces import make_workspace

from assets.releases import OUTCOME_CHECK, release_assets, release_checks
from assets.snapshots import snapshot_assets, snapshot_checks
from relgate.catalog.release_table import get_release
from relgate.documents import release_root as rm
from relgate.gate.transitions import open_gate
from relgate.release.verify.checks import ZERO_CHECKS, Check
from resources.relgate import RelgateResource

ALL_CHECKS = {c.asset_check_name for c in ZERO_CHECKS} | {OUTCOME_CHECK}


@pytest.fixture
def home(tmp_path):
    ws = make_workspace(tmp_path / "home")
    ws.close()
    return str(tmp_path / "home")


def _write(home, instance, per_shard=40):
    """Snapshot -> alias -> shard release (40 records per shard); returns the root digest."""
    result = dg.materialize(
        [*snapshot_assets, *snapshot_checks, *release_assets],
        instance=instance,
        resources={"relgate": RelgateResource(home=home)},
        run_config={
            "ops": {
                "snapshot_alias": {"config": {"alias": "default", "approver": "carol"}},
                "shard_release": {"config": {"records_per_shard": per_shard}},
            }
        },
        selection=dg.AssetSelection.assets(*(a.key for a in snapshot_assets), "shard_release"),
    )
    assert result.success
    return result.output_for_node("shard_release")


def _verify_and_publish(home, instance, expect_generation=None):
    """The verification, its blocking checks and the alias behind them."""
    publish = {"alias": "train", "approver": "dana", "expect_generation": expect_generation}
    return dg.materialize(
        [*snapshot_assets, *release_assets, *release_checks],
        instance=instance,
        resources={"relgate": RelgateResource(home=home)},
        run_config={"ops": {"release_alias": {"config": publish}}},
        selection=dg.AssetSelection.assets("release_verification", "release_alias"),
        raise_on_error=False,
    )


def _evaluations(result, asset="release_verification", partition=None):
    """The run's check evaluations on ``asset`` (and ``partition``), by check name."""
    return {
        e.check_name: e
        for e in result.get_asset_check_evaluations()
        if e.asset_key == dg.AssetKey(asset) and e.partition == partition
    }


def _flip_one_byte(path):
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF
    overwrite_in_place(path, bytes(data))


def _truncate(path):
    overwrite_in_place(path, path.read_bytes()[:-7])


def test_a_verified_release_passes_every_check_and_is_published(home):
    with dagster_instance() as instance:
        root = _write(home, instance)
        result = _verify_and_publish(home, instance)
        assert result.success
        evaluations = _evaluations(result)
        assert set(evaluations) == ALL_CHECKS
        assert all(e.passed for e in evaluations.values())
        assert evaluations[Check.MISSING_MEMBERS.asset_check_name].metadata["count"].value == 0
        report = result.output_for_node("release_verification")
        assert report["outcome"] == "VERIFIED" and report["root"] == root
        assert result.output_for_node("release_alias")["activeDigest"] == root
        mat = instance.get_latest_materialization_event(dg.AssetKey("release_verification"))
        meta = mat.asset_materialization.metadata
        assert meta["provenanceDigest"].value == report["provenanceDigest"]
        assert meta["provenanceMaterials"].value == 1  # the snapshot manifest
        # The checks execute on their own, against the stored report (no re-verification)
        alone = dg.materialize(
            [*snapshot_assets, *release_assets, *release_checks],
            instance=instance,
            resources={"relgate": RelgateResource(home=home)},
            selection=dg.AssetSelection.checks(*release_checks),
        )
        # nothing re-materialized but the root's record on its release_version partition
        assert alone.success
        assert [
            (e.asset_key.path[-1], e.partition) for e in alone.get_asset_materialization_events()
        ] == [("release_version", root)]
        rerun = _evaluations(alone)
        assert set(rerun) == ALL_CHECKS and all(e.passed for e in rerun.values())
        assert {e.metadata["reportDigest"].value for e in rerun.values()} == {
            report["reportDigest"]
        }
    ws = RelgateResource(home=home).workspace()
    assert get_release(ws.db, root).state == "PUBLISHED"


@pytest.mark.parametrize(
    ("tamper", "expected"),
    [
        (
            _flip_one_byte,
            {
                Check.STORAGE_DIGEST_MISMATCH,
                Check.MISSING_MEMBERS,
                Check.TUPLE_ROOT_MISMATCH,
                Check.TOTALS_MISMATCH,
            },
        ),
        (
            _truncate,
            {
                Check.SIZE_MISMATCH,
                Check.STORAGE_DIGEST_MISMATCH,
                Check.MISSING_MEMBERS,
                Check.TUPLE_ROOT_MISMATCH,
                Check.TOTALS_MISMATCH,
            },
        ),
    ],
    ids=["flipped-byte", "truncated"],
)
def test_an_invalid_release_fails_its_checks_and_blocks_the_alias(home, tamper, expected):
    with dagster_instance() as instance:
        root = _write(home, instance)
        ws = RelgateResource(home=home).workspace()
        row = get_release(ws.db, root)
        manifest = rm.load(ws.store, ws.trusted_keys, root, row.envelope_version)
        tampered = shard_path(ws, rm.wire_shards(manifest.document())[1])
        tamper(tampered)
        bad = manifest.descriptors[1]

        result = _verify_and_publish(home, instance)
        assert not result.success
        report = result.output_for_node("release_verification")
        assert report["outcome"] == "INVALID"
        failing_counts = {k for k, v in report["counts"].items() if v}
        assert failing_counts == {c.value for c in expected}

        evaluations = _evaluations(result)
        assert set(evaluations) == ALL_CHECKS
        failed = {name for name, e in evaluations.items() if not e.passed}
        assert failed == {c.asset_check_name for c in expected} | {OUTCOME_CHECK}
        for check in expected:
            evaluation = evaluations[check.asset_check_name]
            assert evaluation.metadata["count"].value == report["counts"][check.value] > 0
            assert evaluation.severity == dg.AssetCheckSeverity.ERROR
        assert evaluations[OUTCOME_CHECK].metadata["outcome"].value == "INVALID"
        # Each check explains itself: the shard, where its bytes are, the digest the signed
        # root expected and the one the verifier found, and the signed report it read.
        digest = evaluations[Check.STORAGE_DIGEST_MISMATCH.asset_check_name]
        meta = {k: v.value for k, v in digest.metadata.items()}
        assert (meta["shard"], meta["objectKey"]) == (bad.id, bad.object_key)
        assert meta["expected"] == bad.storage_digest
        assert meta["actual"] == sha256_digest(tampered.read_bytes()) != bad.storage_digest
        assert meta["reportDigest"] == report["reportDigest"] and meta["root"] == root
        (row,) = [r.data for r in meta["failingShards"].records]
        assert (row["shard"], row["objectKey"], row["expected"]) == (
            bad.id,
            bad.object_key,
            bad.storage_digest,
        )
        assert f"shard {bad.id} ({bad.object_key})" in str(digest.description)
        assert report["reportDigest"] in str(evaluations[OUTCOME_CHECK].description)
        members = evaluations[Check.MISSING_MEMBERS.asset_check_name]  # not a per-shard check
        assert "shard" not in members.metadata and "missingMembers" in str(members.description)
        # The blocking checks stop the run before the alias: nothing was published.
        assert "release_alias" not in {
            e.asset_key.path[-1] for e in result.get_asset_materialization_events()
        }
    assert get_release(ws.db, root).state == "INVALID"
    assert open_gate(ws).alias("train").generation == 0


def test_rematerializing_the_release_chain_reports_the_published_root(home):
    """Twice on unchanged input: the second run succeeds and reports the same root at the
    same generation (it used to fail: PUBLISHED -> APPROVED is not a forward transition);
    a different root in the same publication (from generation 0) is refused."""
    with dagster_instance() as instance:
        root = _write(home, instance)
        assert _verify_and_publish(home, instance, expect_generation=0).success
        assert _write(home, instance) == root
        again = _verify_and_publish(home, instance, expect_generation=0)
        assert again.success
        alias = again.output_for_node("release_alias")
        assert (alias["generation"], alias["activeDigest"], alias["idempotentRetry"]) == (
            1,
            root,
            True,
        )
        mat = instance.get_latest_materialization_event(dg.AssetKey("release_alias"))
        assert mat.run_id == again.run_id
        assert mat.asset_materialization.metadata["existing"].value is True
        assert mat.asset_materialization.metadata["approver"].value == "dana"

        other = _write(home, instance, per_shard=30)
        assert other != root
        refused = _verify_and_publish(home, instance, expect_generation=0)
        assert not refused.success
        (failure,) = [e for e in refused.all_events if e.is_step_failure]
        assert failure.step_key == "release_alias"
        # a refusal is a dg.Failure that names its check, object and digest (no stack trace
        # of relgate's); the refusal itself stays the cause
        data = failure.step_failure_data
        assert data.user_failure_data is not None
        assert data.user_failure_data.description.startswith("alias-generation: ")
        shown = {k: v.value for k, v in data.user_failure_data.metadata.items()}
        assert (shown["check"], shown["object"], shown["digest"]) == (
            "alias-generation",
            "train",
            other,
        )
        assert data.error.cause.cls_name == "ConflictError"
    ws = RelgateResource(home=home).workspace()
    alias_state = open_gate(ws).alias("train", "release")
    assert (alias_state.generation, alias_state.active_digest) == (1, root)
