"""`make demo`: seed the demo corpus and run the main jobs end to end through Dagster.

Runs against the persistent Dagster instance in $DAGSTER_HOME (var/dagster), so the
materializations, checks and lineage are there to browse with `make ui` afterwards:
snapshot -> validation -> alias, then release -> verification -> alias -> permit -> run,
then checkpoint -> distribution, and a GC dry run.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import sys
import warnings
from datetime import UTC, datetime, timedelta
from typing import Any

import dagster as dg

from pipelines.definitions import defs
from pipelines.launch import CodeLocationRuns, LaunchedRun, LaunchError
from relgate.demo.corpus import seed_demo, tag_demo_transforms
from relgate.workspace import Workspace

#: The demo prints what happened itself; Dagster's console shows errors only (every event
#: is in the run log, `make ui`).
QUIET: dict[str, object] = {"console": {"config": {"log_level": "ERROR"}}}
WORLD_SIZE = 4
MIB = 1 << 20


def _execute(
    runs: CodeLocationRuns,
    job: str,
    ops: dict[str, object],
    tags: dict[str, str] | None = None,
) -> LaunchedRun | None:
    """Launch one job of the code location and await it; None (after saying so) if it failed."""
    try:
        result = runs.launch(job, {"ops": ops, "loggers": QUIET}, tags)
    except LaunchError as exc:
        print(f"{job}: {exc}", file=sys.stderr)
        return None
    if not result.success:
        for step, message in result.step_failures():
            print(f"{job}: step {step} failed: {message}", file=sys.stderr)
        print(f"{job} failed: run {result.run_id} (`make ui` shows its log)", file=sys.stderr)
        return None
    return result


def _value(run: LaunchedRun, asset: str) -> Any:
    """The value ``asset`` holds after ``run`` (through the code location's I/O manager)."""
    # the I/O manager announces each load at DEBUG on a console logger of its own (on
    # stderr): not the demo's news
    with contextlib.redirect_stderr(io.StringIO()):
        return defs.load_asset_value(asset, instance=run.instance)


def _checks(result: LaunchedRun) -> str:
    evaluations = result.check_evaluations()
    passed = sum(1 for e in evaluations if e.passed)
    return f"{passed}/{len(evaluations)} checks passed"


def _unchanged(existing: object) -> str:
    return " (unchanged input: the existing digest)" if existing else ""


def _config(**values: object) -> dict[str, object]:
    return {"config": values}


def snapshots(runs: CodeLocationRuns) -> bool:
    snap = _execute(
        runs,
        "snapshot_release_job",
        {"snapshot_alias": _config(alias="default", approver="demo-approver", comment="make demo")},
    )
    if snap is None:
        return False
    built = snap.metadata("dataset_snapshot")
    print(
        f"snapshot {built['digest']}: {built['members']} members{_unchanged(built['existing'])},"
        f" validation {_checks(snap)}"
    )
    alias = _value(snap, "snapshot_alias")
    print(
        f"active snapshot for alias 'default' (generation {alias['generation']}): {alias['activeDigest']}"
    )
    return True


def releases(runs: CodeLocationRuns, purpose: str, records_per_shard: int = 200) -> bool:
    permit = {"alias": "default-release", "purpose": purpose, "world_size": WORLD_SIZE}
    release = _execute(
        runs,
        "release_job",
        {
            "shard_release": _config(records_per_shard=records_per_shard),
            "release_alias": _config(alias="default-release", approver="demo-approver"),
            "gate_permit": _config(**permit),
        },
    )
    if release is None:
        return False
    shards = release.metadata("shard_release")
    report = _value(release, "release_verification")
    published = _value(release, "release_alias")
    run = _value(release, "pinned_run")
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


def distribution(runs: CodeLocationRuns) -> bool:
    # The coordinator (the Pipes process) logs every step to the step's stderr, which the
    # run's compute log keeps (`make ui`, the step's stderr); the agents log to
    # fleet/host-*/agent.log.
    dist = _execute(
        runs,
        "distribution_job",
        {
            "checkpoint_manifest": _config(model="demo-lm", version="v1", demo_megabytes=192),
            "checkpoint_distribution": _config(hosts=4, racks=2),
        },
    )
    if dist is None:
        return False
    done = dist.metadata("checkpoint_distribution")
    print(
        f"DistributionComplete: demo-lm/v1 ready on {done['hostsReady']}/{done['hostsTotal']}"
        f" hosts {done['readyHosts']}; {done['bytesMoved'] / MIB:.0f} MiB moved,"
        f" {done['originBytes'] / MIB:.0f} MiB from the origin"
        f" ({done['checkpointBytes'] / MIB:.0f} MiB checkpoint)"
    )
    return True


def gc_plan(runs: CodeLocationRuns) -> bool:
    gc = _execute(runs, "retention_plan_job", {"retention_plan": _config(grace="0s")})
    if gc is None:
        print("GC plan failed closed (see the run log)", file=sys.stderr)
        return False
    plan = _value(gc, "retention_plan")
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


def nightly(runs: CodeLocationRuns) -> bool:
    """Last night's partition, so the nightly asset's partition bar is not all grey."""
    night = (datetime.now(UTC) - timedelta(days=1)).strftime("%Y-%m-%d")
    built = _execute(runs, "nightly_snapshot_job", {}, tags={"dagster/partition": night})
    if built is None:
        return False
    meta = built.metadata("nightly_snapshot")
    print(f"nightly {night}: snapshot {meta['digest']}, validation {meta['validation']}")
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
    with dg.DagsterInstance.get() as instance, CodeLocationRuns(instance) as runs:
        ok = snapshots(runs) and releases(runs, purpose) and distribution(runs) and nightly(runs)
        if ok:
            print(
                f"dagster runs recorded in {os.environ.get('DAGSTER_HOME')}; `make ui` shows"
                " them under their jobs, with the lineage"
            )
        return 0 if ok and gc_plan(runs) else 1


if __name__ == "__main__":
    sys.exit(main())
