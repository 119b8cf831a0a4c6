"""Release assets: snapshot -> shard release -> verification report -> alias -> permit -> run."""

import re
import sys
import warnings
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, NamedTuple

import dagster as dg

# Pipes' error for a child that exited non-zero; dg does not export it (dagster pinned 1.13.27)
from dagster._core.errors import DagsterPipesExecutionError

from assets.failures import refusals_fail
from assets.ownership import OWNERS, tags_for
from assets.table_metadata import ROW_COUNT, typed_table
from assets.verification_results import (
    OUTCOME_CHECK,
    VERIFICATION_CHECKS,
    verification_results,
)
from assets.versions import live_partition, record_release_version
from relgate.release.evolution import load_stored
from relgate.release.publication import approve_release, publish
from relgate.release.verify.attest import verify_provenance
from relgate.release.verify.report import VerificationReport, failing_shards
from relgate.release.verify.verifier import shard_ids, verify_one_shard, verify_release
from relgate.release.verify.worker import ShardResult
from relgate.release.writer import write_release
from relgate.runs.admission import admit_run
from relgate.runs.store import run_status
from relgate.workspace import Workspace
from resources.relgate import RelgateResource

GROUP = "releases"
warnings.filterwarnings("ignore", category=dg.BetaWarning)


class ReleaseConfig(dg.Config):
    shard_mb: int = 256
    records_per_shard: int | None = None  # None: size by shard_mb


class PublishConfig(dg.Config):
    alias: str = "default-release"
    approver: str  # a person's name, bound to the root digest
    #: None: publish over whatever generation the alias is at; N: only from generation N (a
    #: re-run of that publication with the same root is a no-op, with another a conflict)
    expect_generation: int | None = None


class PermitConfig(dg.Config):
    """The admission: asked once, in ``gate_permit``; ``pinned_run`` runs what it admitted."""

    alias: str = "default-release"
    purpose: str = "demo-model-training"
    world_size: int = 4


class RankConfig(dg.Config):
    #: seconds each rank waits at the step-0 barrier for the others
    barrier_timeout: float = 60.0


@dg.asset(
    group_name=GROUP,
    owners=OWNERS,
    tags=tags_for(GROUP),
    kinds={"parquet"},
    description="Parquet shards under digest-addressed keys and a signed training.shard.release.v1 root,"
    " cut only from the approved and activated snapshot (never from a raw nightly build).",
)
@refusals_fail
def shard_release(
    context: dg.AssetExecutionContext,
    config: ReleaseConfig,
    relgate: RelgateResource,
    snapshot_alias: dict[str, Any],
) -> dg.Output[str]:
    ws = relgate.workspace()
    # The upstream is the activated snapshot; the writer re-checks its catalog state
    # (APPROVED or ACTIVE) itself, so a forged upstream value is refused as well.
    snapshot = str(snapshot_alias["activeDigest"])
    manifest = write_release(
        ws,
        snapshot,
        shard_mb=config.shard_mb,
        records_per_shard=config.records_per_shard,
        actor=relgate.run_actor(),
    )
    root = manifest
    return dg.Output(
        manifest.digest,
        data_version=dg.DataVersion(manifest.digest),
        metadata={
            "root": manifest.digest,
            "datasetSnapshot": manifest.snapshot,
            "shards": root.totals.shards,
            "records": root.totals.records,
            "tokens": root.totals.tokens,
            "bytes": root.totals.bytes,
            ROW_COUNT: root.totals.records,
            "orderedMemberTupleRoot": root.ordered_member_tuple_root,
            "writer": dg.MetadataValue.json(root.writer.to_json()),
        },
    )


class ShardRef(NamedTuple):
    """One fan-out step's shard: its position among the root's well-formed descriptors."""

    position: int
    shard_id: str


#: A Dagster mapping key is [A-Za-z0-9_]+; a shard id may hold other characters.
_NOT_KEY = re.compile(r"[^A-Za-z0-9_]")


@dg.op(
    out=dg.DynamicOut(ShardRef),
    description="The root's well-formed shard descriptors, in root order: one verify step each.",
)
@refusals_fail
def plan_shard_verification(
    relgate: RelgateResource, shard_release: str
) -> Iterator[dg.DynamicOutput[ShardRef]]:
    ws = relgate.workspace()
    for index, shard_id in enumerate(shard_ids(ws, shard_release)):
        # zero-padded: mapping keys sort, and collect, in root order
        key = f"s{index:05d}_{_NOT_KEY.sub('_', shard_id)}"[:100]
        yield dg.DynamicOutput(ShardRef(position=index, shard_id=shard_id), mapping_key=key)


@dg.op(description="Every per-shard check of one shard, from its exact object version.")
@refusals_fail
def verify_release_shard(
    relgate: RelgateResource, shard_release: str, shard: ShardRef
) -> ShardResult:
    return verify_one_shard(relgate.workspace(), shard_release, shard.position, shard.shard_id)


@dg.op(
    description="The reduce: multiset diff against the snapshot, tuple root and totals over"
    " every shard result; the signed report is recorded and the release state moves."
)
@refusals_fail
def reduce_shard_verification(
    relgate: RelgateResource, shard_release: str, results: list[ShardResult]
) -> dg.Output[dict[str, Any]]:
    ws = relgate.workspace()
    report = verify_release(
        ws, shard_release, workers=len(results), actor=relgate.run_actor(), results=results
    )
    body = report.to_json()
    counts = body.get("counts", {})
    summary = report.summary()
    shards, verified = int(str(summary["shards"])), int(str(summary["shardsVerified"]))
    provenance = verify_provenance(ws, shard_release) if report.provenance_digest else None
    return dg.Output(
        body,
        data_version=dg.DataVersion(str(body.get("reportDigest") or shard_release)),
        metadata={
            "root": shard_release,
            "outcome": str(body.get("outcome")),
            "shards": shards,
            "shardsVerified": verified,
            "verifiedRatio": dg.MetadataValue.float(verified / shards if shards else 0.0),
            "bytes": int(str(summary["bytes"])),
            ROW_COUNT: int(str(summary["records"])),
            **{f"count.{k}": int(v) for k, v in counts.items()},
            **_evolution_metadata(ws, shard_release),
            "provenanceDigest": provenance.statement_digest if provenance else "",
            "provenanceMaterials": provenance.materials if provenance else 0,
            "failingShards": dg.MetadataValue.md(
                "\n".join(f"- {f.line()}" for f in failing_shards(ws, report)) or "none"
            ),
        },
    )


@dg.graph_asset(
    group_name=GROUP,
    owners=OWNERS,
    tags=tags_for(GROUP),
    description="Independent verification report, signed and bound to the root digest: one"
    " step per shard (on any executor's workers), reduced by the verifier's multiset diff.",
)
def release_verification(shard_release: str) -> Any:
    results = plan_shard_verification(shard_release).map(
        lambda shard: verify_release_shard(shard_release, shard)
    )
    return reduce_shard_verification(shard_release, results.collect())


def _evolution_metadata(ws: Workspace, root: str) -> dict[str, Any]:
    """The stored schema-evolution report: change counts (numbers) and reader verdicts."""
    stored = load_stored(ws, root)
    if stored is None:
        return {"schemaEvolution": "none stored"}
    report, digest = stored
    verdicts = [
        dg.TableRecord({"reader": v.reader, "verdict": v.verdict, "reasons": "; ".join(v.reasons)})
        for v in report.readers
    ]
    return {
        "schemaEvolution.report": digest,
        "schemaEvolution.old": report.old.subject if report.old else "none",
        **{f"schemaEvolution.{k}": int(v) for k, v in report.counts.to_json().items()},
        "schemaEvolution.readers": dg.MetadataValue.table(
            verdicts,
            schema=dg.TableSchema(
                columns=[
                    dg.TableColumn("reader", "string"),
                    dg.TableColumn("verdict", "string"),
                    dg.TableColumn("reasons", "string"),
                ]
            ),
        ),
    }


@dg.multi_asset_check(
    specs=[
        *(
            dg.AssetCheckSpec(
                check.asset_check_name,
                asset="release_verification",
                blocking=True,
                description=f"{check.value} must be zero",
            )
            for check in VERIFICATION_CHECKS
        ),
        dg.AssetCheckSpec(
            OUTCOME_CHECK,
            asset="release_verification",
            blocking=True,
            description="the verification outcome must be VERIFIED",
        ),
    ],
)
@refusals_fail
def release_verification_checks(
    context: dg.AssetCheckExecutionContext,
    relgate: RelgateResource,
    release_verification: dict[str, Any],
) -> Iterator[dg.AssetCheckResult]:
    ws = relgate.workspace()
    report = VerificationReport.parse(release_verification, what="verification report")
    results = verification_results(ws, report)
    # the same evaluations, on this root's own partition of release_version
    record_release_version(context.op_execution_context, ws, report.root, results)
    yield from results


@dg.asset(
    group_name=GROUP,
    owners=OWNERS,
    tags=tags_for(GROUP),
    description="The release alias, switched by CAS through the gate after a named approval of the root.",
)
@refusals_fail
def release_alias(
    context: dg.AssetExecutionContext,
    config: PublishConfig,
    relgate: RelgateResource,
    shard_release: str,
    release_verification: dict[str, Any],
) -> dg.Output[dict[str, Any]]:
    ws = relgate.workspace()
    approval = approve_release(ws, shard_release, approver=config.approver, comment="dagster")
    change = publish(
        ws,
        shard_release,
        alias=config.alias,
        actor=config.approver,
        expected_generation=config.expect_generation,
    )
    result = change.to_json()
    if change.idempotent_retry:
        context.log.info(f"alias {config.alias} already publishes {shard_release}: unchanged")
    return dg.Output(
        result,
        data_version=dg.DataVersion(f"{config.alias}@{result['generation']}"),
        metadata={
            "alias": config.alias,
            "generation": result["generation"],
            "root": shard_release,
            "livePartition": live_partition("release", shard_release),
            "approver": approval.approver,
            "existing": change.idempotent_retry,
        },
    )


@dg.asset(
    group_name=GROUP,
    owners=OWNERS,
    tags=tags_for(GROUP),
    description="A gate permit and the run it admits: the alias resolved exactly once, the root recorded in the run.",
)
@refusals_fail
def gate_permit(
    config: PermitConfig, relgate: RelgateResource, release_alias: dict[str, Any]
) -> dg.Output[dict[str, Any]]:
    ws = relgate.workspace()
    run = admit_run(
        ws,
        alias=config.alias,
        purpose=config.purpose,
        world_size=config.world_size,
        actor=relgate.run_actor(),
    ).to_json()
    return dg.Output(
        run,
        metadata={
            "runId": run["runId"],
            "permit": run["permit"],
            "root": run["rootDigest"],
            "generation": run["generation"],
            "worldSize": run["worldSize"],
        },
    )


#: One rank as a Pipes child (``pipelines/rank_pipes.py``), run from the project directory
#: (the code location's working directory) so ``pipelines`` imports as Dagster loads it.
RANK_COMMAND = [sys.executable, "-m", "pipelines.rank_pipes"]
PROJECT_DIR = Path(__file__).resolve().parents[1]


def _rank_rows(invocations: dict[int, dg.PipesClientCompletedInvocation]) -> list[dict[str, Any]]:
    """One row per rank from its ``RankResult`` custom message (rank, exit, shards, wait)."""
    rows = []
    for rank, invocation in sorted(invocations.items()):
        for message in invocation.get_custom_messages():
            if not isinstance(message, dict):
                continue
            reported = message.get("result")
            result: dict[str, Any] = reported if isinstance(reported, dict) else {}
            shards = result.get("shardDigests")
            rows.append(
                {
                    "rank": rank,
                    "exitCode": int(message.get("exitCode", -1)),
                    "shards": len(shards) if isinstance(shards, list) else 0,
                    "barrierWaitSeconds": float(result.get("barrierWaitSeconds", 0.0)),
                    "state": str(result.get("state", "")),
                }
            )
    return rows


RANK_COLUMNS = [
    ("rank", "int"),
    ("exitCode", "int"),
    ("shards", "int"),
    ("barrierWaitSeconds", "float"),
    ("state", "string"),
]


@dg.asset(
    group_name=GROUP,
    owners=OWNERS,
    tags=tags_for(GROUP),
    description="One worker process per rank (Dagster Pipes) verifies its shards; step 0 only"
    " when every rank agrees on the root.",
)
@refusals_fail
def pinned_run(
    context: dg.AssetExecutionContext,
    config: RankConfig,
    relgate: RelgateResource,
    gate_permit: dict[str, Any],
) -> dg.Output[dict[str, Any]]:
    ws = relgate.workspace()
    run_id = gate_permit["runId"]
    world = int(gate_permit["worldSize"])
    client = dg.PipesSubprocessClient(cwd=str(PROJECT_DIR), env={"RELGATE_HOME": str(ws.home)})
    # Every rank waits at the barrier for the others: they run at once, one Pipes session each.
    with ThreadPoolExecutor(max_workers=world, thread_name_prefix="rank") as pool:
        futures = {
            rank: pool.submit(
                client.run,
                context=context,
                command=RANK_COMMAND,
                extras={"run": run_id, "rank": rank, "barrier_timeout": config.barrier_timeout},
            )
            for rank in range(world)
        }
        invocations, failed = {}, []
        for rank, future in futures.items():
            try:
                invocations[rank] = future.result(timeout=config.barrier_timeout + 120)
            # a rank that exits non-zero (3: a refusal, named in its message) or never ends;
            # anything else is a bug here and fails the step as itself
            except (DagsterPipesExecutionError, TimeoutError) as exc:
                failed.append(f"rank {rank}: {type(exc).__name__}: {exc}")
    if failed:
        raise dg.Failure(f"ranks failed before step 0: {'; '.join(failed)}")
    status = run_status(ws.db, run_id)
    reports = [{k: str(v) for k, v in r.model_dump(mode="json").items()} for r in status.reports]
    return dg.Output(
        {"runId": run_id, "state": status.state, "root": status.root_digest},
        metadata={
            "runId": run_id,
            "state": status.state,
            "root": status.root_digest,
            "ranks": len(invocations),
            "ranksReported": len(reports),
            "rankResults": typed_table(_rank_rows(invocations), RANK_COLUMNS),
            "reports": typed_table(reports),
        },
    )


release_assets = [shard_release, release_verification, release_alias, gate_permit, pinned_run]
release_checks = [release_verification_checks]
