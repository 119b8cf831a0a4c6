"""Gate admissions per second with concurrent clients, PostgreSQL and SQLite, checked.

Workload: a real workspace (demo sources, a validated and approved snapshot, a written,
verified, approved release published on alias ``train``; extra approved releases for the
CAS rounds).  ``clients`` spawned processes, each with its own catalog connection:

1. ``baseline``: a plain INSERT loop (one row, one transaction) on the same database;
2. ``admissions``: each client admits ``per_client`` runs through the gate API: one
   :meth:`Database.gate_tx` that issues the permit (:func:`relgate.gate.permit_issue.acquire`:
   alias read once, fences, release state and purpose, fence hits, stored envelope
   re-verified) and writes the run record (the statement
   :func:`relgate.runs.admission.admit_run` runs in the same transaction);
3. ``mixed``: rounds of one alias CAS per client from the same expected generation (one
   must win) interleaved with admissions, then a tombstone that hits the published root
   while clients keep admitting.

Then :func:`relgate.gate.history.violations` checks the clients' events against the
catalog (unique and durable permits, run records, revoke fence, gap-free audit sequences,
one CAS winner per generation, real-time order).  The PostgreSQL server is the Debian
binaries through ``tests/support/postgres.py`` (``fsync=off``, as the tests run it),
started and stopped by this module.
"""

from __future__ import annotations

import json
import multiprocessing as mp
import queue
import resource
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from bench.record import Comparison, compare
from relgate.catalog.db import execute, utcnow
from relgate.documents import release_root as rm
from relgate.errors import RelgateError
from relgate.gate.history import GateEvent, read_history, violations
from relgate.gate.permit_issue import acquire
from relgate.gate.transitions import open_gate
from relgate.workspace import Workspace

QUICK: dict[str, int] = {"clients": 16, "per_client": 25}
TARGET = ">= 1,000 admissions/s on PostgreSQL with 16 clients, 0 violations"
PURPOSE = "demo-model-training"
ALIAS = "train"
CAS_ROUNDS = 3
ROOT = Path(__file__).resolve().parent.parent
_RUN_SQL = (
    "INSERT INTO runs (run_id, alias, root_digest, permit_id, purpose, world_size,"
    " assignment_epoch, barrier_epoch, state, created_at, updated_at)"
    " VALUES (:r, :a, :root, :p, :purpose, 1, 0, -1, 'ADMITTED', :now, :now)"
)


def _support() -> None:
    if str(ROOT / "tests") not in sys.path:
        sys.path.append(str(ROOT / "tests"))  # after the root: tests/bench must not shadow bench


def world(home: Path, db_url: str, candidates: int) -> dict[str, Any]:
    """Published root on ``train`` plus ``candidates`` approved releases for CAS rounds."""
    _support()
    from support.lifecycle import forge_release, set_state
    from support.snapshots import build_approved
    from support.workspaces import make_workspace

    from relgate.catalog.audit import Approved
    from relgate.catalog.snapshot_table import get_snapshot
    from relgate.gate.approvals import sign_approval
    from relgate.objects.cas import ContentRef
    from relgate.release.publication import approve_release, publish
    from relgate.release.verify.verifier import verify_release
    from relgate.release.writer import write_release

    ws = make_workspace(home, db_url)
    snap = build_approved(ws)
    release = write_release(ws, snap.digest, records_per_shard=60, actor="bench")
    assert verify_release(ws, release.digest, workers=1, actor="bench").ok
    approve_release(ws, release.digest, approver="alice")
    publish(ws, release.digest, alias=ALIAS, actor="alice")
    forged = []
    for i in range(candidates):
        version = forge_release(
            ws, release, {d["id"] for d in rm.wire_shards(release.document())}, tag=f"cas{i}"
        )
        set_state(ws, "release", version.digest, "VERIFIED", "APPROVED")
        sign_approval(
            ws,
            Approved(
                kind="release",
                digest=version.digest,
                state="APPROVED",
                approver="b",
                report="sha256:" + "0" * 64,
            ),
        )
        forged.append(version.digest)
    row = get_snapshot(ws.db, snap.digest)
    members = ws.membership.read(ContentRef(row.members_digest, row.members_version, 0))
    member = str(members["sampleId"].to_list()[0])
    ws.close()
    return {"root": release.digest, "candidates": forged, "member": member}


def admit(ws: Workspace, gate: Any) -> GateEvent:
    """One admission: permit issue and run record in one gate transaction."""
    started = time.monotonic()
    try:
        with ws.db.admission_tx() as conn:
            permit = acquire(conn, gate, purpose=PURPOSE, alias=ALIAS).permit
            run_id = "run-" + uuid.uuid4().hex[:12]
            params = {"r": run_id, "a": ALIAS, "root": permit.root_digest, "p": permit.permit_id}
            execute(conn, _RUN_SQL, {**params, "purpose": PURPOSE, "now": utcnow()})
    except RelgateError as exc:
        return GateEvent(op="admit", ok=False, started=started, finished=time.monotonic(),
                         alias=ALIAS, error=exc.check)  # fmt: skip
    return GateEvent(
        op="admit", ok=True, started=started, finished=time.monotonic(), alias=ALIAS,
        root=permit.root_digest, permit_id=permit.permit_id, run_id=run_id,
        generation=permit.generation, tombstone_watermark=permit.tombstone_watermark,
        benchmark_fence=permit.benchmark_fence,
    )  # fmt: skip


def activate(gate: Any, digest: str, expected: int) -> GateEvent:
    started = time.monotonic()
    try:
        change = gate.activate("release", ALIAS, digest, expected_generation=expected, actor="b")
    except RelgateError as exc:
        return GateEvent(op="activate", ok=False, started=started, finished=time.monotonic(),
                         alias=ALIAS, root=digest, expected_generation=expected, error=exc.check)  # fmt: skip
    return GateEvent(
        op="activate", ok=True, started=started, finished=time.monotonic(), alias=ALIAS,
        root=digest, expected_generation=expected, generation=change.generation,
        tombstone_watermark=change.tombstone_watermark, benchmark_fence=change.benchmark_fence,
    )  # fmt: skip


def tombstone(gate: Any, sample_id: str) -> GateEvent:
    started = time.monotonic()
    advance = gate.add_tombstones([sample_id], reason="bench revoke", actor="bench")
    fences = gate.fences()
    return GateEvent(op="fence", ok=True, started=started, finished=time.monotonic(),
                     tombstone_watermark=advance.watermark, benchmark_fence=fences.benchmark_fence)  # fmt: skip


def _baseline(ws: Workspace, count: int, client: int) -> float:
    started = time.monotonic()
    for i in range(count):
        with ws.db.tx() as conn:
            execute(conn, "INSERT INTO bench_inserts (id, at) VALUES (:i, :t)",
                    {"i": f"{client}-{i}", "t": utcnow()})  # fmt: skip
    return time.monotonic() - started


def _client(home: str, index: int, job: dict[str, Any], barrier: Any, out: Any) -> None:
    """One client process: baseline, admissions, then the mixed rounds."""
    ws = Workspace.open(Path(home))
    gate = open_gate(ws)
    result: dict[str, Any] = {"index": index, "events": []}
    barrier.wait()
    result["baselineSeconds"] = _baseline(ws, job["per_client"], index)
    barrier.wait()
    events = [admit(ws, gate) for _ in range(job["per_client"])]
    barrier.wait()
    for rnd, expected in enumerate(job["expected"]):
        barrier.wait()
        events.append(activate(gate, job["candidates"][rnd][index], expected))
        events.extend(admit(ws, gate) for _ in range(3))
    barrier.wait()
    if index == 0:
        events.append(tombstone(gate, job["member"]))
    events.extend(admit(ws, gate) for _ in range(3))
    result["events"] = [e.model_dump() for e in events]
    out.put(result)
    ws.close()


def _rate(events: list[GateEvent]) -> tuple[int, float]:
    ok = [e for e in events if e.ok]
    span = max(e.finished for e in ok) - min(e.started for e in ok)
    return len(ok), span


def run_load(
    home: Path, built: dict[str, Any], clients: int, per_client: int, *, spawn: bool = True
) -> dict[str, Any]:
    """Run the three phases with ``clients`` spawned processes (or threads); the rates
    and what the checker found."""
    ws = Workspace.open(home)
    with ws.db.tx() as conn:
        execute(conn, "CREATE TABLE IF NOT EXISTS bench_inserts (id TEXT PRIMARY KEY, at TEXT)")
    generation = open_gate(ws).alias(ALIAS, "release").generation
    ws.close()
    rounds = [built["candidates"][r * clients : (r + 1) * clients] for r in range(CAS_ROUNDS)]
    job = {"per_client": per_client, "candidates": rounds, "member": built["member"],
           "expected": [generation + r for r in range(CAS_ROUNDS)]}  # fmt: skip
    workers: list[Any]
    barrier: Any
    out: Any
    if spawn:
        ctx = mp.get_context("spawn")
        barrier, out = ctx.Barrier(clients), ctx.Queue()
        workers = [
            ctx.Process(target=_client, args=(str(home), i, job, barrier, out))
            for i in range(clients)
        ]
    else:
        barrier, out = threading.Barrier(clients), queue.Queue()
        workers = [
            threading.Thread(target=_client, args=(str(home), i, job, barrier, out))
            for i in range(clients)
        ]
    for worker in workers:
        worker.start()
    results = [out.get(timeout=1800) for _ in workers]
    for worker in workers:
        worker.join(timeout=60)
    events = [GateEvent.model_validate(e) for r in results for e in r["events"]]
    throughput = [GateEvent.model_validate(e) for r in results for e in r["events"][:per_client]]
    admitted, span = _rate(throughput)
    baseline = max(r["baselineSeconds"] for r in results)
    ws = Workspace.open(home)
    with ws.db.tx() as conn:
        found = violations(events, read_history(conn))
    ws.close()
    return {
        "admissions": admitted,
        "admissionsPerSecond": round(admitted / span, 1),
        "baselineInsertsPerSecond": round(clients * per_client / baseline, 1),
        "refusedAfterRevoke": sum(1 for e in events if e.op == "admit" and not e.ok),
        "casWinners": sum(1 for e in events if e.op == "activate" and e.ok),
        "violations": len(found),
        "violationSample": found[:5],
    }


def _backend(url: str | None, clients: int, per_client: int) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as tmp:
        home = Path(tmp) / "home"
        db_url = url or f"sqlite:///{tmp}/catalog.db"
        built = world(home, db_url, CAS_ROUNDS * clients)
        return run_load(home, built, clients, per_client)


def main(clients: int = 16, per_client: int = 250) -> dict[str, Any]:
    _support()
    from support.postgres import PostgresServer, fresh_database

    server = PostgresServer()
    try:
        with fresh_database(server.start()) as url:
            postgres = _backend(url, clients, per_client)
    finally:
        server.stop()
    sqlite = _backend(None, clients, per_client)
    rate = postgres["admissionsPerSecond"]
    return {
        "workload": (
            f"{clients} client processes x {per_client} admissions (permit + run record in"
            f" one gate transaction), then {CAS_ROUNDS} alias-CAS rounds and a revoking"
            " tombstone under load; PostgreSQL (Debian binaries, fsync=off) and SQLite"
        ),
        "baseline": {
            "what": "plain INSERT loop (one row per transaction), same clients, same database",
            "postgresPerSecond": postgres["baselineInsertsPerSecond"],
            "sqlitePerSecond": sqlite["baselineInsertsPerSecond"],
        },
        "ratio": round(rate / postgres["baselineInsertsPerSecond"], 3),
        "target": TARGET,
        "postgres": postgres,
        "sqlite": sqlite,
        "peakRssMiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def comparisons(result: dict[str, Any]) -> list[Comparison]:
    """Admissions per second against a plain INSERT loop from the same clients, per
    database."""
    return [
        compare(
            f"gate admissions, {backend}",
            "per s",
            ("admissions", result[backend]["admissionsPerSecond"]),
            ("plain INSERT loop", result[backend]["baselineInsertsPerSecond"]),
            higher_is_better=True,
        )
        for backend in ("postgres", "sqlite")
        if isinstance(result.get(backend), dict)
    ]


if __name__ == "__main__":
    print(json.dumps(main(**QUICK), indent=2))
