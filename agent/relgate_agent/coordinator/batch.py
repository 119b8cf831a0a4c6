"""Batch: calls that found the coordinator lock taken, applied together once it frees.

A progress report is microseconds of work under the coordinator lock, so the event loop
runs it inline when the lock is free. When the lock is taken (the sweeper's tick, a watch
pass in the pool), a hop to the thread pool per report cost more than the report itself:
a future, a condition and a wake-up each (at 4,096 hosts, ~14 % of the coordinator's GIL
samples while the sweeper ran). Here such calls wait in one queue and a single pool task
applies them in arrival order, up to ``BATCH_MAX`` per acquisition of the lock (the
sweeper is never held off for long), and hands the results back to the loop in one
callback.
"""

from __future__ import annotations

import asyncio
import collections
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
        self.batches = 0  # figures for tests and benches
        self.calls = 0

    async def submit(self, fn: Callable[[], T]) -> T:
        """``fn()`` under the lock, in a batch; its exception, if any, is raised here."""
        loop = asyncio.get_running_loop()
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
        done: list[_Done] = []
        with self.lock:
            while self.pending and len(done) < BATCH_MAX:
                fn, future = self.pending.popleft()
                try:
                    done.append((future, fn(), None))
                except Exception as exc:  # handed to the caller, raised there
                    done.append((future, None, exc))
        loop.call_soon_threadsafe(self._deliver, loop, done)

    def _deliver(self, loop: asyncio.AbstractEventLoop, done: list[_Done]) -> None:
        """On the loop: resolve the batch's futures; drain again if more came meanwhile."""
        self.batches += 1
        self.calls += len(done)
        for future, result, exc in done:
            if future.cancelled():
                continue  # the call went away (its stream ended): the work is done anyway
            if exc is not None:
                future.set_exception(exc)
            else:
                future.set_result(result)
        if self.pending:
            self._start(loop)
        else:
            self.running = False


__all__ = ["BATCH_MAX", "LockBatch"]
