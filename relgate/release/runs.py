"""Training runs pinned to one root: admission, assignment, per-rank workers, the barrier,
and the end of a run.

Run states: ADMITTED -> RUNNING -> FINISHED, or CANCELLED / REVOKED (a fence hit the
root), or FAILED before step 0.  A run in a terminal state has a closed permit and holds
nothing, so garbage collection may reclaim its root once nothing else holds it.

``create_run`` admits an exact root digest (or resolves the alias exactly once), inside
the gate transaction that also issues the permit, and writes the root digest into the
run.  From then on nothing reads
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
from relgate.catalog.release_table import get_release
from relgate.catalog.states import RUN_ADMITTED_STATES, RUN_LIVE_STATES, RUN_TERMINAL_STATES
from relgate.errors import (
    ConflictError,
    IntegrityError,
    NotFoundError,
    RejectedError,
    RelgateError,
    UsageError,
)
from relgate.gate.permits import NO_GENERATION, acquire, close_permit
from relgate.release import metrics as release_metrics
from relgate.release import root as rm
from relgate.release.reader import ReaderLease
from relgate.workspace import Workspace

#: Which states each way of ending a run may start from.
END_FROM: dict[str, tuple[str, ...]] = {
    "FINISHED": ("RUNNING",),
    "CANCELLED": RUN_LIVE_STATES,
}
_LIVE_SQL = ", ".join(f"'{s}'" for s in RUN_LIVE_STATES)
_ADMITTED_SQL = ", ".join(f"'{s}'" for s in RUN_ADMITTED_STATES)


def run_state(row: dict[str, Any]) -> str:
    """The stored state, with the pre-migration-4 name ``CREATED`` read as ADMITTED."""
    state = str(row["state"])
    return "ADMITTED" if state in RUN_ADMITTED_STATES else state


def _refuse_ended(run: dict[str, Any]) -> None:
    state = run_state(run)
    if state in RUN_TERMINAL_STATES:
        raise RejectedError(
            f"run is {state}: {run.get('end_reason') or run.get('failure') or 'ended'}",
            object=str(run["run_id"]),
            check="run-revoked" if state == "REVOKED" else "run-state",
            digest=str(run["root_digest"]),
            details={"state": state},
        )


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
    ws: Workspace,
    *,
    purpose: str,
    world_size: int,
    actor: str,
    alias: str | None = None,
    root: str | None = None,
    expected_generation: int | None = None,
) -> dict[str, Any]:
    """Admit a run on an exact ``root`` (or the root ``alias`` points at, read once).

    A run that failed, was cancelled or finished does not block a new run on the same
    digest: each run has its own permit.
    """
    if world_size < 1:
        raise UsageError("world size must be at least 1", object="run", check="world-size")
    run_id = "run-" + uuid.uuid4().hex[:12]
    gate = ws.gate()
    with ws.db.gate_tx() as conn:
        permit = acquire(
            conn,
            gate,
            purpose=purpose,
            alias=alias,
            root=root,
            expected_generation=expected_generation,
        )
        admitted = str(permit["root_digest"])
        release = one(
            conn, "SELECT envelope_version FROM releases WHERE digest = :d", {"d": admitted}
        )
        assert release is not None
        now = utcnow()
        execute(
            conn,
            "INSERT INTO runs (run_id, alias, root_digest, permit_id, purpose, world_size, assignment_epoch,"
            " barrier_epoch, state, created_at, updated_at)"
            " VALUES (:r, :a, :root, :p, :purpose, :w, 0, -1, 'ADMITTED', :now, :now)",
            {
                "r": run_id,
                "a": alias or "",
                "root": admitted,
                "p": permit["permit_id"],
                "purpose": purpose,
                "w": world_size,
                "now": now,
            },
        )
    manifest = rm.load(ws.store, ws.trusted_keys, admitted, release["envelope_version"])
    with ws.db.tx() as conn:
        _write_assignment(conn, run_id, 0, [s["id"] for s in manifest.shards], world_size)
    generation = int(permit["generation"])
    return {
        "runId": run_id,
        "state": "ADMITTED",
        "rootDigest": admitted,
        "permit": permit["permit_id"],
        "worldSize": world_size,
        "alias": alias,
        "generation": None if generation == NO_GENERATION else generation,
        "tombstoneWatermark": permit["tombstone_watermark"],
        "benchmarkFence": permit["benchmark_fence"],
        "actor": actor,
    }


def end_run(
    ws: Workspace, run_id: str, to_state: str, *, actor: str, reason: str
) -> dict[str, Any]:
    """FINISHED (from RUNNING) or CANCELLED (before or after step 0): close the permit and
    release the run's hold, in one gate transaction (ordered against fence advances).
    Repeating the same end is idempotent; ending a run that ended otherwise is refused."""
    if to_state not in END_FROM:
        raise UsageError(f"a run ends as one of {sorted(END_FROM)}", object=run_id, check="end")
    with ws.db.gate_tx() as conn:
        run = one(conn, "SELECT * FROM runs WHERE run_id = :r", {"r": run_id})
        if run is None:
            raise NotFoundError("unknown run", object=run_id, check="exists")
        state = run_state(run)
        if state == to_state:
            return {**_run_json(run), "idempotentRetry": True}
        if run["state"] not in END_FROM[to_state]:
            raise RejectedError(
                f"run is {state}; {to_state} needs {' or '.join(sorted(set(map(_name, END_FROM[to_state]))))}",
                object=run_id,
                check="run-revoked" if state == "REVOKED" else "run-state",
                digest=str(run["root_digest"]),
                details={"state": state, "reason": run.get("end_reason") or run.get("failure")},
            )
        now = utcnow()
        changed = execute(
            conn,
            "UPDATE runs SET state = :to, ended_at = :now, ended_by = :who, end_reason = :why,"
            " updated_at = :now WHERE run_id = :r AND state = :from",
            {
                "to": to_state,
                "now": now,
                "who": actor,
                "why": reason,
                "r": run_id,
                "from": run["state"],
            },
        )
        if changed != 1:
            raise ConflictError("run changed concurrently", object=run_id, check="run-state")
        close_permit(conn, str(run["permit_id"]), f"run {run_id} {to_state}: {reason}")
        run.update(state=to_state, ended_at=now, ended_by=actor, end_reason=reason)
    return {**_run_json(run), "idempotentRetry": False}


def _name(state: str) -> str:
    return "ADMITTED" if state in RUN_ADMITTED_STATES else state


def _run_json(run: dict[str, Any]) -> dict[str, Any]:
    return {
        "runId": run["run_id"],
        "state": run_state(run),
        "rootDigest": run["root_digest"],
        "permit": run["permit_id"],
        "endedAt": run.get("ended_at"),
        "endedBy": run.get("ended_by"),
        "reason": run.get("end_reason"),
    }


def finish_run(
    ws: Workspace, run_id: str, *, actor: str, reason: str = "finished"
) -> dict[str, Any]:
    return end_run(ws, run_id, "FINISHED", actor=actor, reason=reason)


def cancel_run(
    ws: Workspace, run_id: str, *, actor: str, reason: str = "cancelled"
) -> dict[str, Any]:
    return end_run(ws, run_id, "CANCELLED", actor=actor, reason=reason)


def list_runs(db: Database, *, state: str | None = None) -> list[dict[str, Any]]:
    with db.tx() as conn:
        found = rows(conn, "SELECT * FROM runs ORDER BY created_at, run_id")
    out = [_run_json(r) for r in found]
    return [r for r in out if state is None or r["state"] == state]


def get_run(db: Database, run_id: str) -> dict[str, Any]:
    with db.tx() as conn:
        row = one(conn, "SELECT * FROM runs WHERE run_id = :r", {"r": run_id})
    if row is None:
        raise NotFoundError("unknown run", object=run_id, check="exists")
    return row


def rescale(ws: Workspace, run_id: str, world_size: int) -> dict[str, Any]:
    """Scale-out or recovery: a new assignment epoch over the same root; the alias is not read."""
    run = get_run(ws.db, run_id)
    _refuse_ended(run)
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
    """Fail a run that has not started step 0 and close its permit (returns False if it
    had already started, or ended)."""
    with db.gate_tx() as conn:
        run = one(conn, "SELECT permit_id FROM runs WHERE run_id = :r", {"r": run_id})
        now = utcnow()
        changed = execute(
            conn,
            "UPDATE runs SET state = 'FAILED', failure = :f, end_reason = :f, ended_at = :now,"
            f" ended_by = 'barrier', updated_at = :now WHERE run_id = :r AND state IN ({_ADMITTED_SQL})",
            {"f": reason, "now": now, "r": run_id},
        )
        if changed == 1 and run is not None:
            close_permit(conn, str(run["permit_id"]), f"run {run_id} FAILED: {reason}")
        return changed == 1


def shard_checker(
    ws: Workspace, manifest: rm.ReleaseManifest, keys: Mapping[str, bytes] | None = None
) -> Callable[[dict[str, Any]], None]:
    """Per-shard verification for a rank: the independent verifier's checks on one descriptor."""
    from relgate.release.verify_worker import ShardTask, verify_shard
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
    lease: ReaderLease | None = None,
    lease_ttl: int = 60,
) -> WorkerResult:
    """Verify this rank's shards, report, and wait for every rank to agree on the root.

    The rank holds a reader lease on the root from before it reads a byte until it
    returns (or, with ``lease``, for as long as the caller keeps that lease open).
    """
    run = get_run(ws.db, run_id)
    _refuse_ended(run)
    root = str(run["root_digest"])
    own = lease is None
    held = lease or ReaderLease(ws, root, holder=f"{run_id}/rank-{rank}", ttl_seconds=lease_ttl)
    try:
        return _run_worker(ws, run, rank, keys, barrier_timeout, poll, on_verified, held)
    finally:
        if own:
            held.close()


def _run_worker(
    ws: Workspace,
    run: dict[str, Any],
    rank: int,
    keys: Mapping[str, bytes] | None,
    barrier_timeout: float,
    poll: float,
    on_verified: Callable[[WorkerResult], None] | None,
    lease: ReaderLease,
) -> WorkerResult:
    run_id = str(run["run_id"])
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
            lease.check()
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
    result = WorkerResult(run_id, rank, epoch, reported_root, digests, 0.0, "ADMITTED")
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
    gate = ws.gate()
    started = time.monotonic()
    while True:
        lease.check()
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
            check_name, problem = state["problem"]
            fail_run(ws.db, run_id, problem)
            raise RejectedError(problem, object=run_id, check=check_name, digest=root)
        if state["complete"]:
            try:
                with ws.db.gate_tx() as conn:
                    _start_step0(conn, gate, run_id, epoch)
            except RejectedError as exc:
                fail_run(ws.db, run_id, f"{exc.check}: {exc.message}")
                raise RejectedError(
                    f"refused at the barrier: {exc.message}",
                    object=run_id,
                    check=exc.check,
                    digest=exc.digest or root,
                    details=exc.details,
                ) from None
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


def _start_step0(conn: Connection, gate: Any, run_id: str, epoch: int) -> None:
    """Step 0, decided in the gate: the run is live, its permit open, its root free of
    fence hits against the current fences and its stored envelope re-verified."""
    run = one(conn, "SELECT * FROM runs WHERE run_id = :r", {"r": run_id})
    assert run is not None
    _refuse_ended(run)
    permit = one(
        conn,
        "SELECT state, closed_reason FROM permits WHERE permit_id = :p",
        {"p": run["permit_id"]},
    )
    if permit is None or permit["state"] != "OPEN":
        raise RejectedError(
            f"permit closed: {permit['closed_reason'] if permit else 'missing'}",
            object=run_id,
            check="permit-closed",
            digest=str(run["root_digest"]),
        )
    gate.check_root(conn, "release", str(run["root_digest"]))
    execute(
        conn,
        "UPDATE runs SET state = 'RUNNING', barrier_epoch = :e, updated_at = :now"
        f" WHERE run_id = :r AND barrier_epoch < :e AND state IN ({_LIVE_SQL})",
        {"e": epoch, "now": utcnow(), "r": run_id},
    )


def _barrier_state(conn: Connection, run_id: str, epoch: int) -> dict[str, Any]:
    # The permit is read before the run: a fence closes the permit and revokes the run in
    # one transaction, so under READ COMMITTED a closed permit implies the run row read
    # after it already says REVOKED (and names the fence), never the other way round.
    permit = one(
        conn,
        "SELECT p.state, p.closed_reason FROM permits p JOIN runs r ON r.permit_id = p.permit_id"
        " WHERE r.run_id = :r",
        {"r": run_id},
    )
    run = one(conn, "SELECT * FROM runs WHERE run_id = :r", {"r": run_id})
    assert run is not None
    reports = rows(
        conn,
        "SELECT rank, root_digest, ok FROM run_reports WHERE run_id = :r AND epoch = :e",
        {"r": run_id, "e": epoch},
    )
    problem: tuple[str, str] | None = None
    roots = {r["root_digest"] for r in reports}
    release_metrics.current().root_mismatch(run["root_digest"], [r["root_digest"] for r in reports])
    state = run_state(run)
    if state == "REVOKED":
        problem = ("run-revoked", f"run revoked: {run['end_reason']}")
    elif state in ("CANCELLED", "FINISHED"):
        problem = ("run-state", f"run is {state}")
    elif any(root != run["root_digest"] for root in roots):
        problem = ("barrier", f"root mismatch: ranks reported {sorted(roots)}")
    elif any(not r["ok"] for r in reports):
        problem = ("barrier", "a rank failed shard verification")
    elif permit is None or permit["state"] != "OPEN":
        problem = (
            "permit-closed",
            f"permit closed: {permit['closed_reason'] if permit else 'missing'}",
        )
    world = int(run["world_size"])
    return {
        "run": run,
        "reported": len(reports),
        "worldSize": world,
        "complete": problem is None and len(reports) == world,
        "problem": problem,
    }


def watch_run(
    ws: Workspace,
    run_id: str,
    *,
    lease: ReaderLease | None = None,
    poll: float = 0.5,
    timeout: float = 7 * 24 * 3600.0,
) -> dict[str, Any]:
    """Wait (bounded) until the run ends or its permit closes; return the run row.

    Used by a worker that serves its ready probe for the run's life.
    """
    deadline = time.monotonic() + timeout
    while True:
        if lease is not None:
            lease.check()
        with ws.db.tx() as conn:
            run = one(conn, "SELECT * FROM runs WHERE run_id = :r", {"r": run_id})
            assert run is not None
            permit = one(
                conn, "SELECT state FROM permits WHERE permit_id = :p", {"p": run["permit_id"]}
            )
        if run_state(run) in RUN_TERMINAL_STATES or permit is None or permit["state"] != "OPEN":
            return run
        if time.monotonic() > deadline:
            raise RejectedError(
                f"run did not end within {timeout}s",
                object=run_id,
                check="hold-timeout",
                digest=str(run["root_digest"]),
            )
        time.sleep(poll)


def run_status(db: Database, run_id: str) -> dict[str, Any]:
    run = get_run(db, run_id)
    with db.tx() as conn:
        reports = rows(
            conn,
            "SELECT epoch, rank, root_digest, ok, detail, reported_at FROM run_reports WHERE run_id = :r ORDER BY epoch, rank",
            {"r": run_id},
        )
        permit = one(conn, "SELECT * FROM permits WHERE permit_id = :p", {"p": run["permit_id"]})
    return {**run, "state": run_state(run), "reports": reports, "permit": permit}
