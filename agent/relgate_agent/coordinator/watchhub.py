"""Watch hub: the coordinator's open watch streams, fed in coalesced batches.

Every agent holds one server-streaming ``Watch``. The coordinator logic stays synchronous
(one lock, durable state in the store); its change feed pokes the hub from whichever thread
changed something. The hub's single flusher task waits ``coalesce_s`` after a poke, so a
burst of topology changes (a splice, a late join, a demotion) becomes one push per host, then
computes what every open stream has not been told in one pass under the lock (on the RPC
thread pool, never on the event loop) and hands each stream its update. A stream whose agent
reads slowly never holds anything up: its unsent update is merged with the next one.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable
from concurrent.futures import Executor

from relgate_agent.contracts import WatchCursor, WatchUpdate
from relgate_agent.coordinator.jobstate import NotLeader
from relgate_agent.errors import AgentError

log = logging.getLogger(__name__)

COALESCE_S = 0.05  # changes within this window share one push
MAX_WAIT_S = 1.0  # the longest a change waits behind the last pass's cost
RECHECK_S = 2.0  # every open stream's certificate is looked at this often


class WatchClosed(AgentError):
    """The hub ended this stream (leadership lost, shutting down): the agent reconnects."""


class Watcher:
    """One open watch stream: its cursor and the update waiting to be sent."""

    def __init__(self, cursor: WatchCursor, refused: Callable[[], bool] | None = None) -> None:
        self.cursor = cursor
        self.fresh = True  # not computed yet: its first update (the job list) is owed
        self.pending: WatchUpdate | None = None
        self.closed = ""
        self.refused = refused  # the caller's certificate must not be honoured any more
        self._recheck = False
        self._ready = asyncio.Event()

    def flag_recheck(self) -> None:
        """Wake the stream to look at its caller's certificate again (the hub's sweep)."""
        self._recheck = True
        self._ready.set()

    def take_recheck(self) -> bool:
        flagged, self._recheck = self._recheck, False
        return flagged

    def push(self, update: WatchUpdate) -> None:
        self.pending = update if self.pending is None else self.pending.merged(update)
        self._ready.set()

    def close(self, reason: str) -> None:
        self.closed = reason
        self._ready.set()

    async def next(self, timeout: float) -> WatchUpdate | None:
        """The next update, or None when ``timeout`` passes first; WatchClosed when ended."""
        try:
            await asyncio.wait_for(self._ready.wait(), max(timeout, 0.0))
        except TimeoutError:
            return None
        self._ready.clear()
        if self.closed:
            raise WatchClosed(self.closed)
        update, self.pending = self.pending, None
        return update


class WatchHub:
    def __init__(
        self,
        compute: Callable[[list[WatchCursor]], list[WatchUpdate | None]],
        executor: Executor,
        coalesce_s: float = COALESCE_S,
        generation: Callable[[], int] | None = None,
        recheck_s: float = RECHECK_S,
    ) -> None:
        self._compute = compute
        self.recheck_s = recheck_s  # how often every open stream's certificate is looked at
        # the change feed's counter: a pass with no change since the last one computes only
        # the streams that just opened (a reconnect storm is not 4,096 x 4,096 work)
        self._generation = generation
        self._seen: int | None = None
        self._executor = executor
        self.coalesce_s = coalesce_s
        self.watchers: set[Watcher] = set()
        self.flushes = 0  # batches computed (figures for the load test)
        self.pushes = 0  # updates handed to streams
        self._loop: asyncio.AbstractEventLoop | None = None
        self._wake: asyncio.Event | None = None
        self._task: asyncio.Task[None] | None = None
        self._sweeper: asyncio.Task[None] | None = None
        self._pass_s = 0.0  # how long the last pass took to compute (the next one waits)

    # ------------------------------------------------------------------ lifecycle (loop thread)
    def start(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._wake = asyncio.Event()
        self._task = self._loop.create_task(self._flusher(), name="watch-hub")
        self._sweeper = self._loop.create_task(self._cert_sweep(), name="watch-hub-certs")

    async def stop(self, reason: str) -> None:
        for w in list(self.watchers):
            w.close(reason)
        for task in (self._task, self._sweeper):
            if task is not None:
                task.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await task

    # ------------------------------------------------------------------ any thread
    def poke_threadsafe(self) -> None:
        """The change feed's subscriber: never blocks, may run on any thread."""
        loop = self._loop
        if loop is not None and not loop.is_closed():
            # RuntimeError: the loop closed meanwhile, nobody is watching
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(self.poke)

    # ------------------------------------------------------------------ loop thread
    def poke(self) -> None:
        if self._wake is not None:
            self._wake.set()

    def add(self, cursor: WatchCursor, refused: Callable[[], bool] | None = None) -> Watcher:
        w = Watcher(cursor, refused)
        self.watchers.add(w)
        self.poke()  # its first update (the job list) comes from the flusher like every other
        return w

    def remove(self, w: Watcher) -> None:
        self.watchers.discard(w)

    async def _cert_sweep(self) -> None:
        """One pass over every open stream each ``recheck_s`` (a cached look per stream,
        microseconds), waking only those whose certificate is refused now: not one timer
        per stream (4,096 wake-ups every 2 s)."""
        while True:
            await asyncio.sleep(self.recheck_s)
            for w in list(self.watchers):
                if w.refused is not None and not w.closed and w.refused():
                    w.flag_recheck()

    async def _flusher(self) -> None:
        wake, loop = self._wake, self._loop
        if wake is None or loop is None:
            return
        while True:
            await wake.wait()
            # a pass over a big fleet costs (0.1-0.4 s at 4,096 hosts): the next one waits
            # that long again at least, so a storm of changes (registrations, splices) gets
            # at most half the coordinator, and every change still reaches every stream
            await asyncio.sleep(max(self.coalesce_s, self._pass_s))
            wake.clear()  # a change from here on is seen by this pass or pokes the next
            gen = self._generation() if self._generation is not None else None
            watchers = [w for w in self.watchers if not w.closed]
            if gen is not None and gen == self._seen:
                watchers = [w for w in watchers if w.fresh]
            if not watchers:
                continue
            cursors = [w.cursor for w in watchers]
            started = loop.time()
            try:
                updates = await loop.run_in_executor(self._executor, self._compute, cursors)
            except NotLeader as exc:
                for w in watchers:
                    w.close(str(exc))
                continue
            except Exception as exc:  # a bug must not end every watch for good: log, retry
                log.exception(
                    "watch hub: computing %d updates failed (%s)", len(cursors), type(exc).__name__
                )
                await asyncio.sleep(1.0)
                wake.set()
                continue
            self.flushes += 1
            self._pass_s = min(loop.time() - started, MAX_WAIT_S)
            self._seen = gen  # read before computing: a change meanwhile makes the next pass whole
            for w, u in zip(watchers, updates, strict=True):
                w.fresh = False
                if u is not None:
                    self.pushes += 1
                    w.push(u)


__all__ = ["COALESCE_S", "MAX_WAIT_S", "RECHECK_S", "WatchClosed", "WatchHub", "Watcher"]
