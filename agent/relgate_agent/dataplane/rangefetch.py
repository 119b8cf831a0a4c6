"""Parallel range GETs from the origin: N ranges in flight per stripe root, in order.

A stripe root reads its stripe as ranges of contiguous blocks (at most ``range_bytes``
each: with the default 64 MiB chunks, one chunk per range) and keeps up to ``parallel`` of
them in flight on a thread pool; results are yielded **in order**, so the chunk pipeline
(CRC, write, hash, forward) sees the stripe exactly as a serial read would. Memory is
bounded by ``parallel`` x ``range_bytes`` (plus the range being consumed). Each range is
retried on its own (``relgate_trust.retry``: tenacity) and a range that still fails raises
:class:`OriginError` naming it; closing the iterator (a rewired stripe, a stopped job)
cancels the ranges not started.

Defaults by origin kind: S3 16 x 64 MiB (one GET per object part is throughput-bound per
connection, so S3 wants many); HTTP 4 x 16 MiB; a local or mounted directory 2 x 16 MiB
(``pread`` on one disk gains little from more).
"""

from __future__ import annotations

import threading
from collections import deque
from collections.abc import Callable, Generator, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar
from urllib.parse import urlparse

from relgate_trust.retry import Backoff, retry_call

from relgate_agent.errors import OriginError

MIB = 1 << 20
RANGE_BACKOFF = Backoff(0.2, 5.0)
RANGE_ATTEMPTS = 5

T = TypeVar("T")


@dataclass(frozen=True)
class RangePlan:
    """How many ranges a stripe root keeps in flight, and how large each is."""

    parallel: int
    range_bytes: int
    attempts: int = RANGE_ATTEMPTS

    @classmethod
    def for_origin(cls, uri: str, parallel: int = 0, range_bytes: int = 0) -> RangePlan:
        """The default for the origin's kind; ``parallel`` / ``range_bytes`` > 0 override."""
        scheme = urlparse(uri).scheme
        if scheme == "s3":
            p, r = 16, 64 * MIB
        elif scheme in ("http", "https"):
            p, r = 4, 16 * MIB
        else:
            p, r = 2, 16 * MIB
        return cls(parallel or p, range_bytes or r)


def plan_ranges(
    blocks: Iterable[int],
    block_range: Callable[[int], tuple[int, int]],
    range_bytes: int | Callable[[], int],
) -> Iterator[tuple[list[int], int, int]]:
    """Group ``blocks`` (in order) into ranges of byte-contiguous blocks of at most
    ``range_bytes`` (a block larger than that is a range of its own):
    ``(blocks, offset, length)``. A callable ``range_bytes`` is asked for each range (a
    paced stripe root: at most one second of its origin share, which changes)."""
    limit = range_bytes if callable(range_bytes) else (lambda: range_bytes)
    cur: list[int] = []
    start = end = 0
    for b in blocks:
        off, n = block_range(b)
        if cur and (off != end or end + n - start > limit()):
            yield cur, start, end - start
            cur = []
        if not cur:
            start = off
        cur.append(b)
        end = off + n
    if cur:
        yield cur, start, end - start


class ParallelRanges:
    """Reads ranges with ``plan.parallel`` in flight, yielding ``(tag, bytes)`` in order."""

    def __init__(
        self,
        read: Callable[[int, int], bytes],
        plan: RangePlan,
        stop_event: threading.Event | None = None,
        on_retry: Callable[[BaseException, int], None] | None = None,
    ) -> None:
        self.read, self.plan, self.stop = read, plan, stop_event
        self.on_retry = on_retry

    def _one(self, offset: int, length: int) -> bytes:
        try:
            return retry_call(
                lambda: self.read(offset, length),
                retry_on=OriginError,
                backoff=RANGE_BACKOFF,
                attempts=self.plan.attempts,
                stop_event=self.stop,
                on_retry=self.on_retry,
            )
        except OriginError as exc:
            raise OriginError(
                f"origin range {offset}+{length} failed {self.plan.attempts} tries: {exc}"
            ) from exc

    def fetch(
        self,
        ranges: Iterable[tuple[T, int, int]],
        pace: Callable[[int], None] = lambda n: None,
    ) -> Generator[tuple[T, bytes], None, None]:
        """``ranges``: ``(tag, offset, length)``; ``pace(length)`` runs before each range is
        started (the stripe's token bucket), so in-flight reads are paced too."""
        pool = ThreadPoolExecutor(self.plan.parallel, thread_name_prefix="origin-range")
        pending: deque[tuple[T, Future[bytes]]] = deque()
        it = iter(ranges)
        try:
            while True:
                while len(pending) < self.plan.parallel:
                    nxt = next(it, None)
                    if nxt is None:
                        break
                    tag, off, n = nxt
                    pace(n)
                    pending.append((tag, pool.submit(self._one, off, n)))
                if not pending:
                    return
                tag, fut = pending.popleft()
                yield tag, fut.result()
        finally:
            for _, fut in pending:
                fut.cancel()
            pool.shutdown(wait=False, cancel_futures=True)


__all__ = ["MIB", "ParallelRanges", "RangePlan", "plan_ranges"]
