"""Jobs and schedules."""

import dagster as dg
from dagster_celery import celery_executor

from assets.fence_hits import hit_evaluation
from relgate.gate.recheck import recheck
from relgate.gate.transitions import open_gate
from resources.relgate import RelgateResource

#: Every job but the celery one runs its steps in the run's own process: the steps are
#: light (a gate transaction, a signature, one shard's read) and a process per step cost a
#: UI-launched release job several times its in-process time.  Scale-out is the celery job's
#: (or Kubernetes', docs/deploy.md) per-step executor.
IN_PROCESS = dg.in_process_executor

#: Freeze, build and validate; the alias needs a named human approval, so it is not here.
snapshot_build_job = dg.define_asset_job(
    "snapshot_build_job",
    executor_def=IN_PROCESS,
    selection=dg.AssetSelection.assets("frozen_sources", "dataset_snapshot", "snapshot_diff"),
    description="Freeze fences and sources, build and validate a snapshot, diff it against the alias.",
)

release_job = dg.define_asset_job(
    "release_job",
    executor_def=IN_PROCESS,
    selection=dg.AssetSelection.groups("releases"),
    description="Write shards, verify them independently, publish, issue a permit and start a pinned run.",
)

#: The same assets on celery workers (a Redis broker, the S3 I/O manager, a workspace every
#: worker reaches): each step, one per shard included, is a task on the ``dagster`` queue.
#: Its run config is in docs/deploy.md; ``reconstructable_release_job_celery`` is the handle
#: ``dagster.execute_job`` needs from Python.
release_job_celery = dg.define_asset_job(
    "release_job_celery",
    selection=dg.AssetSelection.groups("releases"),
    executor_def=celery_executor,
    description="release_job on dagster-celery workers: shard verification fanned out per shard.",
)

distribution_job = dg.define_asset_job(
    "distribution_job",
    executor_def=IN_PROCESS,
    selection=dg.AssetSelection.groups("checkpoints"),
    description="Publish a signed checkpoint manifest and distribute it to the fleet.",
)

retention_plan_job = dg.define_asset_job(
    "retention_plan_job",
    executor_def=IN_PROCESS,
    selection=dg.AssetSelection.groups("lifecycle"),
    description="GC dry run: what is retained and by whom, what a sweep would delete and why.",
)

#: The whole path to an active alias (used by `make demo` with an approver in run config).
snapshot_release_job = dg.define_asset_job(
    "snapshot_release_job",
    executor_def=IN_PROCESS,
    selection=dg.AssetSelection.groups("snapshots"),
    description="Build, validate, diff, approve and activate a snapshot.",
)


class RecheckConfig(dg.Config):
    subjects: list[str]  # kind:digest
    fence: str
    watermark: int


@dg.op(description="Report fence hits per version; refuse hit candidates that are not active.")
def recheck_snapshots(
    context: dg.OpExecutionContext, config: RecheckConfig, relgate: RelgateResource
) -> None:
    ws = relgate.workspace()
    for subject in config.subjects:
        kind, digest = subject.split(":", 1)
        result = recheck(ws, kind, digest, actor=relgate.run_actor()).to_json()
        context.log_event(
            dg.AssetObservation(
                asset_key="dataset_snapshot" if kind == "snapshot" else "shard_release",
                metadata={
                    "digest": digest,
                    "state": result["state"],
                    "fence": config.fence,
                    "fenceWatermark": config.watermark,
                    "hits": dg.MetadataValue.json(result["hits"]),
                    "reactivatable": result["reactivatable"],
                    "closedPermits": dg.MetadataValue.json(result["closedPermits"]),
                },
            )
        )
        # the version's zero_fence_hits check turns red now, not at its next materialization
        hits = open_gate(ws).hits_for(digest)
        # on the pipeline asset, and on the version's own partition (assets.versions)
        for partition in (None, digest):
            evaluation = hit_evaluation(kind, digest, hits, partition=partition)
            # log_event records an AssetCheckEvaluation (dagster 1.13.27); its annotation omits it
            context.log_event(evaluation)  # type: ignore[arg-type]
        context.log.warning(
            f"snapshot {digest} hit by {config.fence} fence: {result['hits']} state={result['state']}"
        )


@dg.job(
    executor_def=IN_PROCESS,
    description="Re-check snapshots hit by a fence advance (launched by the fence sensors).",
)
def recheck_job() -> None:
    recheck_snapshots()
