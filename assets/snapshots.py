"""Snapshot assets: frozen sources -> dataset snapshot (+ blocking validation) -> diff -> alias."""

import warnings
from typing import Any

import dagster as dg

from relgate.snapshot import activation as lifecycle
from relgate.snapshot.build import BuildSpec, Frozen, build_snapshot, freeze
from relgate.snapshot.compare import diff
from relgate.snapshot.validate import validate_snapshot
from resources.relgate import RelgateResource

GROUP = "snapshots"

# Output(data_version=...) is marked beta; the digest-as-data-version contract is ours to keep.
warnings.filterwarnings("ignore", category=dg.BetaWarning)


class SnapshotConfig(dg.Config):
    alias: str = "default"
    purpose: str = ""


class AliasConfig(dg.Config):
    alias: str = "default"
    approver: str  # required: approval is a person's name bound to this exact digest
    comment: str = ""


def _table(rows: list[dict[str, Any]]) -> dg.MetadataValue:
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
def frozen_sources(
    context: dg.AssetExecutionContext, relgate: RelgateResource
) -> dg.Output[dict[str, Any]]:
    ws = relgate.workspace()
    frozen = freeze(ws, BuildSpec.from_config(ws.config))
    pins = []
    for entry in frozen.entries:
        pin = {
            k: v
            for k, v in entry.items()
            if k in ("id", "kind", "tableSnapshot", "cdcHighWatermark", "prefix")
        }
        if "objects" in entry:
            pin["objects"] = entry["objects"]["count"]
        pins.append(pin)
    return dg.Output(
        frozen.to_json() | {"started": frozen.started},
        metadata={
            "tombstoneWatermark": frozen.fences.tombstone_watermark,
            "benchmarkFence": frozen.fences.benchmark_fence,
            "transformImage": frozen.transform,
            "pins": _table(
                [
                    {
                        "id": p["id"],
                        "kind": p["kind"],
                        "pin": p.get("tableSnapshot")
                        or p.get("cdcHighWatermark")
                        or f"{p.get('objects')} objects",
                    }
                    for p in pins
                ]
            ),
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
    frozen_sources: dict[str, Any],
) -> dg.Output[str]:
    from relgate.gate.core import Fences

    ws = relgate.workspace()
    spec = BuildSpec.from_config(ws.config)
    if config.purpose:
        spec.purpose = config.purpose
    active = ws.gate().alias(config.alias, "snapshot").active_digest
    spec.parents = [active] if active else []
    frozen = Frozen(
        frozen_sources["buildId"],
        frozen_sources["started"],
        Fences(frozen_sources["tombstoneWatermark"], frozen_sources["benchmarkFence"]),
        frozen_sources["sources"],
        frozen_sources["transformImage"],
    )
    result = build_snapshot(ws, spec, actor=relgate.actor, frozen=frozen)
    body = result.manifest.body
    context.log.info(f"snapshot {result.digest} members={result.manifest.member_count}")
    return dg.Output(
        result.digest,
        data_version=dg.DataVersion(result.digest),
        metadata={
            "digest": result.digest,
            "members": result.manifest.member_count,
            "tupleRoot": result.manifest.tuple_root,
            "membersUri": body["members"]["uri"],
            "splits": _table(
                [{"split": k, "members": v} for k, v in sorted(body["splits"].items())]
            ),
            "bySource": _table(
                [
                    {"source": k, "members": v}
                    for k, v in sorted(body["memberCountsBySource"].items())
                ]
            ),
            "selection": _table([{"stage": k, "rows": v} for k, v in result.counts.items()]),
            "parents": dg.MetadataValue.json(body["parents"]),
        },
    )


@dg.asset_check(
    asset=dataset_snapshot,
    blocking=True,
    description="Recompute from pinned sources; every zero-check must be zero.",
)
def snapshot_validation(relgate: RelgateResource, dataset_snapshot: str) -> dg.AssetCheckResult:
    ws = relgate.workspace()
    report = validate_snapshot(ws, dataset_snapshot, actor=relgate.actor)
    return dg.AssetCheckResult(
        passed=report.ok,
        severity=dg.AssetCheckSeverity.ERROR,
        metadata={
            "outcome": report.outcome,
            "report": report.report_digest or "",
            "checks": _table([{"check": k, "count": v} for k, v in report.checks.items()]),
            "problems": dg.MetadataValue.json(report.problems),
        },
    )


@dg.asset(
    group_name=GROUP,
    description="Shadow comparison of the new snapshot with the alias's active version.",
)
def snapshot_diff(
    config: SnapshotConfig, relgate: RelgateResource, dataset_snapshot: str
) -> dg.Output[dict[str, Any]]:
    ws = relgate.workspace()
    active = ws.gate().alias(config.alias, "snapshot").active_digest
    if active is None or active == dataset_snapshot:
        result: dict[str, Any] = {
            "old": active,
            "new": dataset_snapshot,
            "note": "no earlier active version",
        }
        return dg.Output(result, metadata={"against": str(active)})
    result = diff(ws, active, dataset_snapshot)
    return dg.Output(
        result,
        metadata={
            "against": active,
            "additions": result["additions"],
            "deletions": result["deletions"],
            "contentChanges": result["contentChanges"],
            "splitMigrations": dg.MetadataValue.json(result["splitMigrations"]),
            "bySource": _table([{"source": k, **v} for k, v in result["bySource"].items()]),
            "bySplit": _table([{"split": k, **v} for k, v in result["bySplit"].items()]),
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
    snapshot_diff: dict[str, Any],
) -> dg.Output[dict[str, Any]]:
    ws = relgate.workspace()
    lifecycle.approve(ws, dataset_snapshot, approver=config.approver, comment=config.comment)
    result = lifecycle.activate(
        ws, dataset_snapshot, alias=config.alias, actor=config.approver
    ).to_json()
    context.log.info(
        f"alias {config.alias} generation {result['generation']} -> {dataset_snapshot}"
    )
    return dg.Output(
        result,
        data_version=dg.DataVersion(f"{config.alias}@{result['generation']}"),
        metadata={
            "alias": config.alias,
            "generation": result["generation"],
            "activeDigest": dataset_snapshot,
            "approver": config.approver,
            "tombstoneWatermark": result["tombstoneWatermark"],
            "benchmarkFence": result["benchmarkFence"],
        },
    )


snapshot_assets = [frozen_sources, dataset_snapshot, snapshot_diff, snapshot_alias]
snapshot_checks = [snapshot_validation]
