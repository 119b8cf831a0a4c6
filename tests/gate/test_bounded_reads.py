"""Every object read is bounded by the size its signed document records (issue 28, item 9).

A 2 GiB object (sparse: no memory or disk is spent making it) in place of a small shard
is refused as ``sizeMismatch`` from its size alone, never read into memory and never
misreported as ``objectUnavailable``; the training reader and the shard fetcher refuse
it as ``size-mismatch``.
"""

import os

import pytest

from relgate.catalog.release_table import get_release
from relgate.documents import release_root as rm
from relgate.errors import IntegrityError
from relgate.release.verify.checks import Check
from relgate.release.verify.verifier import verify_release
from relgate.runs.shard_fetch import fetch_shard

BIG = 2 << 30


def _inflate_first_shard(ws, root):
    manifest = rm.load(ws.store, ws.trusted_keys, root, get_release(ws.db, root).envelope_version)
    d = manifest.descriptors[0]
    path = ws.store.local_path(d.object_key, d.object_version)
    os.chmod(path, 0o644)
    os.truncate(path, BIG)  # sparse: the size is there, the bytes are not
    return d


def test_the_verifier_refuses_an_oversized_shard_by_its_size(g):
    d = _inflate_first_shard(g.ws, g.r3)
    report = verify_release(g.ws, g.r3, workers=1, actor="t")
    assert report.outcome == "INVALID"
    assert report.counts[Check.SIZE_MISMATCH] == 1, report.counts
    assert report.counts[Check.OBJECT_UNAVAILABLE] == 0
    failing = [s for s in report.shards if not s["ok"]]
    assert [s["id"] for s in failing] == [d.id]
    (failure,) = failing[0]["failures"]
    assert (failure["check"], failure["actual"]) == ("sizeMismatch", BIG)
    assert failing[0]["bytes"] == 0  # nothing was read


def test_the_shard_fetcher_refuses_an_oversized_shard(g):
    d = _inflate_first_shard(g.ws, g.r3)
    with pytest.raises(IntegrityError) as info:
        fetch_shard(g.ws.store, d)
    assert (info.value.check, info.value.exit_code) == ("size-mismatch", 3)
    assert (info.value.details["expected"], info.value.details["actual"]) == (d.size, BIG)
