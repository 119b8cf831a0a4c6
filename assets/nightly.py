"""Nightly snapshots as daily partitions: one materialization per night, never overwritten.

``nightly_snapshot`` freezes the sources, builds a snapshot for the alias (or reports the
alias's active one when nothing changed) and validates it, per daily partition; the
partition's data version is the snapshot digest, so each night's history stays in the UI.
It builds and validates only: activation needs a named approval, given per night by
materializing that night's partition of ``nightly_promotion`` with the approver's name.
The ``nightly_snapshot`` schedule launches the previous day's partition at 02:00 UTC; a
freshness policy marks the asset stale when no night's build landed between 02:00 and
03:00 UTC (Dagster evaluates it; no sensor is needed).
"""

from collections.abc import Iterator
from datetime import timedelta

import dagster as dg

from assets.failures import refusals_fail
from assets.ownership import OWNERS, tags_for
from assets.snapshots import PipesTransformRunner, SnapshotConfig
from assets.source_specs import source_assets
from assets.table_metadata import ROW_COUNT
from assets.validation_metadata import validation_metadata
from assets.versions import live_partition
from relgate.snapshot import activation
from relgate.snapshot.build import BuildSpec, build_for_alias, freeze
from relgate.snapshot.validate import validate_snapshot
from resources.relgate import RelgateResource

GROUP = "nightly"
VALIDATION_CHECK = "nightly_validation"
NIGHTLY_PARTITIONS = dg.DailyPartitionsDefinition(start_date="2026-11-01", timezone="UTC")


@dg.asset(
    group_name=GROUP,
    owners=OWNERS,
    tags=tags_for(GROUP),
    kinds={"parquet"},
    partitions_def=NIGHTLY_PARTITIONS,
    deps=[spec.key for spec in source_assets],
    # Fresh when a materialization landed between 02:00 and 03:00 UTC (the schedule's window).
    freshness_policy=dg.FreshnessPolicy.cron(
        deadline_cron="0 3 * * *", lower_bound_delta=timedelta(hours=1), timezone="UTC"
    ),
    description="The night's snapshot (one daily partition each): frozen sources, built and validated.",
    check_specs=[
        dg.AssetCheckSpec(
            VALIDATION_CHECK,
            asset="nightly_snapshot",
            blocking=True,
            description="Recompute from pinned sources; every zero-check must be zero.",
        )
    ],
)
@refusals_fail
def nightly_snapshot(
    context: dg.AssetExecutionContext, config: SnapshotConfig, relgate: RelgateResource
) -> Iterator[dg.MaterializeResult[object] | dg.AssetCheckResult]:
    ws = relgate.workspace()
    frozen = freeze(ws, BuildSpec.from_config(ws.config))
    runner = PipesTransformRunner(context, dg.PipesSubprocessClient())
    result = build_for_alias(
        ws,
        frozen,
        alias=config.alias,
        actor=relgate.run_actor(),
        purpose=config.purpose,
        runner=runner,
    )
    manifest = result.manifest
    context.log.info(
        f"nightly {context.partition_key}: snapshot {result.digest} members={manifest.member_count}"
    )
    report = validate_snapshot(ws, result.digest, actor=relgate.run_actor())
    yield dg.MaterializeResult(
        data_version=dg.DataVersion(result.digest),
        metadata={
            "digest": result.digest,
            "night": context.partition_key,
            "existing": result.existing,
            "members": manifest.member_count,
            ROW_COUNT: manifest.member_count,
            "sources": len(frozen.sources),
            "transformLaunches": runner.launches,
            "validation": report.outcome,
        },
    )
    yield dg.AssetCheckResult(
        check_name=VALIDATION_CHECK,
        passed=report.ok,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata=validation_metadata(report),
    )


class PromotionConfig(dg.Config):
    """An approver promotes one night's build: the approval is this person's name, bound to
    that night's exact digest."""

    approver: str
    alias: str = "default"
    comment: str = ""
    #: None: over the alias's current generation; N: only from generation N
    expect_generation: int | None = None


@dg.asset(
    group_name=GROUP,
    owners=OWNERS,
    tags=tags_for(GROUP),
    partitions_def=NIGHTLY_PARTITIONS,
    deps=[nightly_snapshot],
    description="Promote one night's build: a named approval of the night's snapshot digest,"
    " then the alias CAS through the gate. Materialize a night's partition from the UI with"
    " the approver's name; the schedule never runs it.",
)
@refusals_fail
def nightly_promotion(
    context: dg.AssetExecutionContext, config: PromotionConfig, relgate: RelgateResource
) -> dg.MaterializeResult[None]:
    night = context.partition_key
    records = context.instance.fetch_materializations(
        dg.AssetRecordsFilter(asset_key=nightly_snapshot.key, asset_partitions=[night]), limit=1
    ).records
    built = records[0].asset_materialization if records else None
    if built is None or "digest" not in built.metadata:
        raise dg.Failure(
            description=f"nightly_snapshot has no build for {night}: nothing to promote",
            metadata={"night": night, "check": "nightly-build"},
        )
    # The digest comes from the instance's event log: the gate re-checks it at activation
    # (a passing signed validation report for exactly this digest, both fences).
    digest = str(built.metadata["digest"].value)
    change = activation.approve_and_activate(
        relgate.workspace(),
        digest,
        alias=config.alias,
        approver=config.approver,
        comment=config.comment or f"nightly {night}",
        expected_generation=config.expect_generation,
    )
    context.log.info(
        f"night {night}: alias {config.alias} generation {change.generation} -> {digest}"
    )
    return dg.MaterializeResult(
        metadata={
            "night": night,
            "alias": config.alias,
            "generation": change.generation,
            "activeDigest": digest,
            "livePartition": live_partition("snapshot", digest),
            "approver": config.approver,
            "existing": change.idempotent_retry,
        },
    )


nightly_snapshot_job = dg.define_asset_job(
    "nightly_snapshot_job",
    executor_def=dg.in_process_executor,
    selection=dg.AssetSelection.assets(nightly_snapshot),
    description="Build and validate one night's snapshot (a daily partition).",
)

nightly_snapshot_schedule = dg.build_schedule_from_partitioned_job(
    nightly_snapshot_job,
    name="nightly_snapshot",
    hour_of_day=2,
    minute_of_hour=0,
    default_status=dg.DefaultScheduleStatus.STOPPED,
    description="Builds and validates the previous day's partition every night at 02:00 UTC.",
)

nightly_assets = [nightly_snapshot, nightly_promotion]
