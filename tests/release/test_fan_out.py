"""Shards verified one call each (what ``release_job_celery`` runs as one step per shard),
then reduced by ``verify_release(results=...)``: the same report as the verifier's own
run, for a good release and for one with a truncated shard."""

from __future__ import annotations

import pytest
from support.releases import forge, overwrite_in_place, shard_path, state, write

from relgate.documents import release_root as rm
from relgate.errors import NotFoundError
from relgate.release.verify.verifier import shard_ids, verify_one_shard, verify_release


def _comparable(report) -> dict:
    body = report.to_json()
    shards = [{k: v for k, v in s.items() if k != "readMicros"} for s in body["shards"]]
    facts = {k: v for k, v in body["facts"].items() if k != "workers"}
    keep = ("root", "outcome", "counts", "problems", "unavailable")
    return {**{k: body.get(k) for k in keep}, "shards": shards, "facts": facts}


def _fanned_out(ws, root: str):
    # reversed: the reduce puts results back in the root's order, whatever order they came in
    ids = list(enumerate(shard_ids(ws, root)))
    results = [verify_one_shard(ws, root, i, sid) for i, sid in reversed(ids)]
    return verify_release(ws, root, workers=len(results), actor="test", results=results)


def test_fanned_out_verification_is_the_in_process_report(ws, snapshot):
    release = write(ws, snapshot.digest)
    ids = shard_ids(ws, release.digest)
    assert ids == [d["id"] for d in rm.wire_shards(release.document())]
    fanned = _fanned_out(ws, release.digest)
    assert fanned.outcome == "VERIFIED" and state(ws, release.digest) == "VERIFIED"
    whole = verify_release(ws, release.digest, workers=2, actor="test")
    assert _comparable(fanned) == _comparable(whole)
    assert fanned.to_json()["facts"]["workers"] == len(ids)


def test_fanned_out_verification_of_a_truncated_shard_is_invalid_the_same_way(ws, snapshot):
    release = write(ws, snapshot.digest)
    d = rm.wire_shards(release.document())[1]
    path = shard_path(ws, d)
    overwrite_in_place(path, path.read_bytes()[: d["size"] // 2])
    fanned = _fanned_out(ws, release.digest)
    assert fanned.outcome == "INVALID" and state(ws, release.digest) == "INVALID"
    assert fanned.counts["sizeMismatch"] == 1 and fanned.counts["missingMembers"] == 40
    whole = verify_release(ws, release.digest, workers=0, actor="test")
    assert _comparable(fanned) == _comparable(whole)


def test_a_root_listing_one_shard_twice_fans_out_both_and_reduces_the_same_way(ws, snapshot):
    release = write(ws, snapshot.digest)
    forged = forge(ws, release, lambda body: body["shards"].append(dict(body["shards"][0])))
    ids = shard_ids(ws, forged.digest)
    assert ids.count(rm.wire_shards(release.document())[0]["id"]) == 2
    fanned = _fanned_out(ws, forged.digest)
    assert fanned.outcome == "INVALID" and fanned.counts["duplicateMembers"] > 0
    whole = verify_release(ws, forged.digest, workers=0, actor="test")
    assert _comparable(fanned) == _comparable(whole)


def test_an_unknown_shard_id_is_refused_by_name(ws, snapshot):
    release = write(ws, snapshot.digest)
    with pytest.raises(NotFoundError) as refused:
        verify_one_shard(ws, release.digest, 0, "no-such-shard")
    assert refused.value.object == "no-such-shard" and refused.value.digest == release.digest
