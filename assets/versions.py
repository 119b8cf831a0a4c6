"""Every version an entity: one partition per snapshot digest and per release root.

``dataset_snapshot``, ``shard_release`` and ``release_verification`` are the pipeline's
steps: each page shows what the last run did.  ``snapshot_version`` and
``release_version`` are partitioned by digest (dynamic partitions ``snapshot_digest`` and
``release_root``), so every version ever built keeps its own materializations and check
history: the validation or the verification of *that* digest, its catalog state, and
``zero_fence_hits`` turning red on it when a fence advance hits it.

The pipeline records a version as it checks it (the snapshot's validation, the release's
verification checks): the partition is added, a materialization of the version's
partition is logged with its catalog record, and each check's evaluation is logged on
that partition too.  Materializing a partition from the UI (or ``dagster asset
materialize --partition <digest>``) re-reads the version from the catalog and evaluates
its checks again: a snapshot is re-validated from its pinned sources, a release's checks
are read from its stored, signature-checked verification report.  The alias assets name
the live partition (``livePartition``).
"""

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import dagster as dg

from assets.failures import refusals_fail
from assets.fence_hits import FENCE_CHECK, VERSION_ASSET, fence_result
from assets.ownership import OWNERS, tags_for
from assets.validation_metadata import validation_metadata
from assets.verification_results import VERIFICATION_CHECK_NAMES, verification_results
from relgate.catalog.release_table import get_release
from relgate.catalog.snapshot_table import get_snapshot
from relgate.release.verify.report import stored_report
from relgate.snapshot.validate import validate_snapshot
from relgate.workspace import Workspace
from resources.relgate import RelgateResource

GROUP = "versions"
SNAPSHOT_DIGESTS = dg.DynamicPartitionsDefinition(name="snapshot_digest")
RELEASE_ROOTS = dg.DynamicPartitionsDefinition(name="release_root")
PARTITIONS = {"snapshot": SNAPSHOT_DIGESTS, "release": RELEASE_ROOTS}
VALIDATION_CHECK = "snapshot_validation"
#: The checks each version kind's partitions carry.
VERSION_CHECKS: dict[str, tuple[str, ...]] = {
    "snapshot": (VALIDATION_CHECK, FENCE_CHECK),
    "release": (*VERIFICATION_CHECK_NAMES, FENCE_CHECK),
}


def live_partition(kind: str, digest: str | None) -> str:
    """How an alias names its live version: the version asset and its partition key."""
    return f"{VERSION_ASSET[kind]}[{digest}]" if digest else "none"


def _snapshot_metadata(ws: Workspace, digest: str) -> dict[str, Any]:
    row = get_snapshot(ws.db, digest)
    return {
        "digest": digest,
        "state": row.state,
        "members": row.member_count,
        "purpose": row.purpose,
        "tombstoneWatermark": row.tombstone_watermark,
        "benchmarkFence": row.benchmark_fence,
        "createdAt": row.created_at,
    }


def _release_metadata(ws: Workspace, root: str) -> dict[str, Any]:
    row = get_release(ws.db, root)
    return {
        "root": root,
        "state": row.state,
        "snapshot": row.snapshot_digest,
        "shards": row.shard_count,
        "records": row.record_count,
        "tombstoneWatermark": row.tombstone_watermark,
        "benchmarkFence": row.benchmark_fence,
        "createdAt": row.created_at,
    }


def _record(
    context: dg.OpExecutionContext,
    kind: str,
    digest: str,
    metadata: dict[str, Any],
    results: Sequence[dg.AssetCheckResult],
) -> None:
    partitions = PARTITIONS[kind]
    assert partitions.name is not None  # noqa: S101 - both are named above
    context.instance.add_dynamic_partitions(partitions.name, [digest])
    key = dg.AssetKey(VERSION_ASSET[kind])
    context.log_event(dg.AssetMaterialization(asset_key=key, partition=digest, metadata=metadata))
    for result in results:
        assert result.check_name is not None  # noqa: S101 - every result here is named
        evaluation = dg.AssetCheckEvaluation(
            asset_key=key,
            check_name=result.check_name,
            passed=result.passed,
            metadata=result.metadata,
            severity=result.severity,
            description=result.description,
            partition=digest,
        )
        # log_event records an AssetCheckEvaluation (dagster 1.13.27); its annotation omits it
        context.log_event(evaluation)  # type: ignore[arg-type]


def record_snapshot_version(
    context: dg.OpExecutionContext, ws: Workspace, digest: str, validation: dg.AssetCheckResult
) -> None:
    """The pipeline checked snapshot ``digest``: record it on its own partition."""
    _record(
        context,
        "snapshot",
        digest,
        _snapshot_metadata(ws, digest),
        [validation, fence_result(ws, digest)],
    )


def record_release_version(
    context: dg.OpExecutionContext,
    ws: Workspace,
    root: str,
    results: Sequence[dg.AssetCheckResult],
) -> None:
    """The pipeline verified release ``root``: record it on its own partition."""
    _record(
        context,
        "release",
        root,
        _release_metadata(ws, root),
        [*results, fence_result(ws, root)],
    )


def _specs(kind: str) -> list[dg.AssetCheckSpec]:
    return [
        dg.AssetCheckSpec(
            name,
            asset=VERSION_ASSET[kind],
            description=f"{name} on this {kind} version (its partition)",
        )
        for name in VERSION_CHECKS[kind]
    ]


def _version_asset(
    kind: str, upstream: str, description: str
) -> Callable[[Callable[..., Any]], dg.AssetsDefinition]:
    """The decorator of ``kind``'s version asset: partitioned by digest, after ``upstream``."""
    return dg.asset(
        name=VERSION_ASSET[kind],
        group_name=GROUP,
        owners=OWNERS,
        tags=tags_for(GROUP),
        partitions_def=PARTITIONS[kind],
        deps=[upstream],
        check_specs=_specs(kind),
        description=description,
    )


@_version_asset(
    "snapshot",
    "dataset_snapshot",
    "Every snapshot ever built, one partition per digest: its catalog state, its validation"
    " and fence-hit history. Materializing a partition re-validates it.",
)
@refusals_fail
def snapshot_version(
    context: dg.AssetExecutionContext, relgate: RelgateResource
) -> Iterator[dg.MaterializeResult[None] | dg.AssetCheckResult]:
    ws = relgate.workspace()
    digest = context.partition_key
    report = validate_snapshot(ws, digest, actor=relgate.run_actor())
    yield dg.MaterializeResult(metadata=_snapshot_metadata(ws, digest))
    yield dg.AssetCheckResult(
        check_name=VALIDATION_CHECK,
        passed=report.ok,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata=validation_metadata(report),
    )
    yield fence_result(ws, digest)


@_version_asset(
    "release",
    "release_verification",
    "Every release ever written, one partition per root: its catalog state, its verification"
    " checks (from the stored signed report) and fence-hit history.",
)
@refusals_fail
def release_version(
    context: dg.AssetExecutionContext, relgate: RelgateResource
) -> Iterator[dg.MaterializeResult[None] | dg.AssetCheckResult]:
    ws = relgate.workspace()
    root = context.partition_key
    yield dg.MaterializeResult(metadata=_release_metadata(ws, root))
    report = stored_report(ws, root)
    if report is None:
        for name in VERIFICATION_CHECK_NAMES:
            yield dg.AssetCheckResult(
                check_name=name,
                passed=False,
                severity=dg.AssetCheckSeverity.ERROR,
                description=f"{root} has no stored verification report",
                metadata={"root": root, "reportDigest": ""},
            )
    else:
        yield from verification_results(ws, report)
    yield fence_result(ws, root)


version_assets = [snapshot_version, release_version]
