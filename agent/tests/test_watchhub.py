"""The watch hub on a real event loop over the real coordinator logic (SQLite, signed manifest)."""

from __future__ import annotations

import asyncio
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from relgate_agent.contracts import JobSpec, WatchCursor, WatchUpdate
from relgate_agent.coordinator.service import Coordinator, CoordinatorConfig
from relgate_agent.coordinator.watchhub import WatchClosed, WatchHub
from relgate_agent.manifest import TrustedKeys

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

    def __call__(self, cursors: list[WatchCursor]) -> list[WatchUpdate | None]:
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
