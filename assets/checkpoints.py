"""Checkpoint assets: a signed checkpoint manifest, and its distribution to a fleet.

Each asset calls one core function.  The distribution asset runs the coordinator job through
Dagster Pipes (``relgate-agent pipes``) with the extras the core's distribution session
built, which streams progress into the run log and reports the ready threshold as an asset
check and the ready hosts as metadata.
"""

import sys
from collections.abc import Iterator

import dagster as dg

from assets.failures import refusals_fail
from assets.ownership import OWNERS, tags_for
from relgate.checkpoint.distribute import DistributionRequest, distribution_session
from relgate.checkpoint.publish import PublishedCheckpoint
from relgate.demo.checkpoint import DemoCheckpointRequest, publish_demo_checkpoint
from relgate.runs.store import get_run
from resources.fleet import FleetResource
from resources.relgate import RelgateResource

GROUP = "checkpoints"
PIPES_COMMAND = [sys.executable, "-m", "relgate_agent.cli", "pipes"]


class CheckpointConfig(dg.Config):
    model: str = "demo-lm"
    version: str = "v1"
    source_dir: str = ""  # default: a synthetic bf16 safetensors checkpoint
    demo_megabytes: int = 192
    chunk_mb: int = 64
    block_mb: int = 4
    #: the training run this checkpoint came from (its exact root becomes the lineage)
    trained_on_run: str | None = None


class DistributionConfig(dg.Config):
    hosts: int = 4
    racks: int = 2
    dcs: int = 1  # data centers the racks are split into (DC 0 holds the origin)
    ready_threshold: float = 1.0
    origin_cap_bytes_per_s: int = 0
    timeout_s: float = 600


@dg.asset(
    group_name=GROUP,
    owners=OWNERS,
    tags=tags_for(GROUP),
    kinds={"safetensors"},
    deps=["pinned_run"],
    description="A checkpoint at an immutable origin with a signed, content-addressed manifest;"
    " its lineage runs from the training run it declares (trained_on_run) and that run's root.",
)
@refusals_fail
def checkpoint_manifest(
    context: dg.AssetExecutionContext, config: CheckpointConfig, relgate: RelgateResource
) -> dg.Output[PublishedCheckpoint]:
    request = DemoCheckpointRequest(
        model=config.model,
        version=config.version,
        source_dir=config.source_dir,
        demo_megabytes=config.demo_megabytes,
        chunk_size=config.chunk_mb << 20,
        block_size=config.block_mb << 20,
    )
    ws = relgate.workspace()
    # the declared run must exist (a refusal otherwise): its root is what was trained on
    trained = get_run(ws.db, config.trained_on_run) if config.trained_on_run else None
    published = publish_demo_checkpoint(ws, request, log=context.log.info)
    lineage = (
        {
            "trainedOnRun": trained.run_id,
            "trainedOnRoot": trained.root_digest,
            "trainedOnAlias": trained.alias,
            "trainedOnPurpose": trained.purpose,
        }
        if trained is not None
        else {}
    )
    return dg.Output(
        published,
        data_version=dg.DataVersion(published.manifest_digest),
        metadata={
            "manifestDigest": published.manifest_digest,
            "originUri": published.origin_uri,
            "manifestUri": published.manifest_uri,
            **lineage,
        },
    )


@dg.asset(
    group_name=GROUP,
    owners=OWNERS,
    tags=tags_for(GROUP),
    description="The checkpoint landed byte-exact on every host of the fleet (coordinator via"
    " Dagster Pipes): the running fleet the fleet resource names, else a local fleet.",
    check_specs=[
        dg.AssetCheckSpec(
            "ready_threshold",
            asset="checkpoint_distribution",
            description="ready hosts / target hosts >= threshold",
        )
    ],
)
@refusals_fail
def checkpoint_distribution(
    context: dg.AssetExecutionContext,
    config: DistributionConfig,
    relgate: RelgateResource,
    pipes_subprocess_client: dg.PipesSubprocessClient,
    fleet: FleetResource,
    checkpoint_manifest: PublishedCheckpoint,
) -> Iterator[dg.MaterializeResult[object] | dg.AssetCheckResult]:
    request = DistributionRequest(
        model=checkpoint_manifest.model,
        version=checkpoint_manifest.version,
        hosts=config.hosts,
        racks=config.racks,
        dcs=config.dcs,
        ready_threshold=config.ready_threshold,
        origin_cap_bytes_per_s=config.origin_cap_bytes_per_s,
        timeout_s=config.timeout_s,
        fleet=fleet.service(),
    )
    with distribution_session(relgate.workspace(), request) as session:
        if session.job.coordinator:
            context.log.info(
                f"job on the running fleet at {session.job.coordinator}"
                f" (selector {session.job.job.target_selector!r})"
            )
        else:
            context.log.info(
                f"started {len(session.fleet)} agents: {[m.host for m in session.fleet]}"
            )
        results = pipes_subprocess_client.run(
            command=PIPES_COMMAND, context=context, extras=session.job.to_extras()
        ).get_results()
        event = session.await_complete()
    if event is not None:
        context.log.info(f"DistributionComplete: {event}")
    elif session.job.coordinator:
        context.log.info("DistributionComplete goes to the fleet's webhook, not to this run")
    else:
        context.log.warning("no DistributionComplete reached the deployer webhook")
    yield from results


checkpoint_assets = [checkpoint_manifest, checkpoint_distribution]
