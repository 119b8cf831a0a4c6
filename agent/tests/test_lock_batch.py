"""Calls that find the coordinator lock taken wait in one batch (coordinator/batch.py): a
real RLock held by another thread, a real pool, the event loop submitting."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor

import pytest

from relgate_agent.coordinator.batch import BATCH_MAX, LockBatch
from relgate_agent.errors import AgentError


def held_lock() -> tuple[threading.RLock, threading.Event, threading.Thread]:
    """A lock another thread holds until the returned event is set."""
    lock, taken, release = threading.RLock(), threading.Event(), threading.Event()

    def hold() -> None:
        with lock:
            taken.set()
            release.wait(10)

    t = threading.Thread(target=hold)
    t.start()
    taken.wait(5)
    return lock, release, t


def test_calls_that_found_the_lock_taken_run_together_in_arrival_order() -> None:
    lock, release, holder = held_lock()
    order: list[int] = []

    def call(i: int) -> int:
        assert lock._is_owned()  # type: ignore[attr-defined]  # under the lock, on the pool
        order.append(i)
        return i * i

    async def main() -> list[int]:
        with ThreadPoolExecutor(2) as pool:
            batch = LockBatch(lock, pool)
            tasks = [asyncio.create_task(batch.submit(lambda i=i: call(i))) for i in range(10)]
            await asyncio.sleep(0.2)
            assert order == []  # nothing runs while the lock is held
            release.set()
            got = await asyncio.gather(*tasks)
            # the pool task waited on the lock while the other nine queued: one batch
            assert batch.calls == 10 and batch.batches == 1
            assert not batch.running
            return got

    assert asyncio.run(main()) == [i * i for i in range(10)]
    assert order == list(range(10))
    holder.join()


def test_a_refusal_reaches_its_own_caller_only() -> None:
    lock, release, holder = held_lock()

    def refuse() -> int:
        raise AgentError("refused: test")

    async def main() -> tuple[object, ...]:
        with ThreadPoolExecutor(2) as pool:
            batch = LockBatch(lock, pool)
            tasks = [
                asyncio.create_task(batch.submit(lambda: 1)),
                asyncio.create_task(batch.submit(refuse)),
                asyncio.create_task(batch.submit(lambda: 3)),
            ]
            await asyncio.sleep(0.05)
            release.set()
            return tuple(await asyncio.gather(*tasks, return_exceptions=True))

    one, refused, three = asyncio.run(main())
    assert (one, three) == (1, 3)
    assert isinstance(refused, AgentError) and str(refused) == "refused: test"
    holder.join()


def test_a_caller_that_went_away_does_not_hold_up_the_others() -> None:
    """A call whose caller was cancelled (its stream ended) still runs; the batch's other
    callers get their results."""
    lock, release, holder = held_lock()
    ran: list[int] = []

    async def main() -> list[int]:
        with ThreadPoolExecutor(2) as pool:
            batch = LockBatch(lock, pool)
            tasks = [
                asyncio.create_task(batch.submit(lambda i=i: ran.append(i) or i)) for i in range(4)
            ]
            await asyncio.sleep(0.05)
            tasks[1].cancel()
            release.set()
            done = await asyncio.wait_for(asyncio.gather(tasks[0], tasks[2], tasks[3]), timeout=5)
            return list(done)

    assert asyncio.run(main()) == [0, 2, 3]
    assert ran == [0, 1, 2, 3]  # the abandoned call ran too (its report still landed)
    holder.join()


def test_a_batch_holds_the_lock_for_at_most_batch_max_calls() -> None:
    lock, release, holder = held_lock()
    sizes: list[int] = []
    current = [0]

    def call() -> None:
        current[0] += 1

    async def main() -> LockBatch:
        with ThreadPoolExecutor(2) as pool:
            batch = LockBatch(lock, pool)
            real_deliver = batch._deliver

            def deliver(loop: asyncio.AbstractEventLoop, done: list) -> None:  # type: ignore[type-arg]
                sizes.append(len(done))
                real_deliver(loop, done)

            batch._deliver = deliver  # type: ignore[method-assign]
            tasks = [asyncio.create_task(batch.submit(call)) for _ in range(BATCH_MAX + 50)]
            await asyncio.sleep(0.05)
            release.set()
            await asyncio.gather(*tasks)
            return batch

    batch = asyncio.run(main())
    assert current[0] == BATCH_MAX + 50
    assert max(sizes) <= BATCH_MAX and sum(sizes) == BATCH_MAX + 50
    assert batch.batches == len(sizes) >= 2
    holder.join()


def test_a_pool_that_shut_down_fails_the_waiting_calls() -> None:
    async def main() -> None:
        pool = ThreadPoolExecutor(1)
        pool.shutdown()
        batch = LockBatch(threading.RLock(), pool)
        with pytest.raises(RuntimeError):
            await batch.submit(lambda: 1)
        assert not batch.running and not batch.pending

    asyncio.run(main())


def test_the_holder_of_the_lock_applies_the_waiting_calls_up_to_batch_max() -> None:
    """A long pass that holds the lock lets the queued calls in at a point of its choosing
    (apply_waiting): they run on its thread, in order, at most BATCH_MAX at a time, and
    their callers (one refused) get their results while the pass still holds the lock."""
    lock = threading.RLock()
    holder_ids: list[int] = []
    applied: list[int] = []
    resolved_while_held = threading.Event()

    def refuse() -> int:
        raise AgentError("refused: test")

    async def main() -> tuple[object, ...]:
        with ThreadPoolExecutor(2) as pool:
            batch = LockBatch(lock, pool)
            assert batch.apply_waiting() == 0  # nothing submitted yet
            taken, go, done = threading.Event(), threading.Event(), threading.Event()

            def holder() -> None:
                with lock:
                    taken.set()
                    go.wait(10)
                    holder_ids.append(threading.get_ident())
                    applied.append(batch.apply_waiting())
                    applied.append(batch.apply_waiting())
                    applied.append(batch.apply_waiting())
                    resolved_while_held.wait(10)
                done.set()

            t = threading.Thread(target=holder)
            t.start()
            await asyncio.to_thread(taken.wait, 10)
            threads: list[int] = []
            n = BATCH_MAX + 3

            def call(i: int) -> int:
                threads.append(threading.get_ident())
                return i

            tasks = [asyncio.create_task(batch.submit(lambda i=i: call(i))) for i in range(n)]
            tasks.append(asyncio.create_task(batch.submit(refuse)))
            await asyncio.sleep(0.05)
            go.set()
            got = await asyncio.wait_for(asyncio.gather(*tasks, return_exceptions=True), 10)
            assert not done.is_set()  # every caller answered while the holder held on
            resolved_while_held.set()
            await asyncio.to_thread(t.join, 10)
            assert set(threads) == set(holder_ids)  # on the holder's thread, not the pool
            return tuple(got)

    got = asyncio.run(main())
    assert applied == [BATCH_MAX, 4, 0]
    assert got[:-1] == tuple(range(BATCH_MAX + 3))
    assert isinstance(got[-1], AgentError) and str(got[-1]) == "refused: test"


def test_nothing_waiting_schedules_nothing() -> None:
    """apply_waiting with an empty queue neither applies nor hands the loop a batch (the
    sweeper calls it between every two phases of every job)."""

    async def main() -> None:
        with ThreadPoolExecutor(1) as pool:
            batch = LockBatch(threading.RLock(), pool)
            assert await batch.submit(lambda: 7) == 7  # the loop is known from here on
            while batch.running:
                await asyncio.sleep(0.001)
            before = (batch.batches, batch.calls)
            assert batch.apply_waiting() == 0
            await asyncio.sleep(0.05)
            assert (batch.batches, batch.calls) == before

    asyncio.run(main())
