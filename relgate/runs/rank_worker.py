"""One rank of a run: verify the assigned shards, report the root, wait at the barrier."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from relgate.catalog.db import Database, execute, one, utcnow
from relgate.catalog.release_table import get_release
from relgate.documents import release_root as rm
from relgate.errors import IntegrityError, RejectedError, RelgateError
from relgate.gate.transitions import Gate, open_gate
from relgate.release import metrics as release_metrics
from relgate.release.verify.worker import ShardTask, verify_shard
from relgate.runs.assignment import assignment
from relgate.runs.barrier import barrier_state, start_step0
from relgate.runs.reader import ReaderLease, admit_read
from relgate.runs.run_end import fail_run
from relgate.runs.store import get_run, refuse_ended
from relgate.snapshot import tokenizer
from relgate.snapshot.diff import load_manifest
from relgate.workspace import Workspace


def shard_checker(
    ws: Workspace, manifest: rm.ReleaseManifest, keys: Mapping[str, bytes] | None = None
) -> Callable[[rm.ShardDescriptor], None]:
    """Per-shard verification for a rank: the independent verifier's checks on one descriptor."""
    snap = load_manifest(ws, manifest.snapshot)
    tokenizer_data = tokenizer.pinned_bytes(ws, snap)
    key_version = manifest.key_version
    key = (keys or {}).get(key_version) if key_version else None

    def check(descriptor: rm.ShardDescriptor) -> None:
        task = ShardTask(
            ws.config["objectStore"],
            descriptor,
            manifest.snapshot,
            snap.record_schema_document,
            snap.record_schema,
            key_version,
            key,
            tokenizer_data,
        )
        result = verify_shard(task)
        release_metrics.current().observe_shard(manifest.digest, result)
        if not result.ok:
            first = result.failures[0]
            raise IntegrityError(
                f"shard failed verification: {first['message']}",
                object=descriptor.id,
                check=str(first["check"]),
                digest=descriptor.storage_digest,
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


@dataclass(frozen=True)
class _Rank:
    """One rank's part in a run, as the worker's steps need it."""

    ws: Workspace
    run_id: str
    root: str
    epoch: int
    rank: int
    lease: ReaderLease


def run_worker(  # noqa: PLR0913 - the public keyword API (CLI and tests call it so)
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

    The rank reads only under its run's admission (:func:`admit_read`: the run live, its
    permit open on the root, the root PUBLISHED, approved and unrevoked) and holds a
    reader lease on the root from before it reads a byte until it returns (or, with
    ``lease``, for as long as the caller keeps that lease open).
    """
    run = get_run(ws.db, run_id)
    refuse_ended(run)
    root = run.root_digest
    admit_read(ws, root, run=run_id)  # the run's permit open on its root, nothing less
    own = lease is None
    held = lease or ReaderLease(ws, root, holder=f"{run_id}/rank-{rank}", ttl_seconds=lease_ttl)
    me = _Rank(ws, run_id, root, run.assignment_epoch, rank, held)
    try:
        result = _verify_assigned(me, keys)
        if on_verified is not None:
            on_verified(result)
        return _wait_at_barrier(me, result, barrier_timeout, poll)
    finally:
        if own:
            held.close()


def _verify_assigned(me: _Rank, keys: Mapping[str, bytes] | None) -> WorkerResult:
    """Verify every assigned shard from its exact version and report the root."""
    ws, run_id, root = me.ws, me.run_id, me.root
    shard_ids = assignment(ws.db, run_id, me.epoch, me.rank)
    release_metrics.current().assigned(root, len(shard_ids))
    ok, detail, digests = True, "verified", []
    try:
        release = get_release(ws.db, root)
        manifest = rm.load(ws.store, ws.trusted_keys, root, release.envelope_version)
        by_id = {s.id: s for s in manifest.shards}
        check = shard_checker(ws, manifest, keys)
        for shard_id in shard_ids:
            me.lease.check()
            descriptor = by_id.get(shard_id)
            if descriptor is None:
                raise RejectedError(
                    "assigned shard is not in the root manifest",
                    object=shard_id,
                    check="descriptor",
                    digest=root,
                )
            check(descriptor)
            digests.append(descriptor.storage_digest)
        reported_root = manifest.digest
    except RelgateError as exc:
        ok, detail, reported_root = False, f"{exc.check}: {exc}", root
    report(ws.db, run_id, me.epoch, me.rank, reported_root, digests, ok, detail)
    if not ok:
        fail_run(ws.db, run_id, f"rank {me.rank} could not verify its shards: {detail}")
        raise RejectedError(
            f"rank {me.rank} failed verification",
            object=run_id,
            check="shard-verify",
            digest=root,
            details={"detail": detail},
        )
    return WorkerResult(run_id, me.rank, me.epoch, reported_root, digests, 0.0, "ADMITTED")


def _wait_at_barrier(
    me: _Rank, result: WorkerResult, barrier_timeout: float, poll: float
) -> WorkerResult:
    """Poll the barrier until step 0 starts (RUNNING) or the run is refused."""
    ws, run_id, root, epoch = me.ws, me.run_id, me.root, me.epoch
    gate = open_gate(ws)
    started = time.monotonic()
    while True:
        me.lease.check()
        with ws.db.tx() as conn:
            state = barrier_state(conn, run_id, epoch)
        result.barrier_wait_s = time.monotonic() - started
        release_metrics.current().barrier_waited(root, me.rank, result.barrier_wait_s)
        if state.run.state == "FAILED" and state.run.barrier_epoch < epoch:
            raise RejectedError(
                f"run failed before step 0: {state.run.failure}",
                object=run_id,
                check="run-failed",
                digest=root,
            )
        if state.problem:
            check_name, problem = state.problem
            fail_run(ws.db, run_id, problem)
            raise RejectedError(problem, object=run_id, check=check_name, digest=root)
        if state.complete:
            _step0(me, gate)
            result.state = "RUNNING"
            return result
        if result.barrier_wait_s > barrier_timeout:
            fail_run(ws.db, run_id, f"barrier timeout after {barrier_timeout}s in epoch {epoch}")
            raise RejectedError(
                "barrier timed out before step 0",
                object=run_id,
                check="barrier-timeout",
                digest=root,
                details={"reported": state.reported, "worldSize": state.world_size},
            )
        time.sleep(poll)


def _step0(me: _Rank, gate: Gate) -> None:
    try:
        with me.ws.db.gate_tx() as conn:
            start_step0(conn, gate, me.run_id, me.epoch)
    except RejectedError as exc:
        fail_run(me.ws.db, me.run_id, f"{exc.check}: {exc.message}")
        raise RejectedError(
            f"refused at the barrier: {exc.message}",
            object=me.run_id,
            check=exc.check,
            digest=exc.digest or me.root,
            details=exc.details,
        ) from None
