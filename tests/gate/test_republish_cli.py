"""``relgate release approve`` / ``publish`` run twice, as a user re-runs a script.

Real CLI processes on a copy of the gate template (R2 is the PUBLISHED root of alias
``train``, R1 was published before it): the same root a second time exits 0 and reports
the existing approval and generation; another root exits 3 or 4 naming the object, the
check and the digest.
"""

import json
import subprocess
import sys

from relgate.gate.transitions import open_gate


def _cli(g, *args, expect=0):
    proc = subprocess.run(
        [sys.executable, "-m", "relgate.cli", "--home", str(g.ws.home), *args, "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert proc.returncode == expect, (args, proc.returncode, proc.stdout, proc.stderr)
    return json.loads(proc.stdout)


def test_the_same_root_twice_is_ok_and_reported_as_existing(g):
    for _ in range(2):
        approved = _cli(g, "release", "approve", g.r2, "--approver", "bob")
        assert (approved["existing"], approved["approver"], approved["state"]) == (
            "true",
            "alice",
            "PUBLISHED",
        )
        published = _cli(g, "release", "publish", g.r2, "--alias", "train")
        assert (published["activeDigest"], published["generation"]) == (g.r2, 2)
        assert published["idempotentRetry"] is True


def test_another_root_is_refused_naming_object_check_and_digest(g):
    older = _cli(g, "release", "publish", g.r1, "--alias", "train", expect=3)
    assert (older["object"], older["check"], older["digest"]) == ("release", "state", g.r1)
    stale = _cli(
        g, "release", "publish", g.r3, "--alias", "train", "--expect-generation", "1", expect=4
    )
    assert (stale["object"], stale["check"], stale["digest"]) == (
        "train",
        "alias-generation",
        g.r3,
    )
    alias = open_gate(g.ws).alias("train", "release")
    assert (alias.generation, alias.active_digest) == (2, g.r2)
