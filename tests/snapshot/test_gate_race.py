"""Activation racing a tombstone, for real: two processes, many iterations, each backend.

Each iteration inserts a fresh APPROVED candidate built against the current watermark,
then one process reads the alias (as a user's `snapshot activate` does) and CASes it
while the other advances the tombstone fence over one of the candidate's members.
Exactly one order must be observed every time:

* activation first: the alias moved to the candidate at the watermark the candidate was
  built against, and the tombstone then recorded a hit on the now-active candidate;
* tombstone first: activation lost with ``fence-watermarks``, the candidate is still
  APPROVED (it never advanced), and the alias still points at the input runs pinned.

Candidates are real signed manifests (the gate re-verifies the stored envelope of
whatever it activates), derived from a built one with the current watermarks.

Run admission on a superseded root racing a tombstone over one of its members, likewise:

* admission first: the run was admitted on the exact root, and the fence advance then
  recorded a hit on it (a run holds its root), closed its permit and REVOKED the run;
* tombstone first: admission was refused with ``fence-hits`` and no run exists.
"""

import copy
import hashlib
import multiprocessing as mp
import time

import pytest
from support.runs import create_run
from support.snapshots import build_active
from support.workspaces import make_workspace

from relgate.catalog.audit import Approved
from relgate.catalog.db import execute, one, rows, utcnow
from relgate.catalog.snapshot_table import get_snapshot
from relgate.catalog.states import current_state, transition
from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.errors import ConflictError, RejectedError
from relgate.gate.approvals import sign_approval
from relgate.gate.transitions import open_gate
from relgate.release.writer import write_release
from relgate.workspace import Workspace

ITERATIONS = {"snapshot": 120, "release": 60}  # both orders occur well within these


def _racer(role, kind, home, barrier, tasks, results):
    ws = Workspace.open(home)
    gate = open_gate(ws)
    while True:
        task = tasks.get()
        if task is None:
            break
        barrier.wait()
        time.sleep(task["delay"][role])  # stagger so both orders happen on every backend
        try:
            if role == "admit":
                out = create_run(
                    ws, root=task["digest"], purpose=task["purpose"], world_size=1, actor="sched"
                )
                results.put((role, "ok", out["runId"]))
            elif role == "activate":
                generation = gate.alias(f"race-{kind}", kind).generation  # read, then CAS
                out = gate.activate(
                    kind,
                    f"race-{kind}",
                    task["digest"],
                    expected_generation=generation,
                    actor="activator",
                )
                results.put((role, "ok", out.generation))
            else:
                adv = gate.add_tombstones([task["sample"]], reason="race", actor="dpo")
                results.put((role, "ok", adv.watermark))
        except ConflictError as exc:
            results.put((role, "conflict", exc.check))
        except RejectedError as exc:
            results.put((role, "rejected", exc.check))
        except Exception as exc:  # surfaced to the test, never swallowed
            results.put((role, "error", repr(exc)))
    ws.close()


def _insert_candidate(ws, kind, base, digest_seed, fences, state="APPROVED"):
    """A real signed manifest derived from ``base`` (a snapshot or release manifest) at the
    current watermarks, stored and catalogued in ``state``; returns its digest."""
    body = copy.deepcopy(base.body if kind == "snapshot" else base.document())
    body["tombstoneWatermark"] = fences.tombstone_watermark
    body["benchmarkFence"] = fences.benchmark_fence
    module = sm if kind == "snapshot" else rm
    if kind == "snapshot":
        body["parents"] = [digest_seed]  # a distinct, valid manifest per iteration
    else:
        writer = body["writer"]
        body["writer"] = {**writer, "sortSeed": f"{writer['sortSeed']}/{digest_seed}"}
    if kind == "snapshot":
        sealed = sm.seal(body)
        digest = sealed.digest
    else:  # sealed as a document: the forger re-signs an opened root
        sealed = rm.seal_document(body)
        digest = str(sealed["rootId"])
    version = module.store_envelope(ws.store, sealed, module.sign(sealed, ws.signing_key))
    now = utcnow()
    with ws.db.tx() as conn:
        row = one(conn, f"SELECT * FROM {kind}s WHERE digest = :d", {"d": base.digest})
    common = {
        "d": digest,
        "st": state,
        "t": fences.tombstone_watermark,
        "b": fences.benchmark_fence,
        "md": row["members_digest"],
        "mv": row["members_version"],
        "ev": version,
        "now": now,
    }
    with ws.db.tx() as conn:
        if kind == "snapshot":
            execute(
                conn,
                "INSERT INTO snapshots (digest, state, purpose, member_count, tombstone_watermark, benchmark_fence,"
                " members_digest, members_version, manifest_version, envelope_version, created_at, updated_at)"
                " VALUES (:d, :st, :p, :n, :t, :b, :md, :mv, :ev, :ev, :now, :now)",
                {**common, "n": row["member_count"], "p": row["purpose"]},
            )
        else:
            execute(
                conn,
                "INSERT INTO releases (digest, state, snapshot_digest, members_digest, members_version, tombstone_watermark,"
                " benchmark_fence, shard_count, record_count, envelope_version, created_at, updated_at)"
                " VALUES (:d, :st, :s, :md, :mv, :t, :b, :sc, :rc, :ev, :now, :now)",
                {
                    **common,
                    "s": row["snapshot_digest"],
                    "sc": row["shard_count"],
                    "rc": row["record_count"],
                },
            )
    if state == "APPROVED":  # the gate re-verifies the signed approval, not the state
        sign_approval(
            ws,
            Approved(
                kind=kind,
                digest=digest,
                state="APPROVED",
                approver="race",
                report="sha256:" + "0" * 64,
            ),
        )
    return digest


ACTIVE_STATE = {"snapshot": "ACTIVE", "release": "PUBLISHED"}


@pytest.mark.slow
@pytest.mark.parametrize("kind", ["snapshot", "release"])
def test_activation_races_tombstone(tmp_path, db_url, kind):  # noqa: PLR0915  # one race, top to bottom
    ws = make_workspace(tmp_path / "home", db_url)
    base = build_active(ws, alias="race-base")
    members = ws.membership.read(base.manifest.members_ref)["sampleId"].to_list()
    template = (
        base.manifest
        if kind == "snapshot"
        else write_release(ws, base.digest, records_per_shard=60, actor="test")
    )
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
    gate = open_gate(ws)
    outcomes = {"activation-first": 0, "tombstone-first": 0}
    try:
        for i in range(ITERATIONS[kind]):
            before = gate.alias(f"race-{kind}", kind)
            seed = "sha256:" + hashlib.sha256(f"candidate-{i}".encode()).hexdigest()
            candidate = _insert_candidate(ws, kind, template, seed, before.fences)
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
            hits = {h.fence_seq for h in gate.hits_for(candidate)}
            if got["activate"][0] == "ok":
                outcomes["activation-first"] += 1
                assert (
                    after.active_digest == candidate and after.generation == before.generation + 1
                )
                assert state == ACTIVE_STATE[kind]
                entry = gate.alias_history(f"race-{kind}")[-1]
                assert entry.subject == candidate
                assert (
                    entry.tombstone_watermark == before.fences.tombstone_watermark
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


ADMISSIONS = 60


@pytest.mark.slow
def test_run_admission_on_a_superseded_root_races_tombstone(tmp_path, db_url):
    ws = make_workspace(tmp_path / "home", db_url)
    base = build_active(ws, alias="race-base")
    members = ws.membership.read(base.manifest.members_ref)["sampleId"].to_list()
    template = write_release(ws, base.digest, records_per_shard=60, actor="test")
    purpose = get_snapshot(ws.db, base.digest).purpose
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    queues = {role: ctx.Queue() for role in ("admit", "tombstone")}
    results = ctx.Queue()
    procs = [
        ctx.Process(
            target=_racer, args=(role, "release", str(ws.home), barrier, queues[role], results)
        )
        for role in queues
    ]
    for p in procs:
        p.start()
    gate = open_gate(ws)
    outcomes = {"admission-first": 0, "tombstone-first": 0}
    try:
        for i in range(ADMISSIONS):
            fences = gate.fences()
            old, new = (
                _insert_candidate(ws, "release", template, f"{i}-{n}", fences) for n in ("a", "b")
            )
            for digest in (old, new):  # published in turn: old is superseded
                gate.activate("release", "race-train", digest, expected_generation=None, actor="a")
            assert gate.alias("race-train", "release").active_digest == new
            delay = {"admit": 0.002 * (i % 4), "tombstone": 0.002 * ((i + 2) % 4)}
            task = {"digest": old, "sample": members[i % len(members)], "purpose": purpose}
            for q in queues.values():
                q.put({**task, "delay": delay})
            got = dict((r[0], r[1:]) for r in (results.get(timeout=120), results.get(timeout=120)))
            assert got["tombstone"][0] == "ok", got
            watermark = got["tombstone"][1]
            hits = {h.fence_seq for h in gate.hits_for(old)}
            assert hits == {watermark}, (got, hits)  # the superseded root was still held
            with ws.db.tx() as conn:
                runs = rows(
                    conn,
                    "SELECT r.run_id, r.state, r.end_reason, p.state AS permit FROM runs r"
                    " JOIN permits p ON p.permit_id = r.permit_id WHERE r.root_digest = :d",
                    {"d": old},
                )
            if got["admit"][0] == "ok":
                outcomes["admission-first"] += 1
                assert [(r["run_id"], r["state"], r["permit"]) for r in runs] == [
                    (got["admit"][1], "REVOKED", "CLOSED")
                ]
                assert f"[{watermark}]" in runs[0]["end_reason"]
            else:
                outcomes["tombstone-first"] += 1
                assert got["admit"] == ("rejected", "fence-hits"), got
                assert runs == []
    finally:
        for q in queues.values():
            q.put(None)
        for p in procs:
            p.join(timeout=30)
            if p.is_alive():
                p.kill()
        ws.close()
    assert sum(outcomes.values()) == ADMISSIONS
    assert min(outcomes.values()) > 0, outcomes  # both orders really happened
    print(f"admission race outcomes on {db_url.split(':')[0]}: {outcomes}")
