"""Reading needs admission (issue 28, item 3).

The template: R1 and R2 published in turn on ``train`` (R2 active), R3 approved and never
published.  The reader opens a root only for a live run whose permit is open on it (or a
held checkpoint pin with a saved position); an INVALID, unapproved, unpublished or
revoked root is refused, at open and mid-read; auditing is a separate, recorded entry
point that returns counts, never records.
"""

import json
import subprocess
import sys

import pytest
from support.runs import create_run

from relgate.catalog.db import execute, rows
from relgate.catalog.release_table import get_release
from relgate.documents import release_root as rm
from relgate.errors import NotFoundError, RejectedError
from relgate.gate.approvals import approval_kind
from relgate.holds.pins import add_pin, remove_pin
from relgate.runs.reader import (
    READ_ADMISSION,
    InputPosition,
    ReadAdmission,
    ShardReader,
    audit_root,
    open_reader,
)
from relgate.runs.run_end import cancel_run
from tests.gate.conftest import PURPOSE


def _shards(ws, root):
    manifest = rm.load(ws.store, ws.trusted_keys, root, get_release(ws.db, root).envelope_version)
    return manifest, [d.id for d in manifest.descriptors]


def _run(ws, root):
    return create_run(ws, root=root, purpose=PURPOSE, world_size=1, actor="t")["runId"]


def _refused(call, check):
    with pytest.raises(RejectedError) as info:
        call()
    assert (info.value.check, info.value.exit_code) == (check, 3), info.value
    return info.value


def _set_state(ws, root, state):
    with ws.db.tx() as conn:
        execute(conn, "UPDATE releases SET state = :s WHERE digest = :d", {"s": state, "d": root})


def test_no_read_without_an_admitted_run_on_that_root(g):
    ws = g.ws
    _, shards = _shards(ws, g.r2)
    refused = _refused(lambda: open_reader(ws, g.r2, shards, seed=1), READ_ADMISSION)
    assert refused.digest == g.r2
    run = _run(ws, g.r2)
    _refused(lambda: open_reader(ws, g.r2, shards, seed=1, run=run, pin="pin-x"), READ_ADMISSION)
    _, r3_shards = _shards(ws, g.r3)  # APPROVED, never published: no run, no pin opens it
    _refused(lambda: open_reader(ws, g.r3, r3_shards, seed=1, run=run), READ_ADMISSION)
    with pytest.raises(NotFoundError):
        open_reader(ws, g.r2, shards, seed=1, run="run-nope")
    reader = open_reader(ws, g.r2, shards, seed=1, run=run, lease=False)
    assert reader.admission.permit_id and next(iter(reader))["sampleId"]


def test_the_public_shard_reader_needs_an_admission_too(g):
    ws = g.ws
    manifest, shards = _shards(ws, g.r2)
    pos = InputPosition(g.r2, 1, tuple(shards))
    _refused(lambda: ShardReader(ws, manifest, pos, admission=ReadAdmission(g.r2)), READ_ADMISSION)
    forged = ShardReader(
        ws, manifest, pos, admission=ReadAdmission(g.r2, permit_id="permit-forged")
    )
    _refused(lambda: next(iter(forged)), "permit-closed")  # no such open permit on the root


@pytest.mark.parametrize("how", ["invalid", "unapproved", "unpublished"])
def test_a_bad_root_is_refused_at_open_and_mid_read(g, how):
    ws = g.ws
    _, shards = _shards(ws, g.r2)
    run = _run(ws, g.r2)
    reader = open_reader(ws, g.r2, shards, seed=1, run=run, lease=False)
    it = iter(reader)
    next(it)
    if how == "invalid":
        _set_state(ws, g.r2, "INVALID")
        check = "release-state"
        _refused(lambda: next(it), check)
    elif how == "unpublished":
        _set_state(ws, g.r2, "APPROVED")
        check = "release-state"
        _refused(lambda: next(it), check)
    else:
        with ws.db.tx() as conn:
            execute(
                conn,
                "DELETE FROM reports WHERE subject_kind = :k AND subject_digest = :d",
                {"k": approval_kind("release"), "d": g.r2},
            )
        check = "approval"
    _refused(lambda: open_reader(ws, g.r2, shards, seed=1, run=run), check)


def test_a_reader_stops_when_its_run_ends_and_a_pin_resumes(g):
    ws = g.ws
    _, shards = _shards(ws, g.r2)
    run = _run(ws, g.r2)
    reader = open_reader(ws, g.r2, shards, seed=4, run=run, lease=False)
    it = iter(reader)
    head = [next(it)["sampleId"] for _ in range(3)]
    saved = reader.position.to_json()
    cancel_run(ws, run, actor="t")
    _refused(lambda: next(it), "permit-closed")
    _refused(lambda: open_reader(ws, g.r2, shards, seed=4, run=run), "run-state")
    explicit = add_pin(ws, g.r2, owner="o", reason="keep")
    _refused(lambda: open_reader(ws, g.r2, [], seed=0, pin=explicit.pin_id), READ_ADMISSION)
    pin = add_pin(ws, g.r2, owner="o", reason="ckpt", kind="checkpoint", position=saved)
    resumed = open_reader(ws, g.r2, [], seed=0, pin=pin.pin_id, lease=False)
    assert resumed.position.to_json() == saved
    first = next(iter(resumed))["sampleId"]
    assert first not in head
    _set_state(ws, g.r2, "INVALID")  # an INVALID root is not resumed either
    _refused(lambda: open_reader(ws, g.r2, [], seed=0, pin=pin.pin_id), "release-state")


def test_audit_reads_any_root_is_recorded_and_returns_no_records(g):
    ws = g.ws
    _set_state(ws, g.r3, "INVALID")
    audit = audit_root(ws, g.r3, actor="auditor", reason="incident 7")
    assert audit.ok and audit.state == "INVALID"
    assert sum(s.records for s in audit.shards) > 0
    assert "sampleId" not in json.dumps(audit.to_json())  # counts, never records
    with ws.db.tx() as conn:
        events = rows(conn, "SELECT * FROM gate_events WHERE operation = 'audit-read'")
    assert [(e["subject"], e["digest"]) for e in events] == [("auditor: incident 7", g.r3)]
    cli = [sys.executable, "-m", "relgate.cli", "--home", str(ws.home), "release", "audit", g.r3]
    proc = subprocess.run([*cli, "--json"], capture_output=True, text=True, check=False)
    assert proc.returncode == 2, proc.stderr  # --reason is required
    proc = subprocess.run(
        [*cli, "--reason", "review", "--json"], capture_output=True, text=True, check=False
    )
    assert proc.returncode == 0, (proc.stdout, proc.stderr)
    assert json.loads(proc.stdout)["state"] == "INVALID"


def test_the_admission_names_what_it_refuses(g):
    """Killed mutants: each clause of the run/permit/pin checks decides on its own."""
    ws = g.ws
    _, shards = _shards(ws, g.r2)
    run = _run(ws, g.r2)
    other = _refused(lambda: open_reader(ws, g.r1, [], seed=1, run=run), READ_ADMISSION)
    assert (other.object, other.details) == (run, {"runRoot": g.r2})
    for column, value in (("state", "CLOSED"), ("root_digest", g.r1)):  # run still ADMITTED
        with ws.db.tx() as conn:
            execute(conn, f"UPDATE permits SET {column} = :v", {"v": value})
        closed = _refused(lambda: open_reader(ws, g.r2, shards, seed=1, run=run), "permit-closed")
        assert closed.object == run
        with ws.db.tx() as conn:
            execute(conn, "UPDATE permits SET state = 'OPEN', root_digest = :r", {"r": g.r2})
    with ws.db.tx() as conn:
        execute(conn, "UPDATE permits SET state = 'CLOSED', closed_reason = 'by hand'")
    closed = _refused(lambda: open_reader(ws, g.r2, shards, seed=1, run=run), "permit-closed")
    assert "by hand" in closed.message
    with ws.db.tx() as conn:
        execute(conn, "UPDATE permits SET state = 'OPEN'")
    reader = open_reader(ws, g.r2, shards, seed=1, run=run, lease=False)
    it = iter(reader)
    next(it)
    with ws.db.tx() as conn:
        execute(conn, "UPDATE permits SET state = 'CLOSED'")
    assert _refused(lambda: next(it), "permit-closed").object == run
    with ws.db.tx() as conn:
        execute(conn, "UPDATE permits SET state = 'OPEN'")
    _set_state(ws, g.r2, "INVALID")
    assert (
        _refused(lambda: open_reader(ws, g.r2, [], seed=1, run=run), "release-state").object == run
    )


def test_only_a_held_unexpired_checkpoint_pin_of_this_root_resumes(g):
    ws = g.ws
    _, shards = _shards(ws, g.r2)
    saved = InputPosition(g.r2, 1, tuple(shards)).to_json()

    def pin(**kw):
        return add_pin(ws, g.r2, owner="o", reason="r", **kw).pin_id

    explicit = pin(position=saved)  # an explicit pin that carries a position is no checkpoint
    _refused(lambda: open_reader(ws, g.r2, [], seed=0, pin=explicit), READ_ADMISSION)
    later = pin(kind="checkpoint", position=saved, expires_at="2999-01-01T00:00:00Z")
    assert open_reader(ws, g.r2, [], seed=0, pin=later, lease=False).admission.pin_id == later
    expired = pin(kind="checkpoint", position=saved, expires_at="2000-01-01T00:00:00Z")
    refusal = _refused(lambda: open_reader(ws, g.r2, [], seed=0, pin=expired), READ_ADMISSION)
    assert refusal.details == {"state": "HELD", "expired": True}
    remove_pin(ws, later, actor="t")
    _refused(lambda: open_reader(ws, g.r2, [], seed=0, pin=later), READ_ADMISSION)
    on_r1 = add_pin(
        ws, g.r1, owner="o", reason="r", kind="checkpoint", position={**saved, "root": g.r1}
    )
    _refused(lambda: open_reader(ws, g.r2, [], seed=0, pin=on_r1.pin_id), READ_ADMISSION)
    pinned = open_reader(
        ws, g.r2, [], seed=0, pin=pin(kind="checkpoint", position=saved), lease=False
    )
    it = iter(pinned)
    next(it)
    with ws.db.tx() as conn:
        execute(conn, "UPDATE pins SET state = 'RELEASED'")
    assert _refused(lambda: next(it), "permit-closed").object == pinned.admission.pin_id
