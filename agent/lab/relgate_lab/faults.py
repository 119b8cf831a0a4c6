"""Faults: RELGATE_AGENT_FAULT parsed into :class:`relgate_agent.hooks.Hooks` for one agent.

``RELGATE_AGENT_FAULT=name=value,...`` with

- ``corrupt_send=<block>[:<times>]`` (read by the *sending* agent): flip a byte of that block
  on the wire, after it was read from disk, so receivers must catch it; ``corrupt_send=all``
  flips a byte of every block it sends, for good (a host with bad memory);
- ``corrupt_disk_chunk=<c>`` (the *receiving* agent): flip a byte of chunk ``c`` on disk
  right after its last block is written (once per job), like a bad disk would;
- ``pause_before_place=<gate>[:<times>]``: stop before each of the first ``<times>``
  placements of a job, write ``<gate>.waiting`` (the staging tree) and wait until ``<gate>``
  exists (the test changes staging meanwhile), so a flip between verification and rename
  is real;
- ``stall_send=<block>:<seconds>`` (the *sending* agent): every send of that block (stripe
  stream or FetchChunk) waits that long first, frames and heartbeats included: an upstream
  that holds the block and stalls on it (a hung disk read, a wedged sender thread).
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Mapping
from pathlib import Path

from relgate_agent.hooks import Hooks, JobHooks, StagingFile

FAULT_ENV = "RELGATE_AGENT_FAULT"
PAUSE_LIMIT_S = 120.0

log = logging.getLogger(__name__)


def parse_faults(spec: str) -> dict[str, str]:
    """``name=value,...`` as a mapping (later items win)."""
    out: dict[str, str] = {}
    for item in filter(None, spec.split(",")):
        key, _, value = item.partition("=")
        out[key] = value
    return out


class LabJobHooks(JobHooks):
    def __init__(self, disk_chunk: int, pause_gate: str, pauses: int) -> None:
        self.disk_chunk = disk_chunk
        self.pause_gate = pause_gate
        self.pauses = pauses

    def chunk_written(self, chunk: int, offset: int, staging: StagingFile) -> None:
        if chunk != self.disk_chunk:
            return
        self.disk_chunk = -1
        log.warning("fault hook: corrupting chunk %d on disk", chunk)
        staging.pwrite(offset, bytes([staging.pread(offset, 1)[0] ^ 0xFF]))

    def before_place(self, staging_tree: Path, stop: threading.Event) -> None:
        if self.pauses <= 0:
            return
        self.pauses -= 1
        gate = Path(self.pause_gate)
        waiting = gate.with_name(gate.name + ".waiting")
        waiting.write_text(str(staging_tree))
        deadline = time.monotonic() + PAUSE_LIMIT_S
        while not gate.exists() and time.monotonic() < deadline and not stop.is_set():
            time.sleep(0.05)
        with contextlib.suppress(OSError):
            waiting.unlink()  # first: a test sees the gate consumed only after this
        with contextlib.suppress(OSError):
            gate.unlink()


class LabHooks(Hooks):
    def __init__(self, faults: Mapping[str, str]) -> None:
        self.faults = dict(faults)
        block, _, times = self.faults.get("corrupt_send", "").partition(":")
        self.corrupt_all = block == "all"
        self.corrupt_block = int(block) if block and not self.corrupt_all else -1
        self.corrupt_remaining = int(times or 1) if block else 0
        self.lock = threading.Lock()
        stall, _, secs = self.faults.get("stall_send", "").partition(":")
        self.stall_block = int(stall) if stall else -1
        self.stall_s = min(float(secs or 0), PAUSE_LIMIT_S)

    def wire_block(self, block: int, data: bytes) -> bytes:
        if block == self.stall_block:
            log.warning("fault hook: stalling %.1f s before sending block %d", self.stall_s, block)
            time.sleep(self.stall_s)
        if self.corrupt_all:
            return _flipped(data)
        if block != self.corrupt_block:
            return data
        with self.lock:
            if self.corrupt_remaining <= 0:
                return data
            self.corrupt_remaining -= 1
        log.warning("fault hook: corrupting block %d on the wire", block)
        return _flipped(data)

    def job(self, job_id: str) -> JobHooks:
        gate, _, times = self.faults.get("pause_before_place", "").partition(":")
        return LabJobHooks(
            int(self.faults.get("corrupt_disk_chunk") or -1),
            gate,
            int(times or 1) if gate else 0,
        )


def _flipped(data: bytes) -> bytes:
    b = bytearray(data)
    b[len(b) // 2] ^= 0xFF
    return bytes(b)


def hooks_from_env(env: Mapping[str, str] | None = None) -> LabHooks:
    return LabHooks(parse_faults((os.environ if env is None else env).get(FAULT_ENV, "")))
