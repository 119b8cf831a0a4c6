"""`make demo`: seed the demo corpus and run the main jobs end to end through Dagster.

Runs against the persistent Dagster instance in $DAGSTER_HOME (var/dagster), so the
materializations, checks and lineage are there to browse with `make ui` afterwards:
snapshot -> validation -> alias, then release -> verification -> alias -> permit -> run,
then checkpoint -> distribution, and a GC dry run.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import dagster as dg

from pipelines.definitions import defs
from pipelines.pg_instance import use_pg_url
from relgate.demo.corpus import seed_demo, tag_demo_transforms
from relgate.workspace import Workspace

#: The demo prints what happened itself; Dagster's console shows errors only (every event
#: is in the run log, `make ui`).
QUIET: dict[str, object] = {"console": {"config": {"log_level": "ERROR"}}}
WORLD_SIZE = 4
MIB = 1 << 20


def _execute(
    instance: dg.DagsterInstance, job: str, ops: dict[str, object]
) -> dg.ExecuteInProcessResult | None:
    """Run one job of the code location in process; None (after saying so) if it failed."""
    result = defs.resolve_job_def(job).execute_in_process(
        instance=instance, run_config={"ops": ops, "loggers": QUIET}, raise_on_error=False
    )
    if not result.success:
        for event in result.all_events:
            if event.is_step_failure and event.step_failure_data is not None:
                error = event.step_failure_data.error
                cause = error.cause if error is not None and error.cause is not None else error
                message = cause.message.strip() if cause is not None else "failed"
                print(f"{job}: step {event.step_key} failed: {message}", file=sys.stderr)
        print(f"{job} failed (see the run log)", file=sys.stderr)
        return None
    return result


def _metadata(result: dg.ExecuteInProcessResult, node: str) -> dict[str, Any]:
    """The values of the last materialization ``node`` reported in this run."""
    events = result.asset_materializations_for_node(node)
    return {k: v.value for k, v in events[-1].metadata.items()} if events else {}


def _checks(result: dg.ExecuteInProcessResult) -> str:
    evaluations = result.get_asset_check_evaluations()
    passed = sum(1 for e in evaluations if e.passed)
    return f"{passed}/{len(evaluations)} checks passed"


def _unchanged(existing: object) -> str:
    return " (unchanged input: the existing digest)" if existing else ""


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
    built = _metadata(snap, "dataset_snapshot")
    print(
        f"snapshot {built['digest']}: {built['members']} members{_unchanged(built['existing'])},"
        f" validation {_checks(snap)}"
    )
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
        },
    )
    if release is None:
        return False
    shards = _metadata(release, "shard_release")
    report = release.output_for_node("release_verification")
    published = release.output_for_node("release_alias")
    run = release.output_for_node("pinned_run")
    print(
        f"release {shards['root']}: {shards['shards']} shards, {shards['records']} records;"
        f" verification {report['outcome']}, {_checks(release)}{_unchanged(published['idempotentRetry'])}"
    )
    print(
        f"published release for alias 'default-release' (generation {published['generation']}): {published['activeDigest']}"
    )
    print(
        f"run {run['runId']}: {WORLD_SIZE} worker processes passed the barrier on root {run['root']} (state {run['state']})"
    )
    return True


@contextlib.contextmanager
def _stderr_to(path: Path) -> Iterator[None]:
    """Send this process's stderr (fd 2, which subprocesses inherit) to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with path.open("ab") as log:
            os.dup2(log.fileno(), 2)
        yield
    finally:
        sys.stderr.flush()
        os.dup2(saved, 2)
        os.close(saved)


def distribution(instance: dg.DagsterInstance, home: Path) -> bool:
    # The coordinator (the Pipes process) logs every step to stderr, as the agents log to
    # fleet/host-*/agent.log: its log goes beside theirs.
    log = home / "fleet" / "coordinator.log"
    with _stderr_to(log):
        dist = _execute(
            instance,
            "distribution_job",
            {
                "checkpoint_manifest": _config(model="demo-lm", version="v1", demo_megabytes=192),
                "checkpoint_distribution": _config(hosts=4, racks=2),
            },
        )
    if dist is None:
        print(f"distribution_job failed: coordinator log {log}", file=sys.stderr)
        return False
    done = _metadata(dist, "checkpoint_distribution")
    print(
        f"DistributionComplete: demo-lm/v1 ready on {done['hosts_ready']}/{done['hosts_total']}"
        f" hosts {done['ready_hosts']}; {done['bytes_moved'] / MIB:.0f} MiB moved,"
        f" {done['origin_bytes'] / MIB:.0f} MiB from the origin"
        f" ({done['checkpoint_bytes'] / MIB:.0f} MiB checkpoint)"
    )
    return True


def gc_plan(instance: dg.DagsterInstance) -> bool:
    gc = _execute(instance, "retention_plan_job", {"retention_plan": _config(grace="0s")})
    if gc is None:
        print("GC plan failed closed (see the run log)", file=sys.stderr)
        return False
    plan = gc.output_for_node("retention_plan")
    print(
        f"GC plan (dry run, grace 0s): {plan['storedObjects']} stored objects,"
        f" {plan['requiredObjects']} of them required, deletion candidates:"
        f" {plan['candidateCount']}; {plan['rawSourceObjects']} raw-source objects kept outside"
        " the managed store"
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
    # Dagster's preview/beta notices (Pipes internals, data versions) are not the demo's news.
    warnings.filterwarnings("ignore", category=dg.PreviewWarning)
    warnings.filterwarnings("ignore", category=dg.BetaWarning)
    ws = Workspace.init(os.environ.get("RELGATE_HOME", "var/relgate"))
    tag_demo_transforms(ws)
    if not ws.config.get("sources"):
        print("seeding demo corpus:", json.dumps(seed_demo(ws).to_json()), flush=True)
    purpose = str(ws.config["snapshot"]["purpose"])
    use_pg_url()  # dagster.postgres.yaml reads DAGSTER_PG_URL: the psycopg2 driver
    instance = dg.DagsterInstance.get()
    ok = (
        snapshots(instance)
        and releases(instance, purpose)
        and distribution(instance, Path(ws.home))
    )
    if ok:
        print(
            f"dagster runs recorded in {os.environ.get('DAGSTER_HOME')}; `make ui` shows the lineage"
        )
    return 0 if ok and gc_plan(instance) else 1


if __name__ == "__main__":
    sys.exit(main())
