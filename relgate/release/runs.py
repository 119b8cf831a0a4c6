"""Training runs pinned to one root: admission, assignment, per-rank workers, the barrier.

``create_run`` resolves the alias exactly once, inside the gate transaction that also
issues the permit, and writes the root digest into the run.  From then on nothing reads
the alias again: workers, scale-out and recovery use the run's root.  Each rank verifies
its assigned shards from their exact object versions and reports
``(runId, rootDigest, shardDigests)``; step 0 begins only when every rank of the current
assignment epoch reported the same root with every shard verified, the permit is still
open, and the barrier did not time out (a timeout fails the run before step 0).
"""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection

from relgate.catalog.db import Database, execute, one, rows, utcnow
from relgate.errors import (
    ConflictError,
    IntegrityError,
    NotFoundError,
    RejectedError,
    RelgateError,
    UsageError,
)
from relgate.permits import acquire
from relgate.release import manifest as rm
from relgate.release import metrics as release_metrics
from relgate.release.catalog import get_release
from relgate.workspace import Workspace


def assign(shard_ids: list[str], world_size: int) -> dict[int, list[str]]:
    """Round-robin by shard index: rank k gets shards k, k+W, k+2W, ..."""
    return {rank: shard_ids[rank::world_size] for rank in range(world_size)}


def _write_assignment(
    conn: Connection, run_id: str, epoch: int, shard_ids: list[str], world_size: int
) -> None:
    for rank, shards in assign(shard_ids, world_size).items():
        execute(
            conn,
            "INSERT INTO run_assignments (run_id, epoch, rank, shards) VALUES (:r, :e, :k, :s)",
            {"r": run_id, "e": epoch, "k": rank, "s": json.dumps(shards)},
        )


def create_run(
    ws: Workspace, *, alias: str, purpose: str, world_size: int, actor: str
) -> dict[str, Any]:
    if world_size < 1:
        raise UsageError("world size must be at least 1", object="run", check="world-size")
    run_id = "run-" + uuid.uuid4().hex[:12]
    with ws.db.gate_tx() as conn:
        permit = acquire(conn, alias=alias, purpose=purpose)
        root = permit["root_digest"]
        release = one(conn, "SELECT envelope_version FROM releases WHERE digest = :d", {"d": root})
        assert release is not None
        now = utcnow()
        execute(
            conn,
            "INSERT INTO runs (run_id, alias, root_digest, permit_id, purpose, world_size, assignment_epoch,"
            " barrier_epoch, state, created_at, updated_at)"
            " VALUES (:r, :a, :root, :p, :purpose, :w, 0, -1, 'CREATED', :now, :now)",
            {
                "r": run_id,
                "a": alias,
                "root": root,
                "p": permit["permit_id"],
                "purpose": purpose,
                "w": world_size,
                "now": now,
            },
        )
    manifest = rm.load(ws.store, ws.trusted_keys, root, release["envelope_version"])
    with ws.db.tx() as conn:
        _write_assignment(conn, run_id, 0, [s["id"] for s in manifest.shards], world_size)
    return {
        "runId": run_id,
        "rootDigest": root,
        "permit": permit["permit_id"],
        "worldSize": world_size,
        "alias": alias,
        "generation": permit["generation"],
        "actor": actor,
    }


def get_run(db: Database, run_id: str) -> dict[str, Any]:
    with db.tx() as conn:
        row = one(conn, "SELECT * FROM runs WHERE run_id = :r", {"r": run_id})
    if row is None:
        raise NotFoundError("unknown run", object=run_id, check="exists")
    return row


def rescale(ws: Workspace, run_id: str, world_size: int) -> dict[str, Any]:
    """Scale-out or recovery: a new assignment epoch over the same root; the alias is not read."""
    run = get_run(ws.db, run_id)
    if run["state"] == "FAILED":
        raise RejectedError(
            "run failed; create a new run",
            object=run_id,
            check="run-state",
            digest=run["root_digest"],
        )
    manifest = rm.load(
        ws.store,
        ws.trusted_keys,
        run["root_digest"],
        get_release(ws.db, run["root_digest"])["envelope_version"],
    )
    with ws.db.tx() as conn:
        epoch = int(run["assignment_epoch"]) + 1
        changed = execute(
            conn,
            "UPDATE runs SET assignment_epoch = :e, world_size = :w, updated_at = :now WHERE run_id = :r AND assignment_epoch = :prev",
            {"e": epoch, "w": world_size, "now": utcnow(), "r": run_id, "prev": epoch - 1},
        )
        if changed != 1:
            raise ConflictError(
                "run was rescaled concurrently", object=run_id, check="assignment-epoch"
            )
        _write_assignment(conn, run_id, epoch, [s["id"] for s in manifest.shards], world_size)
    return {
        "runId": run_id,
        "rootDigest": run["root_digest"],
        "epoch": epoch,
        "worldSize": world_size,
    }


def assignment(db: Database, run_id: str, epoch: int, rank: int) -> list[str]:
    with db.tx() as conn:
        row = one(
            conn,
            "SELECT shards FROM run_assignments WHERE run_id = :r AND epoch = :e AND rank = :k",
            {"r": run_id, "e": epoch, "k": rank},
        )
    if row is None:
        raise UsageError(
            f"rank {rank} has no assignment in epoch {epoch}", object=run_id, check="rank"
        )
    return list(json.loads(row["shards"]))


def fail_run(db: Database, run_id: str, reason: str) -> bool:
    """Fail a run that has not started step 0 (returns False if it already had)."""
    with db.tx() as conn:
        return (
            execute(
                conn,
                "UPDATE runs SET state = 'FAILED', failure = :f, updated_at = :now WHERE run_id = :r AND state = 'CREATED'",
                {"f": reason, "now": utcnow(), "r": run_id},
            )
            == 1
        )


def shard_checker(
    ws: Workspace, manifest: rm.ReleaseManifest, keys: Mapping[str, bytes] | None = None
) -> Callable[[dict[str, Any]], None]:
    """Per-shard verification for a rank: the independent verifier's checks on one descriptor."""
    from relgate.release.verifier import ShardTask, verify_shard
    from relgate.snapshot.compare import load_manifest

    member_schema = load_manifest(ws, manifest.snapshot).body["recordSchema"]
    key_version = manifest.body["writer"].get("keyVersion")
    key = (keys or {}).get(key_version) if key_version else None

    def check(descriptor: dict[str, Any]) -> None:
        task = ShardTask(
            ws.config["objectStore"],
            descriptor,
            manifest.snapshot,
            manifest.body["recordSchema"],
            member_schema,
            key_version,
            key,
        )
        result = verify_shard(task)
        release_metrics.current().observe_shard(manifest.digest, result.to_json())
        if not result.ok:
            first = result.failures[0]
            raise IntegrityError(
                f"shard failed verification: {first['message']}",
                object=str(descriptor["id"]),
                check=str(first["check"]),
                digest=str(descriptor["digest"]),
                details={"failures": result.failures},
            )

    return check


@dataclass
class WorkerResult:
    run_id: str
    rank: int
    epoch: int
    root_digest: str
    shards: list[str]
    barrier_wait_s: float
    state: str

    def to_json(self) -> dict[str, Any]:
        return {
            "runId": self.run_id,
            "rank": self.rank,
            "epoch": self.epoch,
            "rootDigest": self.root_digest,
            "shardDigests": self.shards,
            "barrierWaitSeconds": round(self.barrier_wait_s, 3),
            "state": self.state,
        }


def report(
    db: Database,
    run_id: str,
    epoch: int,
    rank: int,
    root: str,
    shard_digests: list[str],
    ok: bool,
    detail: str,
) -> None:
    """Record a rank's report; a restarted rank may report again, but only the same root."""
    params = {"r": run_id, "e": epoch, "k": rank}
    with db.tx() as conn:
        existing = one(
            conn,
            "SELECT root_digest FROM run_reports WHERE run_id = :r AND epoch = :e AND rank = :k",
            params,
        )
        if existing is not None:
            if existing["root_digest"] != root:
                raise RejectedError(
                    "a restarted rank reported a different root",
                    object=run_id,
                    check="root-mismatch",
                    digest=root,
                )
            execute(
                conn,
                "UPDATE run_reports SET ok = :ok, detail = :d, reported_at = :now WHERE run_id = :r AND epoch = :e AND rank = :k",
                {**params, "ok": 1 if ok else 0, "d": detail, "now": utcnow()},
            )
            return
        execute(
            conn,
            "INSERT INTO run_reports (run_id, epoch, rank, root_digest, shard_digests, ok, detail, reported_at)"
            " VALUES (:r, :e, :k, :root, :s, :ok, :d, :now)",
            {
                "r": run_id,
                "e": epoch,
                "k": rank,
                "root": root,
                "s": json.dumps(shard_digests),
                "ok": 1 if ok else 0,
                "d": detail,
                "now": utcnow(),
            },
        )


def run_worker(
    ws: Workspace,
    run_id: str,
    rank: int,
    *,
    keys: Mapping[str, bytes] | None = None,
    barrier_timeout: float = 60.0,
    poll: float = 0.1,
    on_verified: Callable[[WorkerResult], None] | None = None,
) -> WorkerResult:
    """Verify this rank's shards, report, and wait for every rank to agree on the root."""
    run = get_run(ws.db, run_id)
    if run["state"] == "FAILED":
        raise RejectedError(
            f"run failed: {run['failure']}",
            object=run_id,
            check="run-state",
            digest=run["root_digest"],
        )
    root = str(run["root_digest"])
    epoch = int(run["assignment_epoch"])
    shard_ids = assignment(ws.db, run_id, epoch, rank)
    release_metrics.current().assigned(root, len(shard_ids))
    ok, detail, digests = True, "verified", []
    try:
        release = get_release(ws.db, root)
        manifest = rm.load(ws.store, ws.trusted_keys, root, release["envelope_version"])
        by_id = {s["id"]: s for s in manifest.shards}
        check = shard_checker(ws, manifest, keys)
        for shard_id in shard_ids:
            descriptor = by_id.get(shard_id)
            if descriptor is None:
                raise RejectedError(
                    "assigned shard is not in the root manifest",
                    object=shard_id,
                    check="descriptor",
                    digest=root,
                )
            check(descriptor)
            digests.append(str(descriptor["digest"]))
        reported_root = manifest.digest
    except RelgateError as exc:
        ok, detail, reported_root = False, f"{exc.check}: {exc}", root
    report(ws.db, run_id, epoch, rank, reported_root, digests, ok, detail)
    result = WorkerResult(run_id, rank, epoch, reported_root, digests, 0.0, "CREATED")
    if not ok:
        fail_run(ws.db, run_id, f"rank {rank} could not verify its shards: {detail}")
        raise RejectedError(
            f"rank {rank} failed verification",
            object=run_id,
            check="shard-verify",
            digest=root,
            details={"detail": detail},
        )
    if on_verified is not None:
        on_verified(result)
    started = time.monotonic()
    while True:
        with ws.db.tx() as conn:
            state = _barrier_state(conn, run_id, epoch)
        result.barrier_wait_s = time.monotonic() - started
        release_metrics.current().barrier_waited(root, rank, result.barrier_wait_s)
        if state["run"]["state"] == "FAILED" and state["run"]["barrier_epoch"] < epoch:
            raise RejectedError(
                f"run failed before step 0: {state['run']['failure']}",
                object=run_id,
                check="run-failed",
                digest=root,
            )
        if state["problem"]:
            fail_run(ws.db, run_id, state["problem"])
            raise RejectedError(state["problem"], object=run_id, check="barrier", digest=root)
        if state["complete"]:
            with ws.db.tx() as conn:
                execute(
                    conn,
                    "UPDATE runs SET state = 'RUNNING', barrier_epoch = :e, updated_at = :now WHERE run_id = :r AND barrier_epoch < :e",
                    {"e": epoch, "now": utcnow(), "r": run_id},
                )
            result.state = "RUNNING"
            return result
        if result.barrier_wait_s > barrier_timeout:
            fail_run(ws.db, run_id, f"barrier timeout after {barrier_timeout}s in epoch {epoch}")
            raise RejectedError(
                "barrier timed out before step 0",
                object=run_id,
                check="barrier-timeout",
                digest=root,
                details={"reported": state["reported"], "worldSize": state["worldSize"]},
            )
        time.sleep(poll)


def _barrier_state(conn: Connection, run_id: str, epoch: int) -> dict[str, Any]:
    run = one(conn, "SELECT * FROM runs WHERE run_id = :r", {"r": run_id})
    assert run is not None
    reports = rows(
        conn,
        "SELECT rank, root_digest, ok FROM run_reports WHERE run_id = :r AND epoch = :e",
        {"r": run_id, "e": epoch},
    )
    permit = one(
        conn,
        "SELECT state, closed_reason FROM permits WHERE permit_id = :p",
        {"p": run["permit_id"]},
    )
    problem = None
    roots = {r["root_digest"] for r in reports}
    release_metrics.current().root_mismatch(run["root_digest"], [r["root_digest"] for r in reports])
    if any(root != run["root_digest"] for root in roots):
        problem = f"root mismatch: ranks reported {sorted(roots)}"
    elif any(not r["ok"] for r in reports):
        problem = "a rank failed shard verification"
    elif permit is None or permit["state"] != "OPEN":
        problem = f"permit closed: {permit['closed_reason'] if permit else 'missing'}"
    world = int(run["world_size"])
    return {
        "run": run,
        "reported": len(reports),
        "worldSize": world,
        "complete": problem is None and len(reports) == world,
        "problem": problem,
    }


def run_status(db: Database, run_id: str) -> dict[str, Any]:
    run = get_run(db, run_id)
    with db.tx() as conn:
        reports = rows(
            conn,
            "SELECT epoch, rank, root_digest, ok, detail, reported_at FROM run_reports WHERE run_id = :r ORDER BY epoch, rank",
            {"r": run_id},
        )
        permit = one(conn, "SELECT * FROM permits WHERE permit_id = :p", {"p": run["permit_id"]})
    return {**run, "reports": reports, "permit": permit}
