"""Checkpoint assets: a signed checkpoint manifest, and its distribution to a fleet.

The distribution asset launches the coordinator through Dagster Pipes (`relgate-agent
pipes`), which streams progress into the run log and reports the ready threshold as an
asset check and the ready hosts as metadata.
"""

import sys
import time
from typing import Any

import dagster as dg

from relgate.checkpoint.publish import (
    ENVELOPE_NAME,
    WebhookSink,
    checkpoint_root,
    free_port,
    list_checkpoints,
    local_fleet,
    new_fleet_label,
    publish_checkpoint,
    write_demo_checkpoint,
)
from resources.relgate import RelgateResource

GROUP = "checkpoints"


class CheckpointConfig(dg.Config):
    model: str = "demo-lm"
    version: str = "v1"
    source_dir: str = ""  # default: a synthetic bf16 safetensors checkpoint
    demo_megabytes: int = 192
    chunk_mb: int = 64
    block_mb: int = 4


class DistributionConfig(dg.Config):
    hosts: int = 4
    racks: int = 2
    ready_threshold: float = 1.0
    origin_cap_bytes_per_s: int = 0
    timeout_s: float = 600


@dg.asset(
    group_name=GROUP,
    kinds={"safetensors"},
    description="A checkpoint at an immutable origin with a signed, content-addressed manifest.",
)
def checkpoint_manifest(
    context: dg.AssetExecutionContext, config: CheckpointConfig, relgate: RelgateResource
) -> dg.Output[dict[str, Any]]:
    ws = relgate.workspace()
    existing = [
        c
        for c in list_checkpoints(ws)
        if (c["model"], c["version"]) == (config.model, config.version)
    ]
    if existing:
        found = existing[0]
        origin = checkpoint_root(ws) / config.model / config.version / "origin"
        out = {**found, "originUri": str(origin)}
        context.log.info(
            f"{config.model}/{config.version} already published: {found['manifestDigest']}"
        )
    else:
        source = config.source_dir
        if not source:
            source = str(ws.home / "demo-checkpoint" / config.version)
            context.log.info(
                f"writing a synthetic bf16 safetensors checkpoint: {write_demo_checkpoint(source, megabytes=config.demo_megabytes)}"
            )
        out = publish_checkpoint(
            ws,
            source,
            model=config.model,
            version=config.version,
            chunk_size=config.chunk_mb << 20,
            block_size=config.block_mb << 20,
        ).to_json()
    return dg.Output(
        out,
        data_version=dg.DataVersion(out["manifestDigest"]),
        metadata={
            "manifestDigest": out["manifestDigest"],
            "originUri": out["originUri"],
            "manifestUri": out["manifestUri"],
        },
    )


@dg.asset(
    group_name=GROUP,
    description="The checkpoint landed byte-exact on every host of a local fleet (coordinator via Dagster Pipes).",
    check_specs=[
        dg.AssetCheckSpec(
            "ready_threshold",
            asset="checkpoint_distribution",
            description="ready hosts / target hosts >= threshold",
        )
    ],
)
def checkpoint_distribution(
    context: dg.AssetExecutionContext,
    config: DistributionConfig,
    relgate: RelgateResource,
    pipes_subprocess_client: dg.PipesSubprocessClient,
    checkpoint_manifest: dict[str, Any],
) -> Any:
    ws = relgate.workspace()
    model, version = checkpoint_manifest["model"], checkpoint_manifest["version"]
    target = checkpoint_root(ws) / model / version
    address = f"127.0.0.1:{free_port()}"
    labels = new_fleet_label()  # the job targets exactly this run's agents
    sink = WebhookSink()
    try:
        with local_fleet(
            ws, hosts=config.hosts, racks=config.racks, coordinator=address, labels=labels
        ) as fleet:
            context.log.info(f"started {len(fleet)} agents: {[m['host'] for m in fleet]}")
            invocation = pipes_subprocess_client.run(
                command=[sys.executable, "-m", "relgate_agent.cli", "pipes"],
                context=context,
                extras={
                    "job": {
                        "model": model,
                        "version": version,
                        "manifest_uri": str(target / ENVELOPE_NAME),
                        "origin_uri": str(target / "origin"),
                        "target_selector": labels,
                        "origin_cap_bytes_per_s": config.origin_cap_bytes_per_s,
                        "ready_threshold": config.ready_threshold,
                        "webhook_url": sink.url,
                    },
                    "serve": {
                        "listen": address,
                        "db": str(ws.home / "coordinator.sqlite"),
                        "trusted_keys": ws.config["keys"]["trusted"],
                        "min_hosts": config.hosts,
                        "enroll": fleet,
                    },
                    "pki": str(ws.home / "pki"),
                    "poll_interval_s": 0.5,
                    "timeout_s": config.timeout_s,
                    "wait_for_all": True,
                },
            )
            results = invocation.get_results()
        deadline = time.monotonic() + 10
        while not sink.events and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        sink.close()
    if sink.events:
        context.log.info(f"DistributionComplete: {sink.events[0]}")
    else:
        context.log.warning("no DistributionComplete reached the deployer webhook")
    yield from results


checkpoint_assets = [checkpoint_manifest, checkpoint_distribution]
