"""Snapshot assets: frozen sources -> dataset snapshot (+ blocking validation) -> diff -> alias.

Each asset calls one core function and turns its typed result into Dagster output and
metadata; no snapshot rule is written here.
"""

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from assets.failures import refusals_fail
from assets.ownership import OWNERS, tags_for
from assets.source_specs import source_assets, source_key
from assets.table_metadata import COLUMN_SCHEMA, ROW_COUNT, typed_table
from assets.validation_metadata import validation_metadata
from assets.versions import VALIDATION_CHECK, live_partition, record_snapshot_version
from relgate.records.record_schema import ID_COLUMN, RecordSchema
from relgate.snapshot import activation
from relgate.snapshot.build import BuildSpec, Frozen, build_for_alias, freeze
from relgate.snapshot.comparator import EXACT, Comparator
from relgate.snapshot.diff import CountRow, Distributions, HistogramDiff, shadow_diff
from relgate.snapshot.provenance import verify_provenance
from relgate.snapshot.replay import replay
from relgate.snapshot.validate import validate_snapshot
from relgate.transforms.launcher import Launch
from resources.relgate import RelgateResource

GROUP = "snapshots"
#: Asset outputs are decoded JSON (Dagster resolves annotations at runtime, so no
#: recursive alias here).
Json = dict[str, Any]

# Output(data_version=...) is marked beta; the digest-as-data-version contract is ours to keep.
warnings.filterwarnings("ignore", category=dg.BetaWarning)


class SnapshotConfig(dg.Config):
    alias: str = "default"
    purpose: str = ""


class AliasConfig(dg.Config):
    alias: str = "default"
    approver: str  # required: approval is a person's name bound to this exact digest
    comment: str = ""
    expect_generation: int | None = None  # None: over the current generation; N: only from N


class PipesTransformRunner:
    """Runs a build's transform process once through ``PipesSubprocessClient``: the child
    (the core's watchdog around the pinned transform) runs in this run's Dagster Pipes
    session, so a wheel that speaks Pipes reports into the run; the rows shown in the
    metadata are the ones the core verified, not the child's word."""

    def __init__(self, context: dg.AssetExecutionContext, client: dg.PipesSubprocessClient) -> None:
        self.context = context
        self.client = client
        self.launches = 0

    def run(self, launch: Launch) -> None:
        self.launches += 1
        self.client.run(
            context=self.context,
            command=launch.command(),
            cwd=launch.work,
            extras={"transform": launch.transform},
        )


@dg.asset(
    group_name=GROUP,
    owners=OWNERS,
    tags=tags_for(GROUP),
    kinds={"iceberg", "s3"},
    deps=[spec.key for spec in source_assets],
    description="Fence watermarks, then every source pinned to an exact version.",
)
@refusals_fail
def frozen_sources(context: dg.AssetExecutionContext, relgate: RelgateResource) -> dg.Output[Json]:
    ws = relgate.workspace()
    frozen = freeze(ws, BuildSpec.from_config(ws.config))
    pins = [{"id": e.id, "kind": e.kind, "pin": e.label} for e in frozen.sources]
    for entry in frozen.sources:
        # The pin as the external source's observed version (its own history in the UI).
        context.log_event(
            dg.AssetObservation(
                asset_key=source_key(entry.id),
                metadata={"pin": entry.label, "kind": entry.kind},
                tags={"dagster/data_version": entry.label},
            )
        )
    return dg.Output(
        frozen.to_json(),
        metadata={
            "tombstoneWatermark": frozen.tombstone_watermark,
            "benchmarkFence": frozen.benchmark_fence,
            "transformImage": frozen.transform_image,
            "transform": dg.MetadataValue.json(
                frozen.transform_pin.to_json() if frozen.transform_pin else {}
            ),
            "pins": typed_table(pins),
            "sources": len(pins),
        },
    )


@dg.asset(
    group_name=GROUP,
    owners=OWNERS,
    tags=tags_for(GROUP),
    kinds={"parquet"},
    description="Signed training.dataset.snapshot.v1 manifest and membership table.",
)
@refusals_fail
def dataset_snapshot(
    context: dg.AssetExecutionContext,
    config: SnapshotConfig,
    relgate: RelgateResource,
    frozen_sources: Json,
) -> dg.Output[str]:
    ws = relgate.workspace()
    runner = PipesTransformRunner(context, dg.PipesSubprocessClient())
    result = build_for_alias(
        ws,
        Frozen.parse(frozen_sources, what="frozen_sources"),
        alias=config.alias,
        actor=relgate.run_actor(),
        purpose=config.purpose,
        runner=runner,
    )
    manifest = result.manifest
    if result.existing:
        context.log.info(f"unchanged input: snapshot {result.digest} is already built")
    rows = {
        "rowsIn": result.counts.get("sourceRows", 0),
        "rowsOut": result.counts.get("transformOutputRows", 0),
    }
    context.log.info(
        f"transform {manifest.transform_image}: {rows['rowsIn']} rows in, {rows['rowsOut']} out"
    )
    context.log.info(f"snapshot {result.digest} members={manifest.member_count}")
    by_source = manifest.member_counts_by_source or {}
    provenance = verify_provenance(ws, result.digest)
    return dg.Output(
        result.digest,
        data_version=dg.DataVersion(result.digest),
        metadata={
            "digest": result.digest,
            "existing": result.existing,
            "members": manifest.member_count,
            ROW_COUNT: manifest.member_count,
            "tupleRoot": manifest.tuple_root,
            "membersUri": manifest.members.uri,
            "splits": typed_table(
                [{"split": k, "members": v} for k, v in sorted(manifest.splits.items())]
            ),
            "bySource": typed_table(
                [{"source": k, "members": v} for k, v in sorted(by_source.items())],
                [("source", "string"), ("members", "int")],
            ),
            "selection": typed_table([{"stage": k, "rows": v} for k, v in result.counts.items()]),
            "parents": dg.MetadataValue.json(list(manifest.parents)),
            "recordSchema": manifest.record_schema,
            COLUMN_SCHEMA: dg.MetadataValue.table_schema(
                _column_schema(manifest.record_schema_document)
            ),
            "tokenRule": manifest.record_schema_document.tokens.kind,
            "transformImage": manifest.transform_image,
            "transform": dg.MetadataValue.json(
                manifest.transform.to_json() if manifest.transform else {}
            ),
            "transformLaunches": runner.launches,
            "transformRowsIn": rows["rowsIn"],
            "transformRowsOut": rows["rowsOut"],
            "provenanceDigest": provenance.statement_digest,
            "provenanceMaterials": provenance.materials,
        },
    )


def _column_schema(records: RecordSchema) -> dg.TableSchema:
    """The declared record schema as Dagster's column schema (``dagster/column_schema``):
    each column's type, nullability, and its role (content, id, label, attribute)."""
    roles = {c: "content" for c in records.content} | {ID_COLUMN: "id"}
    if records.label is not None:
        roles.setdefault(records.label, "label")
    return dg.TableSchema(
        columns=[
            dg.TableColumn(
                f.name,
                f.type,
                description=roles.get(f.name, "attribute"),
                constraints=dg.TableColumnConstraints(nullable=f.nullable),
            )
            for f in records.fields
        ]
    )


@dg.asset_check(
    asset=dataset_snapshot,
    blocking=True,
    description="Recompute from pinned sources; every zero-check must be zero.",
)
@refusals_fail
def snapshot_validation(
    context: dg.AssetCheckExecutionContext, relgate: RelgateResource, dataset_snapshot: str
) -> dg.AssetCheckResult:
    ws = relgate.workspace()
    report = validate_snapshot(ws, dataset_snapshot, actor=relgate.run_actor())
    result = dg.AssetCheckResult(
        check_name=VALIDATION_CHECK,
        passed=report.ok,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata=validation_metadata(report),
    )
    # the same evaluation on this digest's own partition of snapshot_version
    record_snapshot_version(context.op_execution_context, ws, dataset_snapshot, result)
    return result


@dg.asset(
    group_name=GROUP,
    owners=OWNERS,
    tags=tags_for(GROUP),
    description="Shadow comparison of the new snapshot with the alias's active version.",
)
@refusals_fail
def snapshot_diff(
    config: SnapshotConfig, relgate: RelgateResource, dataset_snapshot: str
) -> dg.Output[Json]:
    result = shadow_diff(relgate.workspace(), config.alias, dataset_snapshot)
    if result is None:
        note: Json = {"new": dataset_snapshot, "note": "no earlier active version"}
        return dg.Output(note, metadata={"against": "none"})
    return dg.Output(
        result.to_json(),
        metadata={
            "against": result.old,
            "additions": result.additions,
            "deletions": result.deletions,
            "contentChanges": result.content_changes,
            "splitMigrations": typed_table(
                [{"migration": k, "members": v} for k, v in result.split_migrations.items()],
                [("migration", "string"), ("members", "int")],
            ),
            "bySource": typed_table(
                [{"source": k, **v.to_json()} for k, v in result.by_source.items()]
            ),
            "bySplit": typed_table(
                [{"split": k, **v.to_json()} for k, v in result.by_split.items()]
            ),
            **_distribution_metadata(result.distributions),
        },
    )


_COUNT_COLUMNS = ("old", "new", "delta")


def _schema(key: str, key_type: str, columns: Sequence[str]) -> dg.TableSchema:
    return dg.TableSchema(
        columns=[
            dg.TableColumn(key, key_type),
            *(dg.TableColumn(c, "int") for c in columns),
        ]
    )


def _records(rows: Sequence[Mapping[str, Any]]) -> list[dg.TableRecord]:
    return [dg.TableRecord(dict(r)) for r in rows]


def _count_table(rows: Sequence[CountRow]) -> dg.MetadataValue:
    return dg.MetadataValue.table(
        _records([{"name": r.name, "old": r.old, "new": r.new, "delta": r.delta} for r in rows]),
        schema=_schema("name", "string", _COUNT_COLUMNS),
    )


def _histogram_table(hist: HistogramDiff) -> dg.MetadataValue:
    rows = [{"range": b.range, "old": b.old, "new": b.new, "delta": b.delta} for b in hist.buckets]
    return dg.MetadataValue.table(_records(rows), schema=_schema("range", "string", _COUNT_COLUMNS))


def _distribution_metadata(dist: Distributions | None) -> dict[str, Any]:
    """Old-vs-new distributions as tables, and divergences (ppm) as numbers that plot."""
    if dist is None:
        return {"distributions": "not available (a snapshot without statistics)"}
    out: dict[str, Any] = {
        "distributions.bySplit": _count_table(dist.by_split),
        "distributions.bySource": _count_table(dist.by_source),
        "distributions.tokenLengths": _histogram_table(dist.token_lengths),
        "divergencePpm.split": dist.split_divergence_ppm,
        "divergencePpm.source": dist.source_divergence_ppm,
        "divergencePpm.tokenLengths": dist.token_lengths.divergence_ppm,
    }
    for hist in dist.token_lengths_by_split:
        out[f"distributions.tokenLengths.{hist.name}"] = _histogram_table(hist)
        out[f"divergencePpm.tokenLengths.{hist.name}"] = hist.divergence_ppm
    if dist.label is not None:
        rows = [
            {"value": str(r.value), "old": r.old or 0, "new": r.new or 0} for r in dist.label.values
        ]
        rows.append({"value": "(other)", "old": dist.label.other.old, "new": dist.label.other.new})
        out["distributions.label"] = dg.MetadataValue.table(
            _records(rows), schema=_schema("value", "string", ("old", "new"))
        )
        out["divergencePpm.label"] = dist.label.divergence_ppm
    return out


@dg.asset(
    group_name=GROUP,
    owners=OWNERS,
    tags=tags_for(GROUP),
    description="The alias, switched by CAS through the gate after a named approval.",
)
@refusals_fail
def snapshot_alias(
    context: dg.AssetExecutionContext,
    config: AliasConfig,
    relgate: RelgateResource,
    dataset_snapshot: str,
    snapshot_diff: Json,
) -> dg.Output[Json]:
    result = activation.approve_and_activate(
        relgate.workspace(),
        dataset_snapshot,
        alias=config.alias,
        approver=config.approver,
        comment=config.comment,
        expected_generation=config.expect_generation,
    )
    generation = result.generation
    unchanged = " (unchanged)" if result.idempotent_retry else ""
    context.log.info(
        f"alias {config.alias} generation {generation} -> {dataset_snapshot}{unchanged}"
    )
    return dg.Output(
        result.to_json(),
        data_version=dg.DataVersion(f"{config.alias}@{generation}"),
        metadata={
            "alias": config.alias,
            "generation": generation,
            "activeDigest": dataset_snapshot,
            "livePartition": live_partition("snapshot", dataset_snapshot),
            "existing": result.idempotent_retry,
            "approver": config.approver,
            "tombstoneWatermark": result.tombstone_watermark,
            "benchmarkFence": result.benchmark_fence,
        },
    )


snapshot_assets = [frozen_sources, dataset_snapshot, snapshot_diff, snapshot_alias]


class ReplayConfig(dg.Config):
    canary_bp: int = 1000
    comparator: str = EXACT
    tolerance: str | None = None


@dg.asset_check(
    asset=dataset_snapshot,
    description="Replay a fixed canary from the pinned sources; signed replay report.",
)
@refusals_fail
def snapshot_replay(
    config: ReplayConfig, relgate: RelgateResource, dataset_snapshot: str
) -> dg.AssetCheckResult:
    report = replay(
        relgate.workspace(),
        dataset_snapshot,
        canary_bp=config.canary_bp,
        comparator=Comparator.of(config.comparator, config.tolerance),
        actor=relgate.run_actor(),
    )
    comparator = report.comparator
    return dg.AssetCheckResult(
        passed=report.identical,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "result": report.result,
            "report": report.report_digest or "",
            "comparator": f"{comparator.name}@{comparator.version}",
            "tolerance": comparator.tolerance,
            "canaryBasisPoints": report.canary.basis_points,
            "expectedIds": report.expected_ids,
            "replayedIds": report.replayed_ids,
            "mismatchingIds": report.mismatching_ids,
            "missing": report.missing,
            "extra": report.extra,
            "replayHashExpected": report.replay_hashes.expected,
            "replayHashReplayed": report.replay_hashes.replayed,
            "examples": dg.MetadataValue.json(list(report.examples)),
        },
    )


snapshot_checks = [snapshot_validation]
#: Non-blocking: replay a canary after the build (run on demand or on a schedule).
replay_checks = [snapshot_replay]
