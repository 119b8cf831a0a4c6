"""The sweeper's tick holds the coordinator lock in phases per job (handoff.py): reports
that queued for the lock meanwhile (coordinator/batch.py) are applied between two phases,
by the thread that holds the lock, not after the whole sweep. A real Coordinator on
SQLite, a real LockBatch fed from a real event loop, the tick on its own thread."""

from __future__ import annotations

import asyncio
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import TrustedKeys

from relgate_agent.contracts import ProgressReport
from relgate_agent.coordinator.batch import LockBatch
from relgate_agent.coordinator.jobstate import JobState
from relgate_agent.coordinator.progress import ProgressReply
from relgate_agent.coordinator.service import Coordinator, CoordinatorConfig
from relgate_agent.errors import KIND_CHUNK_FAILED

HOSTS = {f"h{i}": f"r{i % 2}" for i in range(5)}
PHASES = ("_tick_dead", "_tick_slow", "_tick_tally", "_tick_end")
# a chunk that failed everywhere: the report FAILs the job
FAILED = ProgressReport(errors=(f"{KIND_CHUNK_FAILED}: chunk 3 failed 5 times",))


def _fleet(tmp_path: Path, checkpoint: dict[str, Any]) -> tuple[Coordinator, str]:
    c = Coordinator(
        CoordinatorConfig(
            db=str(tmp_path / "c.sqlite"), trusted_keys=TrustedKeys.load(checkpoint["trusted"])
        )
    )
    for h, r in HOSTS.items():
        c.enroll(h, r, {"cluster": "tick"})
        c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
    spec = JobSpec(
        model="claude-x",
        version="2026-10-12.3",
        manifest_uri=str(checkpoint["envelope"]),
        target_selector="cluster=tick",
        stripes=2,
    )
    job_id = c.create_job(spec).job_id
    n = checkpoint["manifest"].num_chunks
    for h, r in HOSTS.items():
        c.register(job_id, h, r, bytes((n + 7) // 8), 1 << 40, f"10.0.0.{h[1:]}:7070")
    return c, job_id


def _tick_with_a_report_queued_in(
    c: Coordinator, phase: str, msg: ProgressReport, host: str, job_id: str
) -> tuple[list[str], object]:
    """Tick on a thread; while it is in ``phase`` a report for ``host`` queues for the lock
    on the event loop. Returns the order of events and what the report's caller got."""
    events: list[str] = []
    inside, queued = threading.Event(), threading.Event()
    tick_thread: list[threading.Thread] = []
    real = getattr(c, phase)

    def paused(job: JobState, now: float, *rest: Any) -> Any:
        assert c.lock._is_owned()  # type: ignore[attr-defined]  # the tick holds it
        events.append(phase)
        inside.set()
        assert queued.wait(10), "the report never queued"
        return real(job, now, *rest)

    setattr(c, phase, paused)
    for name in PHASES:
        if name != phase:  # record every phase that runs, in order
            inner = getattr(c, name)
            setattr(
                c,
                name,
                lambda job, now, counters, inner=inner, name=name: (
                    events.append(name) or inner(job, now, counters)
                ),
            )

    def report() -> ProgressReply:
        events.append(
            "report on the tick's thread"
            if threading.current_thread() is tick_thread[0]
            else "report elsewhere"
        )
        return c.report_progress(job_id, host, msg)

    async def main() -> object:
        with ThreadPoolExecutor(2) as pool:
            batch = LockBatch(c.lock, pool)
            c.apply_waiting = batch.apply_waiting

            def ticking() -> None:
                c.tick()
                events.append("tick ended")

            t = threading.Thread(target=ticking)
            tick_thread.append(t)
            t.start()
            assert await asyncio.to_thread(inside.wait, 10)
            assert not c.lock.acquire(blocking=False)  # held by the tick: the report queues
            waiting = asyncio.create_task(batch.submit(report))
            while not batch.pending:
                await asyncio.sleep(0.001)
            queued.set()
            try:
                got: object = await asyncio.wait_for(waiting, 10)
            except Exception as exc:  # the caller's refusal, as the server would abort with
                got = exc
            await asyncio.to_thread(t.join, 10)
            return got

    got = asyncio.run(main())
    return events, got


def test_a_report_queued_during_a_tick_is_applied_between_its_phases(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    c, job_id = _fleet(tmp_path, checkpoint)
    try:
        c.tick()
        before = c.jobs[job_id].hosts["h1"].last_seen
        events, got = _tick_with_a_report_queued_in(
            c, "_tick_dead", ProgressReport(rx_bps=1), "h1", job_id
        )
        # applied right after the phase it queued in, by the tick, before the later phases
        assert events == [
            "_tick_dead",
            "report on the tick's thread",
            "_tick_slow",
            "_tick_tally",
            "_tick_end",
            "tick ended",
        ]
        assert isinstance(got, ProgressReply) and got.topology_version >= 1
        assert c.tick_applied_s > 0  # the report's time, left out of the sweep's own
        assert c.jobs[job_id].hosts["h1"].last_seen > before
        assert c.jobs[job_id].hosts["h1"].state == "TRANSFERRING"
    finally:
        c.close()


def test_a_report_that_fails_the_job_between_phases_ends_its_sweep(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    """A chunk that failed everywhere, reported between two phases, FAILs the job: the
    tick runs none of its later phases (no DONE, no events for a failed job)."""
    c, job_id = _fleet(tmp_path, checkpoint)
    try:
        events, got = _tick_with_a_report_queued_in(c, "_tick_slow", FAILED, "h2", job_id)
        assert events == [
            "_tick_dead",
            "_tick_slow",
            "report on the tick's thread",
            "tick ended",
        ]
        assert isinstance(got, ProgressReply) and got.actions == ("STOP",)
        assert c.jobs[job_id].state == "FAILED"
    finally:
        c.close()


def test_without_a_server_nothing_waits_and_the_tick_runs_every_phase(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    c, job_id = _fleet(tmp_path, checkpoint)
    try:
        assert c.apply_waiting() == 0
        c.tick()
        assert c.tick_applied_s == 0.0
        assert c.jobs[job_id].tally_saved_at is not None  # the tally phase ran
    finally:
        c.close()


def _rates_round(c: Coordinator, job_id: str) -> str:
    """Every host sends per-stripe rates, the downstreams of the busiest uploader a sixth
    of the others' on its stripes: a judgment is due and blames that uploader (returned)."""
    job = c.jobs[job_id]
    idx = c._index(job)
    up = max(
        job.topology.racks,
        key=lambda h: len({d for s in range(job.stripes) for d in idx.downstreams(s, h)}),
    )
    kids = {s: set(idx.downstreams(s, up)) for s in range(job.stripes)}
    for h in job.topology.racks:
        rates = tuple(2_000_000 if h in kids[s] else 12_000_000 for s in range(job.stripes))
        c.report_progress(job_id, h, ProgressReport(stripe_rx_bps=rates))
    return up


def test_a_report_queued_during_the_slowness_judgment_is_applied_before_its_verdicts(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    c, job_id = _fleet(tmp_path, checkpoint)
    try:
        _rates_round(c, job_id)
        events, got = _tick_with_a_report_queued_in(
            c, "_slow_hosts", ProgressReport(rx_bps=1), "h1", job_id
        )
        assert events == [
            "_tick_dead",
            "_tick_slow",
            "_slow_hosts",
            "report on the tick's thread",
            "_tick_tally",
            "_tick_end",
            "tick ended",
        ]
        assert isinstance(got, ProgressReply)
    finally:
        c.close()


def test_a_report_that_fails_the_job_during_the_judgment_stops_its_verdicts(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    """The job FAILED while it was judged: no verdict applies to it (the slow host keeps
    its slowness clock unstarted) and the sweep of the job ends there."""
    c, job_id = _fleet(tmp_path, checkpoint)
    try:
        up = _rates_round(c, job_id)
        events, _ = _tick_with_a_report_queued_in(c, "_slow_hosts", FAILED, "h2", job_id)
        assert events == [
            "_tick_dead",
            "_tick_slow",
            "_slow_hosts",
            "report on the tick's thread",
            "tick ended",
        ]
        job = c.jobs[job_id]
        assert job.state == "FAILED"
        assert job.hosts[up].slow_since is None
    finally:
        c.close()


def test_the_judgment_starts_the_slow_hosts_clock_when_nothing_waits(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    """The same round without a report in between: the uploader's slowness clock starts
    (the test above shows its absence is the failed job's doing, not a judgment that
    could not blame it)."""
    c, job_id = _fleet(tmp_path, checkpoint)
    try:
        up = _rates_round(c, job_id)
        c.tick()
        assert c.jobs[job_id].hosts[up].slow_since is not None
    finally:
        c.close()
