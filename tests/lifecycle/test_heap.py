"""The cyclic collector is paused for a bulk phase and restored exactly as it was found:
nested and concurrent pauses keep it off until the outermost one ends, an exception
restores it, and a process that had it off keeps it off.  The GC plan runs paused."""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator

import pytest

from relgate import heap
from relgate.lifecycle import collector


@pytest.fixture(autouse=True)
def _restore() -> Iterator[None]:
    enabled = gc.isenabled()
    yield
    (gc.enable if enabled else gc.disable)()


def test_paused_inside_restored_after() -> None:
    gc.enable()
    with heap.collector_paused():
        assert not gc.isenabled()
        with heap.collector_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_an_exception_restores_the_collector() -> None:
    gc.enable()
    with pytest.raises(RuntimeError), heap.collector_paused():
        raise RuntimeError("boom")
    assert gc.isenabled()


def test_a_collector_that_was_off_stays_off() -> None:
    gc.disable()
    with heap.collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()


def test_concurrent_pauses_end_with_the_last_one() -> None:
    gc.enable()
    inside, release = threading.Event(), threading.Event()

    def other() -> None:
        with heap.collector_paused():
            inside.set()
            release.wait(10)

    worker = threading.Thread(target=other)
    worker.start()
    assert inside.wait(10)
    with heap.collector_paused():
        assert not gc.isenabled()
    assert not gc.isenabled()  # the other thread's pause is still open
    release.set()
    worker.join(10)
    assert gc.isenabled()


def test_the_gc_plan_runs_with_the_collector_paused(monkeypatch: pytest.MonkeyPatch) -> None:
    seen: list[bool] = []

    def listing(ws: object) -> None:
        seen.append(gc.isenabled())
        raise RuntimeError("stop after the first step")

    monkeypatch.setattr(collector, "list_stored", listing)
    gc.enable()
    with pytest.raises(RuntimeError, match="first step"):
        collector.plan_gc(object(), grace_seconds=0)  # type: ignore[arg-type]
    assert seen == [False]
    assert gc.isenabled()
