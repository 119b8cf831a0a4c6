"""Batch: calls that found the coordinator lock taken, applied together once it frees.

A progress report is microseconds of work under the coordinator lock, so the event loop
runs it inline when the lock is free. When the lock is taken (the sweeper's tick, a watch
pass in the pool), a hop to the thread pool per report cost more than the report itself:
a future, a condition and a wake-up each (at 4,096 hosts, ~14 % of the coordinator's GIL
samples while the sweeper ran). Here such calls wait in one queue and a single pool task
applies them in arrival order, up to ``BATCH_MAX`` per acquisition of the lock (the
sweeper is never held off for long), and hands the results back to the loop in one
callback.

A long pass that holds the lock (the sweeper's tick, a watch pass) calls
:meth:`LockBatch.apply_waiting` at the points where the coordinator's state is whole
(between a job's phases, between slices of cursors): the calls queued meanwhile are
applied there, by the thread that holds the lock, and a report waits for one phase
of the pass, not the whole of it (a tick at 4,096 hosts is ~140 ms; its longest phase,
the slowness judgment, ~40 ms).
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import threading
from collections.abc import Callable
from concurrent.futures import Executor
from typing import Any, TypeVar

T = TypeVar("T")

BATCH_MAX = 256  # calls applied per acquisition of the lock

# (the call, its future, and what it gave: a result or an exception)
_Done = tuple["asyncio.Future[Any]", Any, BaseException | None]


class LockBatch:
    def __init__(self, lock: threading.RLock, executor: Executor) -> None:
        self.lock = lock
        self.executor = executor
        # appended by the loop thread, taken by the pool task (deque ops are atomic)
        self.pending: collections.deque[tuple[Callable[[], Any], asyncio.Future[Any]]] = (
            collections.deque()
        )
        self.running = False  # a pool task drains; read and written on the loop thread only
        self.loop: asyncio.AbstractEventLoop | None = None  # the submitting loop (one)
        self.batches = 0  # figures for tests and benches
        self.calls = 0

    async def submit(self, fn: Callable[[], T]) -> T:
        """``fn()`` under the lock, in a batch; its exception, if any, is raised here."""
        loop = self.loop = asyncio.get_running_loop()
        future: asyncio.Future[T] = loop.create_future()
        self.pending.append((fn, future))
        if not self.running:
            self.running = True
            self._start(loop)
        return await future

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        try:
            loop.run_in_executor(self.executor, self._drain, loop)
        except RuntimeError as exc:  # the pool shut down (the server stops): fail them all
            self.running = False
            while self.pending:
                _, future = self.pending.popleft()
                if not future.done():
                    future.set_exception(exc)

    def _drain(self, loop: asyncio.AbstractEventLoop) -> None:
        """On the pool: one batch under the lock, then its results to the loop."""
        with self.lock:
            done = self._apply()
        loop.call_soon_threadsafe(self._deliver, loop, done)

    def _apply(self) -> list[_Done]:
        """Up to BATCH_MAX waiting calls, in arrival order (the caller holds the lock)."""
        done: list[_Done] = []
        while self.pending and len(done) < BATCH_MAX:
            fn, future = self.pending.popleft()
            try:
                done.append((future, fn(), None))
            except Exception as exc:  # handed to the caller, raised there
                done.append((future, None, exc))
        return done

    def apply_waiting(self) -> int:
        """From a thread that holds the lock, at a point where the state is whole: the calls
        waiting now (up to BATCH_MAX) applied here, their results handed to the loop; the
        pool task that waits for the lock finds fewer (or none) when it gets it. Returns
        how many ran."""
        loop = self.loop
        if not self.pending or loop is None:
            return 0
        with self.lock:  # reentrant: the caller's hold (taken here if it had none)
            done = self._apply()
        with contextlib.suppress(RuntimeError):  # the loop closed: nobody waits for them
            loop.call_soon_threadsafe(self._resolve, done)
        return len(done)

    def _resolve(self, done: list[_Done]) -> None:
        """On the loop: a batch's futures resolved (a caller that went away is skipped: its
        stream ended, the work is done anyway)."""
        self.batches += 1
        self.calls += len(done)
        for future, result, exc in done:
            if future.cancelled():
                continue
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(result)

    def _deliver(self, loop: asyncio.AbstractEventLoop, done: list[_Done]) -> None:
        """On the loop: the pool task's batch resolved; drain again if more came meanwhile."""
        self._resolve(done)
        if self.pending:
            self._start(loop)
        else:
            self.running = False


__all__ = ["BATCH_MAX", "LockBatch"]
