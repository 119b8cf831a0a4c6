"""Release metrics are set from real values after real runs (issue 8, item 11).

Each test makes a fresh ``ReleaseMetrics`` (it becomes the process's active one), runs
the real verifier / worker / barrier, and reads the value from the Prometheus registry.
"""

import io

import pyarrow.parquet as pq
import pytest
from support.releases import overwrite_in_place, shard_path, write
from support.runs import create_run

from relgate.documents import release_root as rm
from relgate.errors import RejectedError
from relgate.release.metrics import ReleaseMetrics
from relgate.release.publication import approve_release, publish
from relgate.release.verify.verifier import verify_release
from relgate.runs.rank_worker import report, run_worker
from relgate.runs.shard_fetch import fetch_shard

PURPOSE = "demo-model-training"


def _value(metrics, name, **labels):
    return metrics.registry.get_sample_value(name, labels)


def test_verifier_sets_every_value_it_knows(ws, snapshot):
    release = write(ws, snapshot.digest)
    metrics = ReleaseMetrics()
    rep = verify_release(ws, release.digest, workers=2, actor="t")  # worker processes
    assert rep.ok
    root = release.digest
    assert _value(metrics, "relgate_verified_shards_ratio", root=root) == 1.0
    for cls in ("missing", "extra", "duplicate", "contentSubstitution", "splitConflict"):
        assert _value(metrics, "relgate_member_diff", root=root, cls=cls) == 0
    stored = sum(s["bytes"] for s in rep.shards)
    seconds = sum(s["readMicros"] for s in rep.shards) / 1_000_000
    assert stored == sum(d["size"] for d in rm.wire_shards(release.document()))
    assert _value(metrics, "relgate_read_bytes_per_second", root=root) == pytest.approx(
        stored / seconds
    )
    # Decoded bytes recomputed independently from the stored shards.
    decoded = sum(
        pq.read_table(io.BytesIO(shard_path(ws, d).read_bytes())).combine_chunks().nbytes
        for d in rm.wire_shards(release.document())
    )
    assert _value(metrics, "relgate_decompression_ratio", root=root) == pytest.approx(
        decoded / stored
    )
    assert (_value(metrics, "relgate_digest_failures_total", root=root) or 0) == 0


def test_verifier_counts_digest_failures_ratio_and_missing_members(ws, snapshot):
    release = write(ws, snapshot.digest)
    rotten = rm.wire_shards(release.document())[1]
    overwrite_in_place(
        shard_path(ws, rotten), shard_path(ws, rm.wire_shards(release.document())[0]).read_bytes()
    )
    metrics = ReleaseMetrics()
    rep = verify_release(ws, release.digest, workers=0, actor="t")
    root = release.digest
    n = len(rm.wire_shards(release.document()))
    # another shard's bytes: refused by size before hashing when the lengths differ
    caught = (rep.counts["storageDigestMismatch"], rep.counts["sizeMismatch"])
    assert max(caught) == 1 and set(caught) <= {0, 1}  # by size, by digest, or both
    assert _value(metrics, "relgate_digest_failures_total", root=root) == 1
    assert _value(metrics, "relgate_verified_shards_ratio", root=root) == pytest.approx((n - 1) / n)
    assert _value(metrics, "relgate_member_diff", root=root, cls="missing") == rotten["records"]
    assert _value(metrics, "relgate_member_diff", root=root, cls="extra") == 0


def test_cache_corruption_is_counted(ws, snapshot, tmp_path):
    release = write(ws, snapshot.digest)
    d = rm.wire_shards(release.document())[0]
    metrics = ReleaseMetrics()
    cache = tmp_path / "cache"
    fetch_shard(ws.store, d, cache, root=release.digest)
    cached = cache / (d["digest"].removeprefix("sha256:") + ".shard")
    cached.write_bytes(b"rot" + cached.read_bytes()[3:])
    assert fetch_shard(ws.store, d, cache, root=release.digest)[1] == "rejected"
    assert fetch_shard(ws.store, d, cache, root=release.digest)[1] == "hit"
    assert _value(metrics, "relgate_cache_corruption_total", root=release.digest) == 1


def _published(ws, snapshot):
    release = write(ws, snapshot.digest)
    assert verify_release(ws, release.digest, workers=0, actor="t").ok
    approve_release(ws, release.digest, approver="alice")
    publish(ws, release.digest, alias="train", actor="alice")
    return release


def test_worker_sets_ratio_barrier_wait_and_io(ws, snapshot):
    release = _published(ws, snapshot)
    run = create_run(ws, alias="train", purpose=PURPOSE, world_size=1, actor="sched")
    metrics = ReleaseMetrics()
    result = run_worker(ws, run["runId"], 0, barrier_timeout=30)
    root = release.digest
    assert result.state == "RUNNING"
    assert _value(metrics, "relgate_verified_shards_ratio", root=root) == 1.0
    assert _value(metrics, "relgate_barrier_wait_seconds", root=root, rank="0") == pytest.approx(
        result.barrier_wait_s
    )
    assert _value(metrics, "relgate_root_mismatches", root=root) == 0
    assert _value(metrics, "relgate_read_bytes_per_second", root=root) > 0
    assert _value(metrics, "relgate_decompression_ratio", root=root) > 1


def test_barrier_counts_ranks_that_report_another_root(ws, snapshot):
    release = _published(ws, snapshot)
    run = create_run(ws, alias="train", purpose=PURPOSE, world_size=2, actor="sched")
    other = "sha256:" + "ab" * 32
    report(ws.db, run["runId"], 0, 1, other, [], True, "verified")  # a rank on another root
    metrics = ReleaseMetrics()
    with pytest.raises(RejectedError) as err:
        run_worker(ws, run["runId"], 0, barrier_timeout=30)
    assert err.value.check == "barrier"
    assert _value(metrics, "relgate_root_mismatches", root=release.digest) == 1
