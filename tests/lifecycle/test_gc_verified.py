"""The collector recognises a retained manifest by the SHA-256 of the stored bytes its
catalog row recorded when they were verified (relgate.documents.verified_bytes), and
fails closed on anything else: bytes rewritten in place (local store), a new version
put and named by the row (S3), another valid signed manifest swapped in, the envelope
deleted, or the recorded hash edited.  A clean world plans exactly what a plan that
verifies every manifest in full plans."""

import json

import pytest
from click.testing import CliRunner
from relgate_trust.digests import sha256_digest
from support.lifecycle import candidate_set, forge_release, stored_set
from support.releases import overwrite_in_place
from support.snapshots import build_approved
from support.workspaces import make_workspace, s3_workspace

from relgate.catalog.db import execute
from relgate.catalog.release_table import get_release
from relgate.catalog.versions import read_version
from relgate.cli.main import main
from relgate.documents import release_root as rm
from relgate.documents.verified_bytes import CHECK, trust_digest
from relgate.errors import RejectedError
from relgate.lifecycle.collector import plan_gc, sweep, verify_retained
from relgate.objects.layout import envelope_key

from .test_gc import _seed_versions


def _set_columns(ws, digest, **columns):
    sets = ", ".join(f"{name} = :{name}" for name in columns)
    with ws.db.tx() as conn:
        execute(conn, f"UPDATE releases SET {sets} WHERE digest = :d", {**columns, "d": digest})


def _refused(ws, release, version):
    """Plan and sweep both refuse, naming the envelope, the check and the digest; the
    cause is the verified-bytes check; nothing is deleted."""
    before = stored_set(ws)
    for action in (
        lambda: plan_gc(ws, grace_seconds=0),
        lambda: sweep(ws, actor="gc", grace_seconds=0),
    ):
        with pytest.raises(RejectedError) as err:
            action()
        assert err.value.check == "retained-manifest"
        assert err.value.object == f"{rm.envelope_key(release.digest)}@{version}"
        assert err.value.digest == release.digest
        assert f"({CHECK})" in err.value.message
    assert stored_set(ws) == before


def _plan_tables(ws):
    plan = plan_gc(ws, grace_seconds=0)
    return plan.required_table, plan.candidate_table.drop_columns(["first_seen"]), plan.excluded


def test_admission_records_the_verified_bytes(ws, release, snapshot):
    for kind, digest in (("release", release.digest), ("snapshot", snapshot.digest)):
        with ws.db.tx() as conn:
            row = read_version(conn, kind, digest)
        stored = ws.store.get(envelope_key(kind, digest), row.envelope_version)
        assert row.verified is not None
        assert row.verified.sha256 == sha256_digest(stored)
        assert row.verified.trust == trust_digest(ws.trusted_keys)


def test_a_clean_world_plans_the_same_as_full_verification(ws, release):
    _seed_versions(ws, release)
    recognised = _plan_tables(ws)
    with ws.db.tx() as conn:  # every row unverified: each manifest verified in full
        execute(conn, "UPDATE releases SET verified_sha256 = NULL, verified_trust = NULL")
        execute(conn, "UPDATE snapshots SET verified_sha256 = NULL, verified_trust = NULL")
    verified = _plan_tables(ws)
    assert all(a.equals(b) for a, b in zip(recognised[:2], verified[:2], strict=True))
    assert recognised[2] == verified[2]
    row = get_release(ws.db, release.digest)
    assert row.verified is not None  # recorded again by the plan that verified it
    again = _plan_tables(ws)
    assert all(a.equals(b) for a, b in zip(again[:2], verified[:2], strict=True))
    verify_retained(ws)


def test_other_trusted_keys_verify_in_full_again(ws, release):
    _set_columns(ws, release.digest, verified_trust="sha256:" + "1" * 64)
    plan_gc(ws, grace_seconds=0)
    assert get_release(ws.db, release.digest).verified.trust == trust_digest(ws.trusted_keys)


@pytest.mark.parametrize("how", ["respaced", "payload-byte"])
def test_bytes_rewritten_in_place_are_refused(ws, release, how):
    row = get_release(ws.db, release.digest)
    key = rm.envelope_key(release.digest)
    envelope = json.loads(ws.store.get(key, row.envelope_version))
    if how == "respaced":  # same signed payload, other bytes: only the hash notices
        data = json.dumps(envelope, indent=1).encode()
    else:
        payload = envelope["payload"]
        envelope["payload"] = payload[:40] + ("A" if payload[40] != "A" else "B") + payload[41:]
        data = json.dumps(envelope, sort_keys=True).encode()
    overwrite_in_place(ws.store.local_path(key, row.envelope_version), data)
    _refused(ws, release, row.envelope_version)


def test_another_valid_signed_manifest_swapped_in_is_refused(ws, release):
    ids = [d["id"] for d in rm.wire_shards(release.document())]
    other = forge_release(ws, release, set(ids[:1]), tag="swap", insert=False)
    other_key = rm.envelope_key(other.digest)
    other_bytes = ws.store.get(other_key, ws.store.head(other_key).version_id)
    row = get_release(ws.db, release.digest)
    key = rm.envelope_key(release.digest)
    overwrite_in_place(ws.store.local_path(key, row.envelope_version), other_bytes)
    _refused(ws, release, row.envelope_version)


def test_a_deleted_manifest_is_refused(ws, release):
    row = get_release(ws.db, release.digest)
    ws.store.delete_version(rm.envelope_key(release.digest), row.envelope_version)
    with pytest.raises(RejectedError) as err:
        plan_gc(ws, grace_seconds=0)
    assert (err.value.check, err.value.digest) == ("retained-manifest", release.digest)


def test_an_edited_recorded_hash_is_refused(ws, release):
    row = get_release(ws.db, release.digest)
    _set_columns(ws, release.digest, verified_sha256="sha256:" + "0" * 64)
    _refused(ws, release, row.envelope_version)


def _cli(home, *args):
    result = CliRunner().invoke(main, ["--home", str(home), *args, "--json"])
    return result.exit_code, json.loads(result.stdout.strip().splitlines()[-1])


def test_cli_refuses_an_edited_record_with_exit_3(tmp_path):
    ws = make_workspace(tmp_path / "home")
    release = _release(ws)
    row = get_release(ws.db, release.digest)
    _set_columns(ws, release.digest, verified_sha256="sha256:" + "0" * 64)
    for args in (("gc", "plan"), ("gc", "sweep", "--yes")):
        code, err = _cli(ws.home, *args, "--grace", "0s")
        assert code == 3
        assert (err["check"], err["digest"]) == ("retained-manifest", release.digest)
        assert err["object"] == f"{rm.envelope_key(release.digest)}@{row.envelope_version}"
        assert CHECK in err["message"]
    ws.close()


def _release(ws):
    from support.lifecycle import release_of

    return release_of(ws, build_approved(ws).digest)


@pytest.mark.s3
def test_s3_a_tampered_version_put_and_named_is_refused(tmp_path, moto_s3_endpoint):
    ws = s3_workspace(tmp_path / "home", f"sqlite:///{tmp_path / 'c.db'}", moto_s3_endpoint)
    try:
        release = _release(ws)
        key = rm.envelope_key(release.digest)
        row = get_release(ws.db, release.digest)
        assert (key, row.envelope_version) not in candidate_set(plan_gc(ws, grace_seconds=0))
        envelope = json.loads(ws.store.get(key, row.envelope_version))
        put = ws.store.put(key, json.dumps(envelope, indent=2).encode())  # a real S3 put
        _set_columns(ws, release.digest, envelope_version=put.version_id)
        _refused(ws, release, put.version_id)
    finally:
        ws.close()


def test_a_catalog_at_version_1_migrates_and_its_versions_are_verified_then_recorded(tmp_path):
    """A catalog from before migration 2 (its rows made by 0.1.0: no record columns) is
    migrated by ``relgate migrate``; the next plan verifies its manifests in full,
    records them, and plans the same as with the records."""
    import sqlalchemy as sa

    from relgate.catalog import schema

    ws = make_workspace(tmp_path / "home")
    release = _release(ws)
    url = ws.db.engine.url
    ws.close()
    engine = sa.create_engine(url)
    with engine.begin() as conn:  # back to version 1, as a 0.1.0 catalog is
        for table in ("snapshots", "releases"):
            for column in ("verified_sha256", "verified_trust"):
                conn.execute(sa.text(f"ALTER TABLE {table} DROP COLUMN {column}"))
        conn.execute(
            sa.text("UPDATE alembic_version SET version_num = :v"), {"v": schema.revision_id(1)}
        )
    engine.dispose()
    code, doc = _cli(tmp_path / "home", "migrate")
    assert code == 0 and doc["applied"] == [2]
    ws = make_workspace(tmp_path / "home", seed=False)
    try:
        assert read_version_verified(ws, release.digest) is None  # nothing recorded yet
        first = _plan_tables(ws)
        recorded = read_version_verified(ws, release.digest)
        assert recorded is not None and recorded.sha256.startswith("sha256:")
        second = _plan_tables(ws)
        assert first[0].equals(second[0]) and first[1].equals(second[1])
        assert first[2] == second[2]
    finally:
        ws.close()


def read_version_verified(ws, digest):
    with ws.db.tx() as conn:
        return read_version(conn, "release", digest).verified
