"""Snapshot assets: frozen sources -> dataset snapshot (+ blocking validation) -> diff -> alias.

Each asset calls one core function and turns its typed result into Dagster output and
metadata; no snapshot rule is written here.
"""

import warnings
from collections.abc import Mapping, Sequence
from typing import Any

import dagster as dg

from relgate.records.record_schema import ID_COLUMN, RecordSchema
from relgate.snapshot import activation
from relgate.snapshot.build import BuildSpec, Frozen, build_for_alias, freeze
from relgate.snapshot.compare import shadow_diff
from relgate.snapshot.provenance import verify_provenance
from relgate.snapshot.validate import validate_snapshot
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


def _table(rows: Sequence[Mapping[str, object]]) -> dg.MetadataValue:
    if not rows:
        return dg.MetadataValue.md("_none_")
    columns = list(rows[0])
    lines = ["| " + " | ".join(columns) + " |", "|" + "---|" * len(columns)]
    lines += ["| " + " | ".join(str(r[c]) for c in columns) + " |" for r in rows]
    return dg.MetadataValue.md("\n".join(lines))


@dg.asset(
    group_name=GROUP,
    kinds={"iceberg", "s3"},
    description="Fence watermarks, then every source pinned to an exact version.",
)
def frozen_sources(relgate: RelgateResource) -> dg.Output[Json]:
    ws = relgate.workspace()
    frozen = freeze(ws, BuildSpec.from_config(ws.config))
    pins = [{"id": e.id, "kind": e.kind, "pin": e.label} for e in frozen.sources]
    return dg.Output(
        frozen.to_json(),
        metadata={
            "tombstoneWatermark": frozen.tombstone_watermark,
            "benchmarkFence": frozen.benchmark_fence,
            "transformImage": frozen.transform_image,
            "pins": _table(pins),
        },
    )


@dg.asset(
    group_name=GROUP,
    kinds={"parquet"},
    description="Signed training.dataset.snapshot.v1 manifest and membership table.",
)
def dataset_snapshot(
    context: dg.AssetExecutionContext,
    config: SnapshotConfig,
    relgate: RelgateResource,
    frozen_sources: Json,
) -> dg.Output[str]:
    ws = relgate.workspace()
    result = build_for_alias(
        ws,
        Frozen.parse(frozen_sources, what="frozen_sources"),
        alias=config.alias,
        actor=relgate.actor,
        purpose=config.purpose,
    )
    manifest = result.manifest
    context.log.info(f"snapshot {result.digest} members={manifest.member_count}")
    by_source = manifest.member_counts_by_source or {}
    provenance = verify_provenance(ws, result.digest)
    return dg.Output(
        result.digest,
        data_version=dg.DataVersion(result.digest),
        metadata={
            "digest": result.digest,
            "members": manifest.member_count,
            "tupleRoot": manifest.tuple_root,
            "membersUri": manifest.members.uri,
            "splits": _table(
                [{"split": k, "members": v} for k, v in sorted(manifest.splits.items())]
            ),
            "bySource": _table([{"source": k, "members": v} for k, v in sorted(by_source.items())]),
            "selection": _table([{"stage": k, "rows": v} for k, v in result.counts.items()]),
            "parents": dg.MetadataValue.json(list(manifest.parents)),
            "recordSchema": manifest.record_schema,
            "recordColumns": _record_columns(manifest.record_schema_document),
            "tokenRule": manifest.record_schema_document.tokens.kind,
            "provenanceDigest": provenance.statement_digest,
            "provenanceMaterials": provenance.materials,
        },
    )


def _record_columns(records: RecordSchema) -> dg.MetadataValue:
    """The declared record schema as a Dagster table (one row per column)."""
    roles = {c: "content" for c in records.content} | {ID_COLUMN: "id"}
    if records.label is not None:
        roles.setdefault(records.label, "label")
    return dg.MetadataValue.table(
        records=[
            dg.TableRecord(
                {
                    "column": f.name,
                    "type": f.type,
                    "nullable": f.nullable,
                    "role": roles.get(f.name, "attribute"),
                }
            )
            for f in records.fields
        ],
        schema=dg.TableSchema(
            columns=[
                dg.TableColumn("column", "string"),
                dg.TableColumn("type", "string"),
                dg.TableColumn("nullable", "bool"),
                dg.TableColumn("role", "string"),
            ]
        ),
    )


@dg.asset_check(
    asset=dataset_snapshot,
    blocking=True,
    description="Recompute from pinned sources; every zero-check must be zero.",
)
def snapshot_validation(relgate: RelgateResource, dataset_snapshot: str) -> dg.AssetCheckResult:
    report = validate_snapshot(relgate.workspace(), dataset_snapshot, actor=relgate.actor)
    return dg.AssetCheckResult(
        passed=report.ok,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "outcome": report.outcome,
            "report": report.report_digest or "",
            "checks": _table([{"check": k, "count": v} for k, v in report.checks.items()]),
            "problems": dg.MetadataValue.json(list(report.problems)),
        },
    )


@dg.asset(
    group_name=GROUP,
    description="Shadow comparison of the new snapshot with the alias's active version.",
)
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
            "splitMigrations": dg.MetadataValue.json(result.split_migrations),
            "bySource": _table([{"source": k, **v.to_json()} for k, v in result.by_source.items()]),
            "bySplit": _table([{"split": k, **v.to_json()} for k, v in result.by_split.items()]),
        },
    )


@dg.asset(
    group_name=GROUP,
    description="The alias, switched by CAS through the gate after a named approval.",
)
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
    )
    generation = result.generation
    context.log.info(f"alias {config.alias} generation {generation} -> {dataset_snapshot}")
    return dg.Output(
        result.to_json(),
        data_version=dg.DataVersion(f"{config.alias}@{generation}"),
        metadata={
            "alias": config.alias,
            "generation": generation,
            "activeDigest": dataset_snapshot,
            "approver": config.approver,
            "tombstoneWatermark": result.tombstone_watermark,
            "benchmarkFence": result.benchmark_fence,
        },
    )


snapshot_assets = [frozen_sources, dataset_snapshot, snapshot_diff, snapshot_alias]
snapshot_checks = [snapshot_validation]
