"""``zero_fence_hits``: no tombstone or benchmark fence hit this version.

The check on ``dataset_snapshot`` and on ``shard_release`` reads the hits the gate recorded
against the asset's current digest (``relgate.gate.hits``).  A fence advance that hits an
ACTIVE snapshot or a PUBLISHED root turns it red without anyone re-materializing: the fence
sensor's recheck run records a failed evaluation of this check on each hit version
(:func:`hit_evaluation`), and executing the check (alone, from the UI) reads the same hits.
"""

from __future__ import annotations

from typing import Any

import dagster as dg

from assets.failures import refusals_fail
from assets.releases import shard_release
from assets.snapshots import dataset_snapshot
from assets.table_metadata import typed_table
from relgate.gate.hits import HitRecord
from relgate.gate.transitions import open_gate
from resources.relgate import RelgateResource

FENCE_CHECK = "zero_fence_hits"
#: The asset each version kind is checked on.
CHECKED_ASSET = {"snapshot": "dataset_snapshot", "release": "shard_release"}


def _metadata(digest: str, hits: list[HitRecord]) -> dict[str, Any]:
    return {
        "digest": digest,
        "hits": len(hits),
        "fenceHits": typed_table(
            [{"fence": h.fence_kind, "entry": h.fence_seq} for h in hits],
            [("fence", "string"), ("entry", "int")],
        ),
    }


def _why(digest: str, hits: list[HitRecord]) -> str | None:
    if not hits:
        return None
    entries = ", ".join(f"{h.fence_kind} {h.fence_seq}" for h in hits)
    return f"{digest} holds fenced members (entries {entries}): the gate refuses to admit it"


def hit_evaluation(kind: str, digest: str, hits: list[HitRecord]) -> dg.AssetCheckEvaluation:
    """The evaluation the recheck run records for a version a fence advance hit."""
    return dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey(CHECKED_ASSET[kind]),
        check_name=FENCE_CHECK,
        passed=not hits,
        metadata=_metadata(digest, hits),
        severity=dg.AssetCheckSeverity.ERROR,
        description=_why(digest, hits),
    )


def _result(relgate: RelgateResource, digest: str) -> dg.AssetCheckResult:
    hits = open_gate(relgate.workspace()).hits_for(digest)
    return dg.AssetCheckResult(
        passed=not hits,
        severity=dg.AssetCheckSeverity.ERROR,
        description=_why(digest, hits),
        metadata=_metadata(digest, hits),
    )


@dg.asset_check(
    asset=dataset_snapshot,
    name=FENCE_CHECK,
    description="No tombstone or benchmark fence hit this snapshot (turns red on a later hit).",
)
@refusals_fail
def snapshot_fence_hits(relgate: RelgateResource, dataset_snapshot: str) -> dg.AssetCheckResult:
    return _result(relgate, dataset_snapshot)


@dg.asset_check(
    asset=shard_release,
    name=FENCE_CHECK,
    description="No tombstone or benchmark fence hit this release (turns red on a later hit).",
)
@refusals_fail
def release_fence_hits(relgate: RelgateResource, shard_release: str) -> dg.AssetCheckResult:
    return _result(relgate, shard_release)


fence_checks = [snapshot_fence_hits, release_fence_hits]
