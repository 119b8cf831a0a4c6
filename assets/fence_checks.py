"""``zero_fence_hits``: no tombstone or benchmark fence hit this version.

The check on ``dataset_snapshot`` and on ``shard_release`` reads the hits the gate recorded
against the asset's current digest (``relgate.gate.hits``).  A fence advance that hits an
ACTIVE snapshot or a PUBLISHED root turns it red without anyone re-materializing: the fence
sensor's recheck run records a failed evaluation of this check on each hit version
(:func:`hit_evaluation`), and executing the check (alone, from the UI) reads the same hits.
"""

from __future__ import annotations

import dagster as dg

from assets.failures import refusals_fail
from assets.fence_hits import FENCE_CHECK, fence_result
from assets.releases import shard_release
from assets.snapshots import dataset_snapshot
from resources.relgate import RelgateResource


@dg.asset_check(
    asset=dataset_snapshot,
    name=FENCE_CHECK,
    description="No tombstone or benchmark fence hit this snapshot (turns red on a later hit).",
)
@refusals_fail
def snapshot_fence_hits(relgate: RelgateResource, dataset_snapshot: str) -> dg.AssetCheckResult:
    return fence_result(relgate.workspace(), dataset_snapshot)


@dg.asset_check(
    asset=shard_release,
    name=FENCE_CHECK,
    description="No tombstone or benchmark fence hit this release (turns red on a later hit).",
)
@refusals_fail
def release_fence_hits(relgate: RelgateResource, shard_release: str) -> dg.AssetCheckResult:
    return fence_result(relgate.workspace(), shard_release)


fence_checks = [snapshot_fence_hits, release_fence_hits]
