"""Activation racing a tombstone, for real: two processes, many iterations, each backend.

Each iteration inserts a fresh APPROVED candidate built against the current watermark,
then one process reads the alias (as a user's `snapshot activate` does) and CASes it
while the other advances the tombstone fence over one of the candidate's members.
Exactly one order must be observed every time:

* activation first: the alias moved to the candidate at the watermark the candidate was
  built against, and the tombstone then recorded a hit on the now-active candidate;
* tombstone first: activation lost with ``fence-watermarks``, the candidate is still
  APPROVED (it never advanced), and the alias still points at the input runs pinned.
"""

import hashlib
import multiprocessing as mp
import time

import pytest

from relgate.catalog.db import execute, utcnow
from relgate.errors import ConflictError
from relgate.snapshot.catalog import get_snapshot
from relgate.states import current_state, transition
from relgate.workspace import Workspace

from .conftest import make_workspace
from .helpers import build_active

ITERATIONS = {"snapshot": 200, "release": 100}


def _racer(role, kind, home, barrier, tasks, results):
    ws = Workspace.open(home)
    gate = ws.gate()
    while True:
        task = tasks.get()
        if task is None:
            break
        barrier.wait()
        time.sleep(task["delay"][role])  # stagger so both orders happen on every backend
        try:
            if role == "activate":
                generation = gate.alias(f"race-{kind}", kind).generation  # read, then CAS
                out = gate.activate(
                    kind,
                    f"race-{kind}",
                    task["digest"],
                    expected_generation=generation,
                    actor="activator",
                )
                results.put((role, "ok", out["generation"]))
            else:
                adv = gate.add_tombstones([task["sample"]], reason="race", actor="dpo")
                results.put((role, "ok", adv.watermark))
        except ConflictError as exc:
            results.put((role, "conflict", exc.check))
        except Exception as exc:  # surfaced to the test, never swallowed
            results.put((role, "error", repr(exc)))
    ws.close()


def _insert_candidate(ws, kind, base_row, digest, fences):
    now = utcnow()
    common = {
        "d": digest,
        "t": fences.tombstone_watermark,
        "b": fences.benchmark_fence,
        "md": base_row["members_digest"],
        "mv": base_row["members_version"],
        "ev": base_row["envelope_version"],
        "now": now,
    }
    with ws.db.tx() as conn:
        if kind == "snapshot":
            execute(
                conn,
                "INSERT INTO snapshots (digest, state, purpose, member_count, tombstone_watermark, benchmark_fence,"
                " members_digest, members_version, manifest_version, envelope_version, created_at, updated_at)"
                " VALUES (:d, 'APPROVED', 'race', :n, :t, :b, :md, :mv, :ev, :ev, :now, :now)",
                {**common, "n": base_row["member_count"]},
            )
        else:
            execute(
                conn,
                "INSERT INTO releases (digest, state, snapshot_digest, members_digest, members_version, tombstone_watermark,"
                " benchmark_fence, shard_count, record_count, envelope_version, created_at, updated_at)"
                " VALUES (:d, 'APPROVED', :s, :md, :mv, :t, :b, 1, :n, :ev, :now, :now)",
                {**common, "s": base_row["digest"], "n": base_row["member_count"]},
            )


ACTIVE_STATE = {"snapshot": "ACTIVE", "release": "PUBLISHED"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["snapshot", "release"])
def test_activation_races_tombstone(tmp_path, db_url, kind):
    ws = make_workspace(tmp_path / "home", db_url)
    base = build_active(ws, alias="race-base")
    base_row = get_snapshot(ws.db, base.digest)
    members = ws.membership.read(base.manifest.members_ref)["sampleId"].to_list()
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    queues = {role: ctx.Queue() for role in ("activate", "tombstone")}
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_racer, args=(role, kind, str(ws.home), barrier, queues[role], results))
        for role in queues
    ]
    for p in procs:
        p.start()
    gate = ws.gate()
    outcomes = {"activation-first": 0, "tombstone-first": 0}
    try:
        for i in range(ITERATIONS[kind]):
            before = gate.alias(f"race-{kind}", kind)
            candidate = "sha256:" + hashlib.sha256(f"candidate-{i}".encode()).hexdigest()
            _insert_candidate(ws, kind, base_row, candidate, before.fences)
            sample = members[i % len(members)]
            # Deterministic stagger: each side gets 0-6 ms head start in turn.
            delay = {"activate": 0.002 * (i % 4), "tombstone": 0.002 * ((i + 2) % 4)}
            for q in queues.values():
                q.put({"digest": candidate, "sample": sample, "delay": delay})
            got = dict((r[0], r[1:]) for r in (results.get(timeout=60), results.get(timeout=60)))
            assert got["tombstone"][0] == "ok", got
            after = gate.alias(f"race-{kind}", kind)
            assert after.fences.tombstone_watermark == before.fences.tombstone_watermark + 1
            with ws.db.tx() as conn:
                state = current_state(conn, kind, candidate)
            hits = {h["fence_seq"] for h in gate.hits_for(candidate)}
            if got["activate"][0] == "ok":
                outcomes["activation-first"] += 1
                assert (
                    after.active_digest == candidate and after.generation == before.generation + 1
                )
                assert state == ACTIVE_STATE[kind]
                entry = gate.alias_history(f"race-{kind}")[-1]
                assert entry["digest"] == candidate
                assert (
                    entry["tombstone_watermark"] == before.fences.tombstone_watermark
                )  # never a stale watermark
            else:
                assert got["activate"] == ("conflict", "fence-watermarks"), got
                outcomes["tombstone-first"] += 1
                assert state == "APPROVED"  # never advanced
                assert (
                    after.active_digest == before.active_digest
                    and after.generation == before.generation
                )
                with ws.db.tx() as conn:  # retire the loser so later fence advances skip it
                    lost = "REJECTED" if kind == "snapshot" else "INVALID"
                    transition(conn, kind, candidate, lost, actor="test", reason="lost race")
            assert hits == {
                after.fences.tombstone_watermark
            }  # the fence saw the candidate either way
    finally:
        for q in queues.values():
            q.put(None)
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        ws.close()
    assert sum(outcomes.values()) == ITERATIONS[kind]
    assert min(outcomes.values()) > 0, outcomes  # both orders really happened
    print(f"{kind} race outcomes on {db_url.split(':')[0]}: {outcomes}")
