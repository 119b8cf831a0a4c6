"""Publication, permits, pinned runs, the step-0 barrier and the reader."""

import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request

import pytest
from support.runs import create_run

from relgate.catalog.permit_table import get_permit
from relgate.catalog.release_table import get_release
from relgate.documents import release_root as rm
from relgate.errors import ConflictError, RejectedError
from relgate.gate.recheck import recheck
from relgate.holds.pins import add_pin
from relgate.release.metrics import Probe, ReleaseMetrics
from relgate.release.publication import approve_release, publish, rollback_release
from relgate.release.verify.verifier import verify_release
from relgate.release.writer import write_release
from relgate.runs.assignment import assignment, rescale
from relgate.runs.rank_worker import report
from relgate.runs.reader import InputPosition, open_reader
from relgate.runs.run_end import cancel_run, finish_run
from relgate.runs.store import get_run, run_status
from relgate.snapshot import activation as lifecycle

PURPOSE = "demo-model-training"


def _verified(ws, snapshot, records_per_shard=40):
    manifest = write_release(ws, snapshot.digest, records_per_shard=records_per_shard, actor="test")
    report = verify_release(ws, manifest.digest, workers=1, actor="test")
    assert report.ok, report.to_json()
    return manifest


def _published(ws, snapshot, alias="train", records_per_shard=40):
    manifest = _verified(ws, snapshot, records_per_shard)
    approve_release(ws, manifest.digest, approver="alice")
    publish(ws, manifest.digest, alias=alias, actor="alice")
    return manifest


def _worker(home, run_id, rank, *, timeout=30.0, env=None, probe_port=None):
    cmd = [
        sys.executable,
        "-m",
        "relgate.cli",
        "--home",
        str(home),
        "run",
        "worker",
        "--run",
        run_id,
        "--rank",
        str(rank),
        "--barrier-timeout",
        str(timeout),
        "--json",
    ]
    if probe_port is not None:
        cmd += ["--probe-port", str(probe_port)]
    return subprocess.Popen(
        cmd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "RELGATE_HASH_WORKERS": "1", **(env or {})},
    )


def test_publish_is_a_cas_and_retries_only_with_the_same_root(ws, snapshot):
    first = _verified(ws, snapshot)
    second = _verified(ws, snapshot, records_per_shard=25)
    assert first.digest != second.digest
    with pytest.raises(RejectedError) as err:
        publish(ws, first.digest, alias="train", actor="a")  # not approved
    assert err.value.check == "state"
    approve_release(ws, first.digest, approver="alice")
    approve_release(ws, second.digest, approver="alice")
    assert (
        publish(ws, first.digest, alias="train", actor="a", expected_generation=0).generation == 1
    )
    assert publish(
        ws, first.digest, alias="train", actor="a", expected_generation=0
    ).idempotent_retry
    with pytest.raises(ConflictError):
        publish(ws, second.digest, alias="train", actor="a", expected_generation=0)
    publish(ws, second.digest, alias="train", actor="a", expected_generation=1)
    assert (
        get_release(ws.db, first.digest).state
        == get_release(ws.db, second.digest).state
        == "PUBLISHED"
    )
    back = rollback_release(ws, "train", first.digest, actor="ops")
    assert back.active_digest == first.digest and back.generation == 3


def test_rollback_refused_when_a_later_fence_hits_the_old_root(ws, snapshot):
    first = _published(ws, snapshot)
    second = _verified(ws, snapshot, records_per_shard=25)
    approve_release(ws, second.digest, approver="alice")
    member = ws.membership.read(snapshot.manifest.members_ref)["sampleId"][0]
    lifecycle.add_tombstones(ws, [member], reason="gdpr", actor="dpo")
    with pytest.raises(ConflictError):  # the candidate was built before the fence moved
        publish(ws, second.digest, alias="train", actor="a")
    with pytest.raises(RejectedError) as err:
        rollback_release(ws, "train", first.digest, actor="ops")
    assert err.value.check in {"rollback-target", "rollback-fences"}


def test_run_pins_the_root_and_permit_binds_gate_state(ws, snapshot):
    release = _published(ws, snapshot)
    run = create_run(ws, alias="train", purpose=PURPOSE, world_size=2, actor="sched")
    assert run["rootDigest"] == release.digest
    permit = get_permit(ws.db, run["permit"])
    assert (permit.root_digest, permit.generation, permit.purpose, permit.state) == (
        release.digest,
        1,
        PURPOSE,
        "OPEN",
    )
    assert (permit.tombstone_watermark, permit.benchmark_fence) == (0, 0)
    shards = [s["id"] for s in rm.wire_shards(release.document())]
    assert sorted(
        assignment(ws.db, run["runId"], 0, 0) + assignment(ws.db, run["runId"], 0, 1)
    ) == sorted(shards)
    with pytest.raises(RejectedError) as err:
        create_run(ws, alias="train", purpose="ads-ranking", world_size=1, actor="sched")
    assert err.value.check == "purpose"


def test_four_worker_processes_pass_the_barrier(ws, snapshot):
    _published(ws, snapshot, records_per_shard=20)
    run = create_run(ws, alias="train", purpose=PURPOSE, world_size=4, actor="sched")
    procs = [_worker(ws.home, run["runId"], rank) for rank in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0, 0], outs
    reports = [json.loads(out) for out, _ in outs]
    assert {r["rootDigest"] for r in reports} == {run["rootDigest"]}
    assert all(r["state"] == "RUNNING" for r in reports)
    status = run_status(ws.db, run["runId"])
    assert status.state == "RUNNING" and len(status.reports) == 4


def test_barrier_timeout_fails_the_run_before_step_0(ws, snapshot):
    _published(ws, snapshot)
    run = create_run(ws, alias="train", purpose=PURPOSE, world_size=3, actor="sched")
    procs = [
        _worker(ws.home, run["runId"], rank, timeout=2.0) for rank in range(2)
    ]  # rank 2 never comes
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [3, 3], outs
    assert {json.loads(out)["check"] for out, _ in outs} <= {"barrier-timeout", "run-failed"}
    run_row = get_run(ws.db, run["runId"])
    assert run_row.state == "FAILED" and "barrier timeout" in run_row.failure


def test_fence_hit_closes_the_permit_and_the_run_never_starts(ws, snapshot):
    release = _published(ws, snapshot)
    run = create_run(ws, alias="train", purpose=PURPOSE, world_size=1, actor="sched")
    member = ws.membership.read(snapshot.manifest.members_ref)["sampleId"][2]
    advance = lifecycle.add_tombstones(ws, [member], reason="gdpr", actor="dpo")
    assert advance.closed_permits == [run["permit"]]
    assert advance.hits[release.digest] == [1]
    revoked = get_run(ws.db, run["runId"])
    assert revoked.state == "REVOKED" and "tombstone fence entries [1]" in revoked.end_reason
    proc = _worker(ws.home, run["runId"], 0)
    out, err = proc.communicate(timeout=120)
    assert proc.returncode == 3, (out, err)
    assert json.loads(out)["check"] == "run-revoked"
    assert get_run(ws.db, run["runId"]).state == "REVOKED"
    with pytest.raises(RejectedError) as exc:  # no new permit on a hit root
        create_run(ws, alias="train", purpose=PURPOSE, world_size=1, actor="sched")
    assert exc.value.check == "fence-hits"


def test_a_rank_reporting_another_root_fails_the_barrier(ws, snapshot):
    _published(ws, snapshot)
    run = create_run(ws, alias="train", purpose=PURPOSE, world_size=2, actor="sched")

    report(ws.db, run["runId"], 0, 1, "sha256:" + "0" * 64, [], True, "stale worker")
    proc = _worker(ws.home, run["runId"], 0)
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 3 and json.loads(out)["check"] == "barrier"
    assert "root mismatch" in get_run(ws.db, run["runId"]).failure


def test_recovery_and_scale_out_never_read_the_new_alias(ws, snapshot):
    old = _published(ws, snapshot)
    run = create_run(ws, alias="train", purpose=PURPOSE, world_size=1, actor="sched")
    procs = [_worker(ws.home, run["runId"], 0)]
    assert procs[0].wait(timeout=120) == 0
    newer = _verified(ws, snapshot, records_per_shard=25)
    approve_release(ws, newer.digest, approver="alice")
    publish(ws, newer.digest, alias="train", actor="alice")
    scaled = rescale(ws, run["runId"], 2)
    assert scaled.root_digest == old.digest and scaled.epoch == 1
    procs = [_worker(ws.home, run["runId"], rank) for rank in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    assert {json.loads(o)["rootDigest"] for o, _ in outs} == {old.digest}
    # A recovering rank restarted in the same epoch re-reports the same root.
    again = _worker(ws.home, run["runId"], 1)
    _out, err = again.communicate(timeout=120)
    assert again.returncode == 0, err


def test_reader_resumes_exactly_from_a_saved_position(ws, snapshot):
    release = _published(ws, snapshot, records_per_shard=30)
    shards = [s["id"] for s in rm.wire_shards(release.document())][::2]
    run = create_run(ws, root=release.digest, purpose=PURPOSE, world_size=1, actor="t")["runId"]
    full = [r["sampleId"] for r in open_reader(ws, release.digest, shards, seed=7, run=run)]
    assert (
        len(full)
        == len(set(full))
        == sum(s["records"] for s in rm.wire_shards(release.document())[::2])
    )
    reader = open_reader(ws, release.digest, shards, seed=7, run=run)
    it = iter(reader)
    head = [next(it)["sampleId"] for _ in range(37)]
    saved = json.loads(json.dumps(reader.position.to_json()))  # beside a checkpoint
    reader.close()
    tail = [
        r["sampleId"]
        for r in open_reader(
            ws, release.digest, shards, seed=7, position=InputPosition.from_json(saved), run=run
        )
    ]
    assert head + tail == full
    # the run ends; a checkpoint pin holding the saved position resumes it exactly
    pin = add_pin(ws, release.digest, owner="o", reason="ckpt", kind="checkpoint", position=saved)
    cancel_run(ws, run, actor="t")
    with pytest.raises(RejectedError) as ended:
        open_reader(ws, release.digest, shards, seed=7, run=run)
    assert ended.value.check == "run-state"
    resumed = open_reader(ws, release.digest, [], seed=0, pin=pin.pin_id)
    assert resumed.position.to_json() == saved
    assert [r["sampleId"] for r in resumed] == full[37:]
    other_run = create_run(ws, root=release.digest, purpose=PURPOSE, world_size=1, actor="t")
    other = [
        r["sampleId"]
        for r in open_reader(ws, release.digest, shards, seed=8, run=other_run["runId"])
    ]
    assert other != full and sorted(other) == sorted(full)


def test_probe_is_ready_only_after_the_root_is_verified(ws, snapshot):
    probe = Probe(ReleaseMetrics())
    try:
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(f"http://127.0.0.1:{probe.port}/ready", timeout=5)
        assert err.value.code == 503
    finally:
        probe.close()
    _published(ws, snapshot)
    run = create_run(ws, alias="train", purpose=PURPOSE, world_size=1, actor="sched")

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = _worker(ws.home, run["runId"], 0, probe_port=port)  # serves for the run's life
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/ready", timeout=5) as resp:
                    assert resp.status == 200
                    break
            except (urllib.error.URLError, ConnectionError):
                assert time.monotonic() < deadline
                time.sleep(0.1)
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5) as resp:
            text = resp.read().decode()
        assert "relgate_verified_shards_ratio" in text and run["rootDigest"] in text
        while get_run(ws.db, run["runId"]).state != "RUNNING":  # ready precedes step 0
            assert proc.poll() is None and time.monotonic() < deadline
            time.sleep(0.1)
        assert proc.poll() is None  # still serving after the barrier
        finish_run(ws, run["runId"], actor="sched")
    finally:
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            proc.kill()
            raise
    assert proc.returncode == 0, err
    assert json.loads(out)["state"] == "FINISHED"


def test_fence_recheck_invalidates_unpublished_releases(ws, snapshot):
    release = _verified(ws, snapshot)
    member = ws.membership.read(snapshot.manifest.members_ref)["sampleId"][1]
    lifecycle.add_tombstones(ws, [member], reason="gdpr", actor="dpo")
    result = recheck(ws, "release", release.digest, actor="sensor")
    assert result.state == "INVALID" and result.hits == {"tombstone": 1}
