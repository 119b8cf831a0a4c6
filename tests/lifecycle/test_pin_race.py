"""A pin taken while a sweep runs, for real: two processes, many iterations, each backend.

Each iteration stores a fresh version that nothing retains (a REJECTED snapshot: its own
signed envelope and a unique stored report, sharing the retained membership table).  One
process sweeps with no grace period while the other pins that version.  Exactly one order
is allowed every time:

* the pin commits first: the sweep's in-gate recheck sees it and every object of the
  version survives (and verifies);
* the sweep deletes first: the pin is refused, naming an object GC deleted, with check
  ``pin-objects-present``.

Never a committed pin on a version with a deleted object.  After every iteration every
retained version still verifies end to end.
"""

import copy
import multiprocessing as mp
import random

from support.snapshots import build_approved
from support.workspaces import make_workspace

from relgate.catalog.audit import record_report
from relgate.catalog.db import rows
from relgate.catalog.snapshot_table import get_snapshot, insert_snapshot
from relgate.catalog.states import transition
from relgate.documents import snapshot_manifest as sm
from relgate.errors import RejectedError
from relgate.holds.pins import add_pin
from relgate.holds.refs import version_refs
from relgate.lifecycle.collector import sweep, verify_retained
from relgate.workspace import Workspace

ITERATIONS = 24


def _racer(role, home, barrier, tasks, results):
    import time

    ws = Workspace.open(home)
    while True:
        task = tasks.get()
        if task is None:
            break
        barrier.wait()
        time.sleep(task["delay"][role])
        try:
            if role == "pin":
                pin = add_pin(ws, task["digest"], owner="racer", reason="race")
                results.put((role, "ok", pin.pin_id))
            else:
                out = sweep(ws, actor="sweeper", grace_seconds=0, batch_size=4)
                results.put((role, "ok", out.deleted_count))
        except RejectedError as exc:
            results.put((role, "refused", exc.check))
        except Exception as exc:  # surfaced to the test, never swallowed
            results.put((role, "error", repr(exc)))
    ws.close()


def _unretained_version(ws, base, i):
    row = get_snapshot(ws.db, base.digest)
    body = copy.deepcopy(sm.load(ws.store, ws.trusted_keys, base.digest, row.envelope_version).body)
    body.pop("snapshotId", None)
    body["purpose"] = f"race-{i}"
    sealed = sm.seal(body)
    version = sm.store_envelope(ws.store, sealed, sm.sign(sealed, ws.signing_key))
    report = ws.cas.put(f'{{"race": {i}, "subject": "{sealed.digest}"}}'.encode())
    with ws.db.tx() as conn:
        insert_snapshot(conn, sealed, version, actor="test")
        record_report(conn, "snapshot", sealed.digest, report.digest, report.version_id, False)
        transition(conn, "snapshot", sealed.digest, "REJECTED", actor="test", reason="race setup")
    return sealed.digest


def test_pin_races_sweep(tmp_path, db_url):
    ws = make_workspace(tmp_path / "home", db_url)
    base = build_approved(ws)
    ctx = mp.get_context("fork")
    barrier = ctx.Barrier(2)
    queues = {"pin": ctx.Queue(), "sweep": ctx.Queue()}
    results = ctx.Queue()
    procs = [
        ctx.Process(target=_racer, args=(role, str(ws.home), barrier, queues[role], results))
        for role in ("pin", "sweep")
    ]
    for proc in procs:
        proc.start()
    rng = random.Random(4)
    outcomes = {"honoured": 0, "refused": 0}
    try:
        for i in range(ITERATIONS):
            digest = _unretained_version(ws, base, i)
            delay = {"pin": rng.uniform(0, 0.15), "sweep": rng.uniform(0, 0.03)}
            for role in ("pin", "sweep"):
                queues[role].put({"digest": digest, "delay": delay})
            got = dict((r[0], r[1:]) for r in (results.get(timeout=120), results.get(timeout=120)))
            assert got["sweep"][0] == "ok", got
            status, detail = got["pin"]
            assert status in ("ok", "refused"), got
            with ws.db.tx() as conn:
                refs = version_refs(ws, conn, "snapshot", digest) if status == "ok" else []
                deleted = rows(
                    conn,
                    "SELECT object_key FROM gc_deletions WHERE object_key LIKE :k",
                    {"k": f"%{digest.removeprefix('sha256:')}%"},
                )
            if status == "ok":
                outcomes["honoured"] += 1
                assert not deleted
                for ref in refs:  # every object of the pinned version is still there
                    ws.store.get(ref.key, ref.version_id)
            else:
                outcomes["refused"] += 1
                assert detail == "pin-objects-present", got
                assert deleted, "a refused pin must name an object GC deleted"
            verify_retained(ws)
        # The sweeps deleted the unpinned versions' objects, never a pinned one's.
        assert outcomes["honoured"] + outcomes["refused"] == ITERATIONS
    finally:
        for role in ("pin", "sweep"):
            queues[role].put(None)
        for proc in procs:
            proc.join(timeout=60)
            if proc.is_alive():
                proc.kill()
                proc.join()
        ws.close()
    print(f"pin/sweep race outcomes: {outcomes}")
