"""The byte log (relgate_agent.agent.bytelog): every count survives a killed process, each
record counts exactly once at every crash point of a checkpoint, and nothing hostile or
torn on disk counts (nor is followed)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from relgate_agent.agent import bytelog
from relgate_agent.agent.bytelog import (
    KIND_ORIGIN,
    KIND_RX,
    KIND_TX,
    ByteLog,
    CountedBytes,
)

JOB = "dj_1"


def _open(root: Path, job: str = JOB) -> tuple[ByteLog, CountedBytes]:
    log = ByteLog(root, job, threading.Lock())
    return log, log.open()


def _count(log: ByteLog, counted: CountedBytes, *records: tuple[str, int]) -> CountedBytes:
    """Append ``records`` as the job does (under its lock); the counters they make."""
    for kind, n in records:
        with log.lock:
            log.add(kind, n)
        counted = counted.plus(kind, n)
    return counted


def test_a_killed_process_loses_no_record_and_a_torn_one_counts_nothing(tmp_path: Path) -> None:
    log, before = _open(tmp_path)
    assert before == CountedBytes(JOB)
    want = _count(log, before, (KIND_ORIGIN, 1 << 20), (KIND_RX, 65536), (KIND_TX, 70000))
    # killed: never closed, never checkpointed; a power loss could tear the last record
    (log.dir / f"log.{log.gen}").open("ab").write(b"o12")
    second, got = _open(tmp_path)
    assert got == want == CountedBytes(JOB, rx=65536, tx=70000, origin=1 << 20)
    assert second.gen == log.gen + 1  # its records go to a log of its own
    _, again = _open(tmp_path)
    assert again == want


def test_each_record_counts_once_at_every_crash_point_of_a_checkpoint(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log, counted = _open(tmp_path)
    counted = _count(log, counted, (KIND_ORIGIN, 100), (KIND_RX, 10))
    # killed after the switch to a new log, before the base was written: base + both logs
    with monkeypatch.context() as m:
        m.setattr(ByteLog, "_write_base", lambda *a: (_ for _ in ()).throw(OSError("EIO")))
        log.checkpoint(lambda: counted)
    counted = _count(log, counted, (KIND_ORIGIN, 7))
    assert _open(tmp_path)[1] == counted
    # a whole checkpoint: the base holds it all, the older logs are gone
    log.checkpoint(lambda: counted)
    names = sorted(p.name for p in log.dir.iterdir())
    assert names == ["base.json", f"log.{log.gen}"], names
    assert json.loads((log.dir / "base.json").read_text())["origin"] == 107
    counted = _count(log, counted, (KIND_TX, 5))
    # killed after the base was written, before an older log was unlinked: not read again
    (log.dir / f"log.{log.gen - 1}").write_bytes(b"o100\n")
    assert _open(tmp_path)[1] == counted == CountedBytes(JOB, rx=10, tx=5, origin=107)
    log.close()
    with log.lock:
        log.add(KIND_RX, 1)  # a late count of a stopped job: dropped, never written
    assert _open(tmp_path)[1] == counted


def test_another_jobs_or_a_hostile_base_counts_nothing(tmp_path: Path) -> None:
    log, counted = _open(tmp_path)
    _count(log, counted, (KIND_RX, 3))
    base = log.dir / "base.json"
    for doc in (
        {"jobId": "dj_other", "gen": 0, "rx": 99, "tx": 0, "origin": 0},
        {"jobId": JOB, "gen": 0, "rx": -5, "tx": 0, "origin": 0},
        {"jobId": JOB, "gen": "x", "rx": 1},
        ["not", "a", "dict"],
    ):
        base.write_text(json.dumps(doc))
        got = _open(tmp_path)[1]
        assert got.rx == 3 and got.tx == 0 and got.origin == 0, (doc, got)
    base.write_text("{torn")
    assert _open(tmp_path)[1].rx == 3
    # another job's counters live elsewhere: its log never lends a byte
    assert _open(tmp_path, "dj_2")[1] == CountedBytes("dj_2")
    bytelog.remove(tmp_path, JOB)
    assert _open(tmp_path)[1] == CountedBytes(JOB)


def test_a_planted_symlink_is_never_followed(tmp_path: Path) -> None:
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    root = tmp_path / "models"
    root.mkdir()
    os.symlink(elsewhere, root / bytelog.COUNTS_DIR)
    log, counted = _open(root)
    assert counted == CountedBytes(JOB)
    with log.lock:
        log.add(KIND_RX, 10)  # nothing open: nothing written through the link
    assert list(elsewhere.iterdir()) == []
