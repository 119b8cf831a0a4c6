"""Run lifecycle and revocation of every held root (SQLite and PostgreSQL).

A fence advance records hits on, and closes the permits of, every root anything still
holds (permits, runs that have not ended, pins, checkpoint positions, live reader leases,
versions the alias retains); workers refuse at the barrier, readers refuse mid-run, the
run is REVOKED.  Runs end (finish, cancel) and release their hold; admission takes an
exact root and checks purpose, both watermarks and the alias generation.
"""

import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from support.lifecycle import publish
from support.releases import forge
from support.runs import create_run

from relgate.catalog.db import execute, rows
from relgate.catalog.permit_table import get_permit
from relgate.documents import release_root as rm
from relgate.errors import ConflictError, IntegrityError, NotFoundError, RejectedError, UsageError
from relgate.gate.transitions import open_gate
from relgate.holds.pins import acquire_lease, add_pin, get_lease, release_lease
from relgate.holds.retention import RetentionPolicy, now_utc, retained_versions, set_policy
from relgate.release.publication import rollback_release
from relgate.runs.reader import InputPosition, open_reader
from relgate.runs.run_end import cancel_run, fail_run, finish_run
from relgate.runs.store import get_run, list_runs
from relgate.snapshot import activation as lifecycle
from tests.release.test_runs import PURPOSE, _published, _verified, _worker


def _members(ws, snapshot):
    return ws.membership.read(snapshot.manifest.members_ref)


def _minimal_retention(ws, alias="train"):
    """The alias retains only its active root: older roots are held only by what we add."""
    set_policy(ws.db, RetentionPolicy(alias, keep_last=1, keep_days=0, rollback_window=0))


def _held(ws, digest):
    with ws.db.tx() as conn:
        return retained_versions(conn, now_utc()).get(("release", digest), [])


def _wait_reported(ws, run_id, n, proc):
    deadline = time.monotonic() + 120
    while True:
        with ws.db.tx() as conn:
            got = rows(conn, "SELECT rank FROM run_reports WHERE run_id = :r", {"r": run_id})
        if len(got) >= n:
            return
        assert proc.poll() is None, proc.communicate()
        assert time.monotonic() < deadline, "worker never reported"
        time.sleep(0.1)


def test_tombstone_revokes_a_superseded_root_its_run_workers_and_readers(ws, snapshot):
    _minimal_retention(ws)
    r1 = _published(ws, snapshot)
    run = create_run(ws, alias="train", purpose=PURPOSE, world_size=2, actor="sched")
    shards = [s["id"] for s in rm.wire_shards(r1.document())]
    reader = open_reader(ws, r1.digest, shards, seed=3, run=run["runId"])
    it = iter(reader)
    seen = [next(it)["sampleId"] for _ in range(5)]
    rank0 = _worker(ws.home, run["runId"], 0, timeout=300)
    _wait_reported(ws, run["runId"], 1, rank0)  # rank 0 verified and waits at the barrier
    r2 = _published(ws, snapshot, records_per_shard=25)
    assert open_gate(ws).alias("train", "release").active_digest == r2.digest
    members = _members(ws, snapshot)
    index = next(i for i, s in enumerate(members["sampleId"].to_list()) if s not in seen)
    member = members["sampleId"][index]
    content = members["logicalContentDigest"][index]

    advance = lifecycle.add_tombstones(ws, [member], reason="gdpr", actor="dpo")

    assert advance.hits[r1.digest] == [1] and advance.hits[r2.digest] == [1]
    assert advance.closed_permits == [run["permit"]]
    assert get_permit(ws.db, run["permit"]).state == "CLOSED"
    revoked = get_run(ws.db, run["runId"])
    assert revoked.state == "REVOKED"
    assert "tombstone fence entries [1]" in revoked.end_reason and r1.digest in revoked.end_reason
    out, err = rank0.communicate(timeout=120)
    assert rank0.returncode == 3, (out, err)
    assert json.loads(out)["check"] == "run-revoked"  # refused at the barrier
    rank1 = _worker(ws.home, run["runId"], 1)
    out, err = rank1.communicate(timeout=120)
    assert rank1.returncode == 3 and json.loads(out)["check"] == "run-revoked", (out, err)
    assert get_run(ws.db, run["runId"]).state == "REVOKED"

    yielded = []
    with pytest.raises(RejectedError) as refused:  # the mid-run reader refuses
        for record in it:
            yielded.append(record["sampleId"])
    assert yielded == [] and member not in seen
    assert refused.value.check == "root-revoked"
    assert refused.value.digest == content  # names the sample digest, never the sample
    assert refused.value.details["fence"] == "tombstone"
    assert refused.value.details["fenceSeq"] == 1
    assert get_lease(ws, reader.lease.lease_id).state == "RELEASED"
    with pytest.raises(RejectedError) as again:
        open_reader(ws, r1.digest, shards, seed=3, run=run["runId"])
    assert again.value.check == "root-revoked"


HOLDS = ["pin", "checkpoint-pin", "reader-lease", "released-lease", "expired-lease", "nothing"]


@pytest.mark.parametrize("hold", HOLDS)
def test_benchmark_advance_reaches_every_held_root(ws, snapshot, hold):
    _minimal_retention(ws)
    r1 = _published(ws, snapshot)
    r2 = _published(ws, snapshot, records_per_shard=25)
    assert not _held(ws, r1.digest)  # superseded and outside the retention policy
    if hold == "pin":
        add_pin(ws, r1.digest, owner="audit", reason="legal hold")
    elif hold == "checkpoint-pin":
        position = InputPosition(r1.digest, 1, (rm.wire_shards(r1.document())[0]["id"],)).to_json()
        add_pin(
            ws, r1.digest, owner="ckpt", reason="step 100", kind="checkpoint", position=position
        )
    elif hold != "nothing":
        lease = acquire_lease(
            ws,
            holder="reader",
            purpose="reader",
            ttl_seconds=1 if hold == "expired-lease" else 600,
            digest=r1.digest,
        )
        if hold == "released-lease":
            release_lease(ws, lease.lease_id)
        if hold == "expired-lease":
            time.sleep(1.5)  # an expired lease protects nothing
    protected = hold in ("pin", "checkpoint-pin", "reader-lease")
    assert bool(_held(ws, r1.digest)) == protected
    content = _members(ws, snapshot)["logicalContentDigest"][4]

    advance = lifecycle.add_benchmark_items(ws, [content], benchmark="mmlu", actor="evals")

    assert advance.hits[r2.digest] == [1]  # the active root, as before
    assert (r1.digest in advance.hits) == protected
    assert bool(open_gate(ws).hits_for(r1.digest)) == protected
    # Admission of the old root is refused either way: from the recorded hit, or by
    # comparing the root's watermarks with the current fences.
    with pytest.raises(RejectedError) as refused:
        create_run(ws, root=r1.digest, purpose=PURPOSE, world_size=1, actor="sched")
    assert refused.value.check == ("fence-hits" if protected else "root-watermarks")
    # Rollback to it is refused by the fence entries recorded since its watermarks.
    set_policy(ws.db, RetentionPolicy("train"))
    with pytest.raises(RejectedError) as back:
        rollback_release(ws, "train", r1.digest, actor="ops")
    assert back.value.check == "rollback-fences"


def test_runs_finish_or_cancel_and_release_their_hold(ws, snapshot):
    _minimal_retention(ws)
    r1 = _published(ws, snapshot, records_per_shard=60)
    cancelled = create_run(ws, root=r1.digest, purpose=PURPOSE, world_size=1, actor="sched")
    with pytest.raises(RejectedError) as early:  # finishing needs step 0
        finish_run(ws, cancelled["runId"], actor="sched")
    assert early.value.check == "run-state"
    out = cancel_run(ws, cancelled["runId"], actor="sched", reason="config typo")
    assert (out.state, out.reason, out.idempotent_retry) == (
        "CANCELLED",
        "config typo",
        False,
    )
    assert cancel_run(ws, cancelled["runId"], actor="sched").idempotent_retry
    assert get_permit(ws.db, cancelled["permit"]).state == "CLOSED"
    with pytest.raises(RejectedError) as ended:
        finish_run(ws, cancelled["runId"], actor="sched")
    assert ended.value.check == "run-state"

    running = create_run(ws, root=r1.digest, purpose=PURPOSE, world_size=1, actor="sched")
    proc = _worker(ws.home, running["runId"], 0)
    assert proc.wait(timeout=120) == 0, proc.communicate()
    assert get_run(ws.db, running["runId"]).state == "RUNNING"
    reasons = _held(ws, r1.digest)
    assert f"run {running['runId']}" in reasons and f"permit {running['permit']}" in reasons
    finished = finish_run(ws, running["runId"], actor="sched")
    assert (
        finished.state == "FINISHED"
        and finish_run(ws, running["runId"], actor="x").idempotent_retry
    )
    assert get_permit(ws.db, running["permit"]).state == "CLOSED"
    with pytest.raises(RejectedError):
        cancel_run(ws, running["runId"], actor="sched")
    # Superseded and every run ended: nothing holds R1 any more, GC may reclaim it.
    _published(ws, snapshot, records_per_shard=25)
    assert _held(ws, r1.digest) == []
    assert [r.state for r in list_runs(ws.db)] == ["CANCELLED", "FINISHED"]
    with pytest.raises(NotFoundError):
        finish_run(ws, "run-nosuch", actor="sched")
    # A run that ended does not come back when its root is later revoked.
    member = _members(ws, snapshot)["sampleId"][0]
    lifecycle.add_tombstones(ws, [member], reason="gdpr", actor="dpo")
    assert get_run(ws.db, running["runId"]).state == "FINISHED"


def test_admission_by_exact_root_generation_and_recreation(ws, snapshot):
    r1 = _published(ws, snapshot)
    r2 = _published(ws, snapshot, records_per_shard=25)
    by_root = create_run(ws, root=r1.digest, purpose=PURPOSE, world_size=1, actor="sched")
    assert (by_root["rootDigest"], by_root["alias"], by_root["generation"]) == (
        r1.digest,
        None,
        None,
    )
    assert get_run(ws.db, by_root["runId"]).root_digest == r1.digest
    with pytest.raises(ConflictError) as stale:
        create_run(
            ws, alias="train", expected_generation=1, purpose=PURPOSE, world_size=1, actor="s"
        )
    assert stale.value.check == "alias-generation" and stale.value.exit_code == 4
    fresh = create_run(
        ws, alias="train", expected_generation=2, purpose=PURPOSE, world_size=1, actor="s"
    )
    assert (fresh["rootDigest"], fresh["generation"]) == (r2.digest, 2)
    with pytest.raises(ConflictError) as other:
        create_run(ws, alias="train", root=r1.digest, purpose=PURPOSE, world_size=1, actor="s")
    assert other.value.check == "alias-root"
    with pytest.raises(UsageError):
        create_run(
            ws, expected_generation=2, root=r1.digest, purpose=PURPOSE, world_size=1, actor="s"
        )
    with pytest.raises(RejectedError) as purpose:
        create_run(ws, root=r1.digest, purpose="ads-ranking", world_size=1, actor="s")
    assert purpose.value.check == "purpose"
    staged = _verified(ws, snapshot, records_per_shard=30)
    with pytest.raises(RejectedError) as unpublished:
        create_run(ws, root=staged.digest, purpose=PURPOSE, world_size=1, actor="s")
    assert unpublished.value.check == "release-state"
    # A failed run is recreated on the same digest; the failure closed its permit.
    assert fail_run(ws.db, by_root["runId"], "rank 0 lost its node")
    assert get_permit(ws.db, by_root["permit"]).state == "CLOSED"
    again = create_run(ws, root=r1.digest, purpose=PURPOSE, world_size=1, actor="sched")
    assert again["rootDigest"] == r1.digest and again["runId"] != by_root["runId"]
    assert get_run(ws.db, again["runId"]).state == "ADMITTED"


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


def test_cli_run_create_finish_cancel(ws, snapshot):
    r1 = _published(ws, snapshot)
    common = ["--purpose", PURPOSE, "--world-size", "1"]
    run = _cli(ws.home, "run", "create", "--root", r1.digest[7:23], *common, expect=0)
    assert run["rootDigest"] == r1.digest and run["state"] == "ADMITTED"
    refused = _cli(ws.home, "run", "finish", run["runId"], expect=3)
    assert refused["check"] == "run-state" and refused["digest"] == r1.digest
    assert _cli(ws.home, "run", "cancel", run["runId"], expect=0)["state"] == "CANCELLED"
    stale = _cli(
        ws.home, "run", "create", "--alias", "train", "--expect-generation", "0", *common, expect=4
    )
    assert stale["check"] == "alias-generation"
    assert _cli(ws.home, "run", "create", *common, expect=2)["check"] == "root"
    assert _cli(ws.home, "run", "cancel", "run-nosuch", expect=3)["check"] == "exists"
    listed = _cli(ws.home, "run", "list", "--state", "CANCELLED", expect=0)
    assert [r["runId"] for r in listed["runs"]] == [run["runId"]]


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _ready(port):
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as resp:
            return resp.status
    except urllib.error.HTTPError as exc:
        return exc.code
    except (urllib.error.URLError, ConnectionError):
        return None


def test_probe_serves_for_the_run_life_and_turns_not_ready_on_revocation(ws, snapshot):
    release = _published(ws, snapshot)
    run = create_run(ws, alias="train", purpose=PURPOSE, world_size=1, actor="sched")
    port = _free_port()
    proc = _worker(ws.home, run["runId"], 0, probe_port=port)
    try:
        deadline = time.monotonic() + 120
        while _ready(port) != 200:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
        while get_run(ws.db, run["runId"]).state != "RUNNING":  # ready precedes step 0
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        with ws.db.tx() as conn:  # the worker holds a live reader lease for the run's life
            leases = rows(
                conn,
                "SELECT state FROM leases WHERE digest = :d AND purpose = 'reader'",
                {"d": release.digest},
            )
        assert [lease["state"] for lease in leases] == ["ACTIVE"]
        member = _members(ws, snapshot)["sampleId"][1]
        lifecycle.add_tombstones(ws, [member], reason="gdpr", actor="dpo")
        while _ready(port) != 503:
            assert proc.poll() is None, proc.communicate()
            assert time.monotonic() < deadline
            time.sleep(0.1)
    finally:
        try:
            out, err = proc.communicate(timeout=120)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 3, (out, err)
    assert json.loads(out)["check"] == "run-revoked"
    with ws.db.tx() as conn:
        states = rows(conn, "SELECT state FROM leases WHERE digest = :d", {"d": release.digest})
    assert [s["state"] for s in states] == ["RELEASED"]


def test_reader_holds_a_renewed_lease_and_stops_when_it_is_lost(ws, snapshot):
    release = _published(ws, snapshot, records_per_shard=30)
    shards = [s["id"] for s in rm.wire_shards(release.document())]
    run = create_run(ws, root=release.digest, purpose=PURPOSE, world_size=1, actor="t")["runId"]
    reader = open_reader(ws, release.digest, shards, seed=1, lease_ttl=1, run=run)
    lease_id = reader.lease.lease_id
    assert get_lease(ws, lease_id).state == "ACTIVE"
    assert ("release", release.digest) in {
        k for k, v in _held_all(ws).items() if any("reader lease" in r for r in v)
    }
    deadline = time.monotonic() + 30
    while reader.lease.renewals < 2:  # renewed before expiry, more than once
        assert time.monotonic() < deadline
        time.sleep(0.05)
    it = iter(reader)
    next(it)
    release_lease(ws, lease_id)  # lost behind the reader's back: it protects nothing
    with pytest.raises(RejectedError) as lost:
        for _ in it:
            pass
    assert lost.value.check == "reader-lease"
    full = open_reader(ws, release.digest, shards, seed=1, run=run)
    records = list(full)
    assert len(records) == sum(s["records"] for s in rm.wire_shards(release.document()))
    assert get_lease(ws, full.lease.lease_id).state == "RELEASED"  # released at the end


def _held_all(ws):
    with ws.db.tx() as conn:
        return retained_versions(conn, now_utc())


def test_a_signed_root_the_model_refuses_is_never_published_nor_admitted(ws, snapshot):
    """A root signed by the trusted builder key, approved, but carrying a writer field no
    root model has: the gate refuses to publish it and to admit a run on it by digest
    (check ``schema``, exit 3, naming the root), and no run or permit is left behind."""
    r1 = _published(ws, snapshot)

    def odd_writer(body):
        body["writer"] = {**body["writer"], "tunedBy": "forger"}

    forged = forge(ws, r1, odd_writer)
    with pytest.raises(IntegrityError) as err:
        publish(ws, forged.digest, "odd")
    assert (err.value.check, err.value.digest, err.value.exit_code) == ("schema", forged.digest, 3)
    with ws.db.tx() as conn:  # a catalog edited to PUBLISHED does not get it admitted either
        execute(
            conn, "UPDATE releases SET state = 'PUBLISHED' WHERE digest = :d", {"d": forged.digest}
        )
    with pytest.raises(IntegrityError) as err:
        create_run(ws, root=forged.digest, purpose=PURPOSE, world_size=1, actor="sched")
    assert (err.value.check, err.value.digest) == ("schema", forged.digest)
    with ws.db.tx() as conn:
        assert (
            rows(conn, "SELECT run_id FROM runs WHERE root_digest = :d", {"d": forged.digest}) == []
        )
        assert (
            rows(conn, "SELECT permit_id FROM permits WHERE root_digest = :d", {"d": forged.digest})
            == []
        )
