"""``zero_fence_hits``, written once: the hits the gate recorded against a version, as a
check result (executed) or an evaluation (recorded by the recheck run), on the pipeline
asset or on the version's own partition."""

from __future__ import annotations

from typing import Any

import dagster as dg

from assets.table_metadata import typed_table
from relgate.gate.hits import HitRecord
from relgate.gate.transitions import open_gate
from relgate.workspace import Workspace

FENCE_CHECK = "zero_fence_hits"
#: The pipeline asset each version kind is checked on.
CHECKED_ASSET = {"snapshot": "dataset_snapshot", "release": "shard_release"}
#: The asset whose partitions are the versions of each kind (assets.versions).
VERSION_ASSET = {"snapshot": "snapshot_version", "release": "release_version"}


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


def hit_evaluation(
    kind: str, digest: str, hits: list[HitRecord], *, partition: str | None = None
) -> dg.AssetCheckEvaluation:
    """The evaluation the recheck run records for a version a fence advance hit: on the
    pipeline asset (``partition`` None) or on the version's own partition."""
    return dg.AssetCheckEvaluation(
        asset_key=dg.AssetKey(VERSION_ASSET[kind] if partition else CHECKED_ASSET[kind]),
        partition=partition,
        check_name=FENCE_CHECK,
        passed=not hits,
        metadata=_metadata(digest, hits),
        severity=dg.AssetCheckSeverity.ERROR,
        description=_why(digest, hits),
    )


def fence_result(ws: Workspace, digest: str) -> dg.AssetCheckResult:
    """The check's result for ``digest`` now: the hits the gate recorded against it."""
    hits = open_gate(ws).hits_for(digest)
    return dg.AssetCheckResult(
        check_name=FENCE_CHECK,
        passed=not hits,
        severity=dg.AssetCheckSeverity.ERROR,
        description=_why(digest, hits),
        metadata=_metadata(digest, hits),
    )
