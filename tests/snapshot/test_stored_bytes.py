"""Validation recomputes from the stored bytes (issue 28, item 1).

The stored membership object is truncated on disk after a build without validation:
validation re-hashes the exact stored version and refuses it (``storage-digest``, key,
version, expected and actual named) whatever the local cache holds.  A damaged cache file
is only a cache fault: rebuilt, never a finding.  The next build of the same content
repairs the stored object with a new version and records the fault.
"""

import json
import subprocess
import sys

from relgate_trust.digests import sha256_digest
from support.releases import overwrite_in_place
from support.snapshots import build

from relgate.catalog.db import rows
from relgate.integrity.digests import hex_of
from relgate.objects.layout import membership_key
from relgate.snapshot.validate import validate_snapshot

CLI = (sys.executable, "-m", "relgate.cli")


def _stored_members(ws, result):
    ref = result.manifest.members_ref
    return ref, ws.store.local_path(membership_key(ref.digest), ref.version_id)


def _truncate(path):
    data = path.read_bytes()
    overwrite_in_place(path, data[: len(data) // 2])
    return sha256_digest(data[: len(data) // 2])


def test_validate_rehashes_the_stored_object_not_the_cache(ws):
    result = build(ws)  # snapshot build --no-validate
    ref, stored = _stored_members(ws, result)
    cached = ws.membership.path(ref)  # the cache holds the good bytes
    actual = _truncate(stored)
    proc = subprocess.run(
        [*CLI, "--home", str(ws.home), "snapshot", "validate", result.digest, "--json"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 3, (proc.stdout, proc.stderr)
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["check"] == "fatal:storage-digest", out
    key = membership_key(ref.digest)
    named = f"object={key}@{ref.version_id} check=storage-digest digest={ref.digest}"
    assert any(named in p and f"actual={actual}" in p for p in out["problems"]), out
    assert cached.read_bytes() != stored.read_bytes()  # the cache was never the witness


def test_a_damaged_cache_is_rebuilt_and_is_no_finding(ws):
    result = build(ws)
    ref, _ = _stored_members(ws, result)
    cached = ws.membership.path(ref)
    cached.write_bytes(b"not a parquet file")
    report = validate_snapshot(ws, result.digest, actor="t")
    assert report.outcome == "VALIDATED", (report.checks, report.problems)
    assert sha256_digest(cached.read_bytes()) == ref.digest  # rebuilt from the store
    # damaged again after a read in this process: still caught (inode/time change)
    cached.write_bytes(b"x")
    assert ws.membership.read(ref).height == result.manifest.member_count
    assert cached.name == hex_of(ref.digest)


def test_a_faulty_stored_object_is_repaired_by_the_next_build(ws):
    first = build(ws)
    ref, stored = _stored_members(ws, first)
    actual = _truncate(stored)
    second = build(ws)  # the same content: no longer blocked
    again = second.manifest.members_ref
    assert (again.digest, again.size) == (ref.digest, ref.size)
    assert again.version_id != ref.version_id
    assert validate_snapshot(ws, second.digest, actor="t").outcome == "VALIDATED"
    with ws.db.tx() as conn:
        events = rows(conn, "SELECT * FROM gate_events WHERE operation = 'storage-repair'")
    assert [(e["check_name"], e["digest"], e["outcome"]) for e in events] == [
        ("storage-digest", ref.digest, "ok")
    ]
    subject = events[0]["subject"]
    assert subject.startswith(f"{membership_key(ref.digest)}@{ref.version_id} ")
    assert f"actual={actual}" in subject and f"repaired={again.version_id}" in subject
    # the faulty version is left as it was, and the first snapshot still names it
    assert validate_snapshot(ws, first.digest, actor="t").outcome == "REJECTED"


def test_a_stored_object_larger_than_its_recorded_size_is_refused_unread(ws):
    result = build(ws)
    ref, stored = _stored_members(ws, result)
    overwrite_in_place(stored, stored.read_bytes() + b"\0" * 4096)
    report = validate_snapshot(ws, result.digest, actor="t")
    assert report.outcome == "REJECTED"
    assert report.checks["fatal:size-mismatch"] == 1, report.checks
    assert f"expected={ref.size} actual={ref.size + 4096}" in " ".join(report.problems)


def test_a_link_or_directory_in_the_cache_is_replaced_never_followed(ws, tmp_path):
    result = build(ws)
    ref, stored = _stored_members(ws, result)
    cached = ws.membership.cache_dir / hex_of(ref.digest)
    cached.parent.mkdir(parents=True, exist_ok=True)
    outside = tmp_path / "outside"
    outside.write_bytes(stored.read_bytes())  # the right bytes, but not the cache's own file
    cached.symlink_to(outside)
    assert ws.membership.read(ref).height == result.manifest.member_count
    assert not cached.is_symlink() and outside.exists()
    cached.unlink()
    cached.mkdir()
    (cached / "x").write_bytes(b"x")
    assert ws.membership.read(ref).height == result.manifest.member_count
    assert cached.is_file()
