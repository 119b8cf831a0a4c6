"""`make demo`: seed the demo corpus and run the main jobs end to end through Dagster.

Runs against the persistent Dagster instance in $DAGSTER_HOME (var/dagster), so the
materializations, checks and lineage are there to browse with `make ui` afterwards:
snapshot -> validation -> alias, then release -> verification -> alias -> permit -> run.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import dagster as dg

from pipelines.definitions import defs
from relgate.demo.corpus import seed_demo
from relgate.snapshot.transforms import tag_transform
from relgate.workspace import Workspace

QUIET: dict[str, Any] = {"console": {"config": {"log_level": "INFO"}}}


def main() -> int:
    home = os.environ.get("RELGATE_HOME", "var/relgate")
    ws = Workspace.init(home)
    for tag in ("registry.local/normalize:v1", "registry.local/identity:v1"):
        tag_transform(ws.db, tag)
    if not ws.config.get("sources"):
        print("seeding demo corpus:", json.dumps(seed_demo(ws)), flush=True)
    instance = dg.DagsterInstance.get()
    snap = defs.resolve_job_def("snapshot_release_job").execute_in_process(
        instance=instance,
        run_config={
            "ops": {
                "snapshot_alias": {
                    "config": {
                        "alias": "default",
                        "approver": "demo-approver",
                        "comment": "make demo",
                    }
                }
            },
            "loggers": QUIET,
        },
    )
    if not snap.success:
        print("snapshot run failed", file=sys.stderr)
        return 1
    alias = snap.output_for_node("snapshot_alias")
    print(
        f"active snapshot for alias 'default' (generation {alias['generation']}): {alias['activeDigest']}"
    )

    purpose = ws.config["snapshot"]["purpose"]
    permit = {"alias": "default-release", "purpose": purpose, "world_size": 4}
    release = defs.resolve_job_def("release_job").execute_in_process(
        instance=instance,
        run_config={
            "ops": {
                "shard_release": {"config": {"records_per_shard": 200}},
                "release_alias": {
                    "config": {"alias": "default-release", "approver": "demo-approver"}
                },
                "gate_permit": {"config": permit},
                "pinned_run": {"config": permit},
            },
            "loggers": QUIET,
        },
    )
    if not release.success:
        print("release run failed", file=sys.stderr)
        return 1
    published = release.output_for_node("release_alias")
    run = release.output_for_node("pinned_run")
    print(
        f"published release for alias 'default-release' (generation {published['generation']}): {published['activeDigest']}"
    )
    print(
        f"run {run['runId']}: 4 worker processes passed the barrier on root {run['root']} (state {run['state']})"
    )
    dist = defs.resolve_job_def("distribution_job").execute_in_process(
        instance=instance,
        run_config={
            "ops": {
                "checkpoint_manifest": {
                    "config": {"model": "demo-lm", "version": "v1", "demo_megabytes": 192}
                },
                "checkpoint_distribution": {"config": {"hosts": 4, "racks": 2}},
            },
            "loggers": QUIET,
        },
    )
    if not dist.success:
        print("distribution run failed", file=sys.stderr)
        return 1
    event = dist.get_asset_materialization_events()[-1].materialization.metadata
    print(f"DistributionComplete: demo-lm/v1 ready on {event['ready_hosts'].value}")
    print(f"dagster runs recorded in {os.environ.get('DAGSTER_HOME')}; `make ui` shows the lineage")
    return gc_plan(instance)


def gc_plan(instance: dg.DagsterInstance) -> int:
    gc = defs.resolve_job_def("retention_plan_job").execute_in_process(
        instance=instance,
        run_config={"ops": {"retention_plan": {"config": {"grace": "0s"}}}, "loggers": QUIET},
    )
    if not gc.success:
        print("GC plan failed closed (see the run log)", file=sys.stderr)
        return 1
    plan = gc.output_for_node("retention_plan")
    print(
        f"GC plan (dry run, grace 0s): {plan['storedObjects']} stored objects, {plan['requiredObjects']} required"
    )
    for held in plan["retained"]:
        print(f"  keep {held['kind']} {held['digest']}: held by {', '.join(held['heldBy'])}")
    for cand in plan["candidates"]:
        print(f"  delete candidate {cand['key']}@{cand['versionId']}: {cand['reason']}")
    if not plan["candidates"]:
        print("  no deletion candidates: every stored object is referenced by a retained version")
    for reason, count in plan["excluded"].items():
        print(f"  not deletable ({reason}): {count}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
