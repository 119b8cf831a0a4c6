"""States tell the truth: a superseded or fence-hit version is shown as such by ``snapshot
show``, ``release show``, ``alias show`` and ``lineage`` (never a plain ACTIVE/PUBLISHED),
and ``release verify`` lists each failing shard with its check and the expected and actual
values.  In-process (CliRunner) on one seeded workspace; the damage is done on disk."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from relgate_trust.digests import sha256_digest
from support.releases import overwrite_in_place, shard_path
from support.workspaces import make_workspace

from relgate.catalog.release_table import get_release
from relgate.cli.main import main
from relgate.documents import release_root as rm
from relgate.release.verify.checks import Check
from relgate.workspace import Workspace


def cli(home: Path, *args: str, expect: int = 0) -> dict:  # type: ignore[type-arg]
    result: Result = CliRunner().invoke(main, ["--home", str(home), *args, "--json"])
    assert result.exit_code == expect, (args, result.exit_code, result.output)
    return json.loads(result.stdout)  # type: ignore[no-any-return]


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    return make_workspace(tmp_path_factory.mktemp("states") / "home")


def _active_snapshot(ws: Workspace, alias: str) -> str:
    digest = str(cli(ws.home, "snapshot", "build", "--alias", alias)["snapshot"])
    cli(ws.home, "snapshot", "approve", digest, "--approver", "carol")
    cli(ws.home, "snapshot", "activate", digest, "--alias", alias)
    return digest


def _published(ws: Workspace, snapshot: str, alias: str, per_shard: int) -> str:
    root = str(
        cli(ws.home, "release", "build", snapshot, "--records-per-shard", str(per_shard))["release"]
    )
    cli(ws.home, "release", "verify", root, "--workers", "0")
    cli(ws.home, "release", "approve", root, "--approver", "carol")
    cli(ws.home, "release", "publish", root, "--alias", alias)
    return root


def test_superseded_and_fence_hit_versions_say_so(ws: Workspace) -> None:
    old = _active_snapshot(ws, "states")
    new = _active_snapshot(ws, "states")  # its parent is `old`: another digest
    assert old != new
    shown = cli(ws.home, "snapshot", "show", old)
    assert (shown["state"], shown["catalogState"], shown["marks"]) == (
        "SUPERSEDED",
        "ACTIVE",
        ["superseded"],
    )
    assert shown["supersededOn"] == [{"alias": "states", "generation": 1, "activeDigest": new}]
    current = cli(ws.home, "snapshot", "show", new)
    assert (current["state"], current["marks"], current["currentOn"]) == ("ACTIVE", [], ["states"])
    assert (current["supersededOn"], current["fenceHitCount"]) == ([], 0)
    never = str(cli(ws.home, "snapshot", "build", "--alias", "states-unused")["snapshot"])
    shown = cli(ws.home, "snapshot", "show", never)  # never on an alias: not superseded
    assert (shown["state"], shown["marks"], shown["currentOn"]) == ("VALIDATED", [], [])

    first = _published(ws, new, "states-train", 64)
    second = _published(ws, new, "states-train", 50)
    assert cli(ws.home, "release", "show", first)["state"] == "SUPERSEDED"
    assert cli(ws.home, "release", "show", second)["state"] == "PUBLISHED"

    # Erase a member of every version: each is now FENCE-HIT wherever it is shown.
    sample = "forum/0000001"
    cli(ws.home, "fence", "tombstone", "add", sample, "--reason", "gdpr erasure")
    for kind, digest in (("snapshot", new), ("release", second), ("release", first)):
        shown = cli(ws.home, kind, "show", digest)
        assert shown["state"] == "FENCE-HIT" and "fence-hit" in shown["marks"], (kind, shown)
        assert shown["fenceHitCount"] >= 1
    alias = cli(ws.home, "alias", "show", "states")
    assert (alias["activeDigest"], alias["activeState"]) == (new, "FENCE-HIT")
    marks = [(h["digest"], h["state"], h["marks"]) for h in alias["history"]]
    assert marks == [
        (old, "FENCE-HIT", ["fence-hit", "superseded"]),  # both: the fence mark is shown first
        (new, "FENCE-HIT", ["fence-hit"]),
    ]
    versions = cli(ws.home, "lineage", sample)["versions"]
    assert {v["digest"] for v in versions} >= {old, new, first, second}
    states = {v["digest"]: v["state"] for v in versions}
    assert not {"ACTIVE", "PUBLISHED"} & set(states.values()), states
    assert states[old] == "FENCE-HIT"


def test_release_verify_names_each_failing_shard(ws: Workspace) -> None:
    snapshot = _active_snapshot(ws, "verify-states")
    root = str(cli(ws.home, "release", "build", snapshot, "--records-per-shard", "60")["release"])
    manifest = rm.load(ws.store, ws.trusted_keys, root, get_release(ws.db, root).envelope_version)
    victim = rm.wire_shards(manifest.document())[1]
    path = shard_path(ws, victim)
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0xFF  # same size, other bytes
    overwrite_in_place(path, bytes(data))
    result = CliRunner().invoke(main, ["--home", str(ws.home), "release", "verify", root])
    assert result.exit_code == 3, result.output
    line = next(line for line in result.output.splitlines() if f"shard {victim['id']}@" in line)
    assert Check.STORAGE_DIGEST_MISMATCH.value in line
    assert f"expected {victim['digest']}, actual {sha256_digest(bytes(data))}" in line
    body = cli(ws.home, "release", "verify", root, expect=3)  # INVALID is final: same listing
    found = body["failingShards"]
    assert [(f["shard"], f["check"]) for f in found] == [(victim["id"], "storageDigestMismatch")]
    assert (found[0]["expected"], found[0]["actual"]) == (
        victim["digest"],
        sha256_digest(bytes(data)),
    )


def test_shard_findings_from_a_report(ws: Workspace) -> None:
    """The typed findings: unknown check names and malformed entries are skipped, not the
    shard's later findings; expected comes from the descriptor only when the check has one."""
    from relgate.documents.shard_descriptor import ShardDescriptor
    from relgate.release.verify.checks import Outcome
    from relgate.release.verify.report import VerificationReport, failing_shards

    digest = "sha256:" + "a" * 64
    descriptor = ShardDescriptor(
        id="s1", media_type="x", digest=digest, size=10, object_version="v1",
        logical_digest=digest, records=3, tokens=9, member_set_digest=digest,
    )  # fmt: skip
    report = VerificationReport(
        root="sha256:" + "f" * 64,
        outcome=Outcome.INVALID,
        counts={},
        facts={},
        problems=[],
        unavailable=[],
        shards=[
            {"id": "s0", "objectVersion": "v0", "ok": True, "failures": []},
            {"id": "s1", "objectVersion": "v1", "ok": False, "failures": [
                "junk",
                {"check": "fatal:not-a-check", "message": "?"},
                {"check": "objectUnavailable", "message": "gone"},
                {"check": "recordCountMismatch", "message": "count", "actual": 4},
            ]},
            {"id": "s2", "objectVersion": "v2", "ok": False, "failures": [
                {"check": "sizeMismatch", "message": "size", "actual": 11},
            ]},
        ],
    )  # fmt: skip
    found = report.shard_findings((descriptor,))
    assert [(f.shard, f.check, f.expected, f.actual) for f in found] == [
        ("s1", Check.OBJECT_UNAVAILABLE, None, None),
        ("s1", Check.RECORD_COUNT_MISMATCH, 3, 4),
        ("s2", Check.SIZE_MISMATCH, None, 11),  # no descriptor for s2: nothing expected
    ]
    assert found[0].line() == "shard s1@v1: objectUnavailable: gone"
    assert found[1].line().endswith("count (expected 3, actual 4)")
    assert found[2].line().endswith("size (expected None, actual 11)")
    # A root the catalog does not know: findings without expected values, no error.
    unknown = failing_shards(ws, report)
    assert [(f.check, f.expected) for f in unknown][1] == (Check.RECORD_COUNT_MISMATCH, None)
