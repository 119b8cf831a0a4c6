"""The watch hub on a real event loop over the real coordinator logic (SQLite, signed manifest)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import TrustedKeys

from relgate_agent.contracts import WatchCursor, WatchUpdate
from relgate_agent.coordinator.changefeed import ChangeFeed
from relgate_agent.coordinator.service import Coordinator, CoordinatorConfig
from relgate_agent.coordinator.watchhub import WatchClosed, WatchHub

HOSTS = {f"h{i}": f"r{i % 2}" for i in range(4)}


@pytest.fixture
def coord(tmp_path: Path, checkpoint):
    c = Coordinator(
        CoordinatorConfig(
            db=str(tmp_path / "c.sqlite"), trusted_keys=TrustedKeys.load(checkpoint["trusted"])
        )
    )
    for h, r in HOSTS.items():
        c.enroll(h, r, {"pool": "x"})
        c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
    yield c
    c.store.close()


def _spec(checkpoint) -> JobSpec:
    return JobSpec(
        model="claude-x",
        version="2026-10-12.3",
        manifest_uri=str(checkpoint["envelope"]),
        target_selector="pool=x",
        stripes=2,
    )


class Counting:
    """The coordinator's batch computation, counted (how many passes the hub made)."""

    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord
        self.calls: list[int] = []
        self.fail = 0

    def __call__(self, cursors: list[WatchCursor]) -> list[WatchUpdate | None]:
        if self.fail:  # an injected bug in the computation: it raises, once per count
            self.fail -= 1
            raise RuntimeError("injected: the batch computation failed")
        self.calls.append(len(cursors))
        return self.coord.watch_updates(cursors)


def test_a_burst_of_changes_is_one_pass_and_one_push_per_stream(
    coord: Coordinator, checkpoint
) -> None:
    compute = Counting(coord)

    async def scenario() -> None:
        with ThreadPoolExecutor(2) as pool:
            hub = WatchHub(
                compute, pool, coalesce_s=0.05, generation=lambda: coord.changed.generation
            )
            hub.start()
            coord.changed.subscribe(hub.poke_threadsafe)
            try:
                ws = [hub.add(WatchCursor(h)) for h in HOSTS]
                firsts = [await w.next(30) for w in ws]
                assert all(u is not None and u.jobs == () for u in firsts)
                assert compute.calls == [4]  # four streams opened at once: one pass
                # a job, then many changes in the same instant: one more pass, one push each
                job = await asyncio.get_running_loop().run_in_executor(
                    pool, coord.create_job, _spec(checkpoint)
                )
                for _ in range(50):
                    hub.poke()
                updates = [await w.next(30) for w in ws]
                assert compute.calls == [4, 4]
                for u in updates:
                    assert u is not None and [j.job_id for j in u.jobs] == [job.job_id]
                    assert [a.topology_version for a in u.assignments] == [job.topology.version]
                assert hub.pushes == 8
                # nothing changed: a poke computes nothing and pushes nothing
                hub.poke()
                assert await ws[0].next(0.5) is None
                assert hub.pushes == 8 and compute.calls == [4, 4]
                # a stream that opens with nothing changed: only it is computed
                late = hub.add(WatchCursor("h0"))
                first = await late.next(30)
                assert first is not None and [j.job_id for j in first.jobs] == [job.job_id]
                assert compute.calls == [4, 4, 1] and hub.pushes == 9
                hub.remove(late)
                # a slow reader: two updates queue up and arrive merged, the newer job list
                slow = ws[1]
                slow.push(WatchUpdate(()))
                slow.push(WatchUpdate(updates[1].jobs))
                merged = await slow.next(1)
                assert merged is not None and merged.jobs == updates[1].jobs
                # leadership lost: every stream is closed, the agents go to the next replica
                coord._step_down("test: lease lost")
                for w in ws:
                    with pytest.raises(WatchClosed, match="is not the leader"):
                        await w.next(30)
            finally:
                coord.changed.unsubscribe(hub.poke_threadsafe)
                await hub.stop("test over")

    asyncio.run(scenario())


def test_the_change_feed_alone_wakes_the_hub(coord: Coordinator, checkpoint) -> None:
    """No hand-made poke: a job created on another thread reaches every open stream through
    the change feed's subscriber; poking a hub not started, or whose loop closed, is a no-op."""
    compute = Counting(coord)
    hub_ref: list[WatchHub] = []

    async def scenario() -> None:
        with ThreadPoolExecutor(2) as pool:
            hub = WatchHub(compute, pool, coalesce_s=0.01)
            hub_ref.append(hub)
            hub.poke_threadsafe()  # not started: nobody to tell
            hub.start()
            coord.changed.subscribe(hub.poke_threadsafe)
            try:
                ws = [hub.add(WatchCursor(h)) for h in HOSTS]
                assert all([await w.next(10) is not None for w in ws])
                job = await asyncio.get_running_loop().run_in_executor(
                    pool, coord.create_job, _spec(checkpoint)
                )
                for w in ws:
                    u = await w.next(10)
                    assert u is not None and [j.job_id for j in u.jobs] == [job.job_id]
            finally:
                coord.changed.unsubscribe(hub.poke_threadsafe)
                await hub.stop("test over")

    asyncio.run(scenario())
    hub_ref[0].poke_threadsafe()  # its loop is closed: dropped, no error


def test_an_unsubscribed_callback_is_called_no_more() -> None:
    import threading

    feed = ChangeFeed(threading.RLock())
    calls: list[str] = []

    def a() -> None:
        calls.append("a")

    def b() -> None:
        calls.append("b")

    feed.subscribe(a)
    feed.subscribe(b)
    with feed:
        feed.notify_all()
    feed.unsubscribe(a)
    feed.unsubscribe(a)  # twice: harmless
    with feed:
        feed.notify_all()
    assert calls == ["a", "b", "b"]


def test_the_flusher_outlives_an_empty_pass_a_failed_pass_and_lost_leadership(
    coord: Coordinator, checkpoint
) -> None:
    compute = Counting(coord)

    async def scenario() -> None:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(2) as pool:
            hub = WatchHub(compute, pool, coalesce_s=0.01)
            hub.start()
            coord.changed.subscribe(hub.poke_threadsafe)
            try:
                # a change while no agent watches: a pass over no stream, the flusher goes on
                hub.poke()
                assert hub._wake is not None
                while hub._wake.is_set():  # cleared by the flusher as its pass begins
                    await asyncio.sleep(0.01)
                w = hub.add(WatchCursor("h0"))
                assert await w.next(10) is not None
                # a bug in the computation is logged and the pass retried: the job arrives
                compute.fail = 1
                job = await loop.run_in_executor(pool, coord.create_job, _spec(checkpoint))
                u = await w.next(10)
                assert u is not None and [j.job_id for j in u.jobs] == [job.job_id]
                assert compute.fail == 0 and hub.flushes == len(compute.calls) == 2
                # leadership lost: the stream is closed; led again, the same hub serves anew
                coord._step_down("test: lease lost")
                with pytest.raises(WatchClosed, match="is not the leader"):
                    await w.next(10)
                hub.remove(w)
                await loop.run_in_executor(pool, coord._become_leader, coord.epoch + 1)
                again = hub.add(WatchCursor("h0"))
                u = await again.next(10)
                assert u is not None and [j.job_id for j in u.jobs] == [job.job_id]
                hub.remove(again)
                # stop closes the streams still open and ends the flusher
                last = hub.add(WatchCursor("h2"))
                await hub.stop("coordinator shutting down")
                with pytest.raises(WatchClosed, match="shutting down"):
                    await last.next(10)
                assert hub._task is not None and hub._task.done()
            finally:
                coord.changed.unsubscribe(hub.poke_threadsafe)
                await hub.stop("test over")

    asyncio.run(scenario())


def test_the_certificate_sweep_wakes_only_the_refused_streams(coord: Coordinator) -> None:
    """One sweep per ``recheck_s`` over every open stream: a stream whose certificate is
    refused now is woken to look again (the server then aborts it, naming the check); the
    others sleep on, and a stream with nothing to check is never asked."""
    refused = {"h1": False}

    async def scenario() -> None:
        with ThreadPoolExecutor(2) as pool:
            hub = WatchHub(coord.watch_updates, pool, coalesce_s=0.01, recheck_s=0.05)
            hub.start()
            try:
                fine = hub.add(WatchCursor("h0"), refused=lambda: False)
                bad = hub.add(WatchCursor("h1"), refused=lambda: refused["h1"])
                plain = hub.add(WatchCursor("h2"))
                for w in (fine, bad, plain):
                    await w.next(10)  # the first update: the job list
                await asyncio.sleep(0.2)  # sweeps pass: nobody refused, nobody woken
                assert not any(w.take_recheck() for w in (fine, bad, plain))
                refused["h1"] = True
                assert await bad.next(10) is None and bad.take_recheck()
                assert await fine.next(0.2) is None and not fine.take_recheck()
                assert not plain.take_recheck()
                assert hub._sweeper is not None and not hub._sweeper.done()
            finally:
                await hub.stop("test over")
            assert hub._sweeper.done()

    asyncio.run(scenario())
