"""One approval rule on every path (issue 28, item 2): the signed approval, never the row.

A snapshot whose catalog row says APPROVED (edited for real in SQLite) but that carries no
signed approval is refused with check ``approval`` by release build, release approval,
publication, rollback and admission by alias and by root; nothing moves.
"""

import json
import subprocess
import sys

import pytest
from support.runs import create_run

from relgate.catalog.db import execute
from relgate.catalog.release_table import get_release
from relgate.errors import RejectedError
from relgate.gate.approvals import approval_kind
from relgate.gate.transitions import open_gate
from relgate.release.publication import approve_release, publish, rollback_release
from relgate.release.writer import write_release
from tests.gate.conftest import PURPOSE


def _cli(home, *args, expect):
    proc = subprocess.run(
        [sys.executable, "-m", "relgate.cli", "--home", str(home), *args, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == expect, (args, proc.stdout, proc.stderr)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def _edit_row_to_approved(ws, table, digest):
    with ws.db.tx() as conn:
        execute(conn, f"UPDATE {table} SET state = 'APPROVED' WHERE digest = :d", {"d": digest})


def _drop_signed_approval(ws, kind, digest):
    """What an edited catalog leaves: the state says approved, nothing signed says so."""
    with ws.db.tx() as conn:
        execute(
            conn,
            "DELETE FROM reports WHERE subject_kind = :k AND subject_digest = :d",
            {"k": approval_kind(kind), "d": digest},
        )


def _refused(call, digest):
    with pytest.raises(RejectedError) as err:
        call()
    assert (err.value.check, err.value.digest, err.value.exit_code) == ("approval", digest, 3)


def test_every_path_reopens_the_snapshot_approval(g):
    """S approved, R1 and R2 published in turn on ``train``, R3 approved (the template);
    then S's signed approval is gone and its row says APPROVED by the catalog's word only."""
    ws, snap = g.ws, g.snapshot
    _drop_signed_approval(ws, "snapshot", snap)
    _edit_row_to_approved(ws, "snapshots", snap)

    _refused(lambda: write_release(ws, snap, actor="t"), snap)
    assert len(list(ws.store.list("manifests/releases/"))) == 3  # nothing was written
    _refused(lambda: approve_release(ws, g.r3, approver="alice"), snap)
    _refused(lambda: publish(ws, g.r3, alias="train", actor="a"), snap)
    _refused(lambda: rollback_release(ws, "train", g.r1, actor="a"), snap)
    assert open_gate(ws).alias("train", "release").generation == 2  # nothing moved
    assert get_release(ws.db, g.r3).state == "APPROVED"
    for how in ({"alias": "train"}, {"root": g.r2}):
        _refused(
            lambda how=how: create_run(ws, purpose=PURPOSE, world_size=1, actor="t", **how), snap
        )
    out = _cli(
        ws.home, "run", "create", "--alias", "train", "--purpose", PURPOSE, "--world-size", "1",
        expect=3,
    )  # fmt: skip
    assert (out["check"], out["digest"]) == ("approval", snap), out
    out = _cli(ws.home, "release", "build", snap, expect=3)
    assert (out["check"], out["digest"]) == ("approval", snap), out


def test_a_release_row_edited_to_published_is_not_admitted(g):
    ws = g.ws
    _drop_signed_approval(ws, "release", g.r3)
    with ws.db.tx() as conn:
        execute(conn, "UPDATE releases SET state = 'PUBLISHED' WHERE digest = :d", {"d": g.r3})
    _refused(lambda: create_run(ws, purpose=PURPOSE, world_size=1, actor="t", root=g.r3), g.r3)
    assert create_run(ws, purpose=PURPOSE, world_size=1, actor="t", root=g.r2)["rootDigest"] == g.r2
