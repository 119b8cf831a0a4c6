"""Byte counters that survive a SIGKILL: a base snapshot and an append-only log per job.

``<models-root>/.agent-counts/<sha256(job)[:32]>/`` holds

- ``base.json``: ``{"jobId", "gen", "rx", "tx", "origin"}``, the job's cumulative counters
  on this host from every log generation below ``gen``; replaced atomically (write, fsync,
  rename, fsync the directory) at each :meth:`ByteLog.checkpoint` (every journal interval);
- ``log.<gen>``: one small record per count, ``<kind><bytes>\\n`` (kind ``r`` received from a
  peer, ``t`` sent, ``o`` read from the origin): per origin range read, per block received,
  per frame sent. Appended with one ``write`` and never fsynced.

Each record is appended under the job lock, in the same critical section that raises the
in-memory counter, so the log and the counters agree. A killed process (SIGKILL) loses no
record it wrote (the kernel holds the page): a restarted agent goes on from exactly what it
counted, short only of what was in flight (an origin range or a block not yet off the wire).
A power loss loses at most the records since the last checkpoint. Restore sums the base and
every complete record of ``log.<k>``, ``k >= gen`` (a torn last line counts nothing). A
checkpoint snapshots the counters and starts ``log.<gen+1>`` under the lock, then writes the
base with ``gen+1``, then unlinks the older logs: at every crash point each record counts
exactly once.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import os
import re
import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from relgate_trust.fstree import UnsafePathError, mkdirs_beneath, open_beneath, open_dir

from relgate_agent.staging.storage import fsync_dir

log = logging.getLogger(__name__)

COUNTS_DIR = ".agent-counts"
KIND_RX, KIND_TX, KIND_ORIGIN = "r", "t", "o"
_RECORD = re.compile(rb"([rto])(\d{1,15})\n")
MAX_LOG_BYTES = 64 << 20  # a log this long is not ours (or not sane): read no further
STALE_S = 7 * 24 * 3600.0  # a job's counts untouched this long are dropped at agent start


@dataclass(frozen=True)
class CountedBytes:
    """A job's byte counters on this host: received from peers, sent, read from the origin."""

    job_id: str = ""
    rx: int = 0
    tx: int = 0
    origin: int = 0

    def plus(self, kind: str, n: int) -> CountedBytes:
        if kind == KIND_RX:
            return replace(self, rx=self.rx + n)
        if kind == KIND_TX:
            return replace(self, tx=self.tx + n)
        return replace(self, origin=self.origin + n)


def job_dir(models_root: Path, job_id: str) -> Path:
    """Where ``job_id``'s counters live (hashed: a job id is never a path component)."""
    return models_root / COUNTS_DIR / hashlib.sha256(job_id.encode()).hexdigest()[:32]


class ByteLog:
    """One job's counter log on this host; ``lock`` is the job lock, held by the callers of
    :meth:`add` (the counters and their records change together)."""

    def __init__(self, models_root: Path, job_id: str, lock: threading.Lock) -> None:
        self.root, self.job_id, self.lock = models_root, job_id, lock
        self.dir = job_dir(models_root, job_id)
        self._rel = f"{COUNTS_DIR}/{self.dir.name}"
        self.gen = 0
        self._fd: int | None = None
        self._checkpointing = threading.Lock()

    def open(self) -> CountedBytes:
        """What earlier processes counted for this job (base + logs), then a new generation
        for this process's records. Nothing counted (and no appends) when it cannot open."""
        try:
            base_fd = open_dir(self.root)
            try:
                os.close(mkdirs_beneath(base_fd, self.root, self._rel.split("/")))
            finally:
                os.close(base_fd)
            counted, last = self._restore()
            self.gen = last + 1  # past every log an earlier process wrote
            self._fd = self._open_log(self.gen)
        except (OSError, UnsafePathError) as exc:
            log.warning("job %s: byte counters not journaled (%s)", self.job_id, exc)
            return CountedBytes(self.job_id)
        return counted

    def add(self, kind: str, n: int) -> None:
        """Append one record (caller holds the job lock); a failed write is logged only."""
        if self._fd is None or n <= 0:
            return
        try:
            os.write(self._fd, f"{kind}{n}\n".encode())
        except OSError as exc:  # ENOSPC, EIO: the next checkpoint writes the counters whole
            log.warning("job %s: counter record not written (%s)", self.job_id, exc)

    def checkpoint(self, snapshot: Callable[[], CountedBytes]) -> None:
        """Fold the logs into the base: ``snapshot()`` (the cumulative counters) and the
        switch to a new log generation happen under the job lock."""
        with self._checkpointing:
            if self._fd is None:
                return
            with self.lock:
                counted = snapshot()
                old = self.gen
                try:
                    fd = self._open_log(old + 1)
                except (OSError, UnsafePathError) as exc:
                    log.warning("job %s: counter log not rotated (%s)", self.job_id, exc)
                    return
                os.close(self._fd)
                self._fd, self.gen = fd, old + 1
            try:
                self._write_base(counted, old + 1)
            except OSError as exc:  # the logs still hold every record: nothing is lost
                log.warning("job %s: counter base not written (%s)", self.job_id, exc)
                return
            for name in os.listdir(self.dir):
                k = _log_gen(name)
                if k is not None and k <= old:
                    with contextlib.suppress(OSError):
                        os.unlink(self.dir / name)

    def close(self) -> None:
        """No more records (a late count of a stopped job's thread is dropped)."""
        with self._checkpointing, self.lock:
            if self._fd is not None:
                os.close(self._fd)
                self._fd = None

    # -------------------------------------------------------------------------------
    def _open_log(self, gen: int) -> int:
        fd = open_dir(self.root)
        try:
            flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT
            return open_beneath(fd, self.root, f"{self._rel}/log.{gen}", flags)
        finally:
            os.close(fd)

    def _read(self, name: str) -> bytes:
        fd = open_dir(self.root)
        try:
            f = open_beneath(fd, self.root, f"{self._rel}/{name}", os.O_RDONLY)
        finally:
            os.close(fd)
        with os.fdopen(f, "rb") as fh:
            return fh.read(MAX_LOG_BYTES)

    def _restore(self) -> tuple[CountedBytes, int]:
        """The counters (base + complete records of its generation and later) and the
        highest log generation found."""
        counted, gen = CountedBytes(self.job_id), 0
        # a torn or hostile base counts nothing (the logs it folded are gone: an undercount)
        with contextlib.suppress(FileNotFoundError, ValueError, TypeError):
            doc = json.loads(self._read("base.json"))
            if isinstance(doc, dict) and doc.get("jobId") == self.job_id:
                figures = [max(int(doc.get(k, 0)), 0) for k in ("gen", "rx", "tx", "origin")]
                gen, counted = figures[0], CountedBytes(self.job_id, *figures[1:])
        gens = sorted(k for name in os.listdir(self.dir) if (k := _log_gen(name)) is not None)
        for k in gens:
            if k >= gen:
                for m in _RECORD.finditer(self._read(f"log.{k}")):
                    counted = counted.plus(m.group(1).decode(), int(m.group(2)))
        return counted, max([gen, *gens])

    def _write_base(self, counted: CountedBytes, gen: int) -> None:
        doc = {"jobId": self.job_id, "gen": gen, "rx": counted.rx, "tx": counted.tx}
        doc["origin"] = counted.origin
        tmp = self.dir / "base.tmp"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        fd = open_dir(self.root)
        try:
            out = open_beneath(
                fd, self.root, f"{self._rel}/base.tmp", os.O_WRONLY | os.O_CREAT | os.O_EXCL
            )
        finally:
            os.close(fd)
        with os.fdopen(out, "wb") as fh:
            fh.write(json.dumps(doc, sort_keys=True).encode())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.dir / "base.json")
        fsync_dir(self.dir)


def _log_gen(name: str) -> int | None:
    head, _, tail = name.partition(".")
    return int(tail) if head == "log" and tail.isdigit() else None


def remove(models_root: Path, job_id: str) -> None:
    """Drop a job's counters (it ended and is no longer listed for this host)."""
    shutil.rmtree(job_dir(models_root, job_id), ignore_errors=True)


def drop_stale(models_root: Path, max_age_s: float = STALE_S) -> None:
    """Drop the counters of jobs untouched for ``max_age_s`` (ended while the agent was down)."""
    root = models_root / COUNTS_DIR
    with contextlib.suppress(OSError):
        for d in root.iterdir():
            with contextlib.suppress(OSError):
                if not d.is_symlink() and time.time() - d.stat().st_mtime > max_age_s:
                    shutil.rmtree(d, ignore_errors=True)


__all__ = [
    "COUNTS_DIR",
    "KIND_ORIGIN",
    "KIND_RX",
    "KIND_TX",
    "ByteLog",
    "CountedBytes",
    "drop_stale",
    "job_dir",
    "remove",
]
