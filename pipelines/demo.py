"""`make demo`: seed the demo corpus and run the main jobs end to end through Dagster.

Runs against the persistent Dagster instance in $DAGSTER_HOME (var/dagster), so the
materializations, checks and lineage are there to browse with `make ui` afterwards:
snapshot -> validation -> alias, then release -> verification -> alias -> permit -> run,
then checkpoint -> distribution, and a GC dry run.
"""

from __future__ import annotations

import json
import os
import sys

import dagster as dg

from pipelines.definitions import defs
from pipelines.pg_instance import use_pg_url
from relgate.demo.corpus import seed_demo, tag_demo_transforms
from relgate.workspace import Workspace

QUIET: dict[str, object] = {"console": {"config": {"log_level": "INFO"}}}
WORLD_SIZE = 4


def _execute(
    instance: dg.DagsterInstance, job: str, ops: dict[str, object]
) -> dg.ExecuteInProcessResult | None:
    """Run one job of the code location in process; None (after saying so) if it failed."""
    result = defs.resolve_job_def(job).execute_in_process(
        instance=instance, run_config={"ops": ops, "loggers": QUIET}, raise_on_error=False
    )
    if not result.success:
        print(f"{job} failed (see the run log)", file=sys.stderr)
        return None
    return result


def _config(**values: object) -> dict[str, object]:
    return {"config": values}


def snapshots(instance: dg.DagsterInstance) -> bool:
    snap = _execute(
        instance,
        "snapshot_release_job",
        {"snapshot_alias": _config(alias="default", approver="demo-approver", comment="make demo")},
    )
    if snap is None:
        return False
    alias = snap.output_for_node("snapshot_alias")
    print(
        f"active snapshot for alias 'default' (generation {alias['generation']}): {alias['activeDigest']}"
    )
    return True


def releases(instance: dg.DagsterInstance, purpose: str) -> bool:
    permit = {"alias": "default-release", "purpose": purpose, "world_size": WORLD_SIZE}
    release = _execute(
        instance,
        "release_job",
        {
            "shard_release": _config(records_per_shard=200),
            "release_alias": _config(alias="default-release", approver="demo-approver"),
            "gate_permit": _config(**permit),
            "pinned_run": _config(**permit),
        },
    )
    if release is None:
        return False
    published = release.output_for_node("release_alias")
    run = release.output_for_node("pinned_run")
    print(
        f"published release for alias 'default-release' (generation {published['generation']}): {published['activeDigest']}"
    )
    print(
        f"run {run['runId']}: {WORLD_SIZE} worker processes passed the barrier on root {run['root']} (state {run['state']})"
    )
    return True


def distribution(instance: dg.DagsterInstance) -> bool:
    dist = _execute(
        instance,
        "distribution_job",
        {
            "checkpoint_manifest": _config(model="demo-lm", version="v1", demo_megabytes=192),
            "checkpoint_distribution": _config(hosts=4, racks=2),
        },
    )
    if dist is None:
        return False
    event = dist.get_asset_materialization_events()[-1].materialization.metadata
    print(f"DistributionComplete: demo-lm/v1 ready on {event['ready_hosts'].value}")
    return True


def gc_plan(instance: dg.DagsterInstance) -> bool:
    gc = _execute(instance, "retention_plan_job", {"retention_plan": _config(grace="0s")})
    if gc is None:
        print("GC plan failed closed (see the run log)", file=sys.stderr)
        return False
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
    return True


def main() -> int:
    ws = Workspace.init(os.environ.get("RELGATE_HOME", "var/relgate"))
    tag_demo_transforms(ws)
    if not ws.config.get("sources"):
        print("seeding demo corpus:", json.dumps(seed_demo(ws).to_json()), flush=True)
    purpose = str(ws.config["snapshot"]["purpose"])
    use_pg_url()  # dagster.postgres.yaml reads DAGSTER_PG_URL: the psycopg2 driver
    instance = dg.DagsterInstance.get()
    ok = snapshots(instance) and releases(instance, purpose) and distribution(instance)
    if ok:
        print(
            f"dagster runs recorded in {os.environ.get('DAGSTER_HOME')}; `make ui` shows the lineage"
        )
    return 0 if ok and gc_plan(instance) else 1


if __name__ == "__main__":
    sys.exit(main())
