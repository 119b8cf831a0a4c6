"""Progress of long operations, reported to whoever is listening (nobody by default).

The core marks its long loops with :func:`track` (or :func:`task` and
:meth:`Task.advance`): shards written and verified, sources selected and recomputed,
retained versions marked, sweep batches.  A caller that wants to show it installs a
:class:`Reporter` with :func:`reporting` for the duration of a call; the CLI installs rich
progress bars (:mod:`relgate.cli.progress_bars`), everything else installs nothing and the
marks cost a context-variable lookup.  Progress is advanced only from the thread that
installed the reporter (pools hand their results back to it).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from contextvars import ContextVar
from typing import Protocol, TypeVar

T = TypeVar("T")


class Reporter(Protocol):
    """Receives the tasks a long operation runs through."""

    def begin(self, description: str, total: int | None) -> int:
        """A new task (``total`` steps, or unknown); returns its handle."""
        ...

    def advance(self, handle: int, steps: int) -> None: ...

    def end(self, handle: int) -> None: ...


_REPORTER: ContextVar[Reporter | None] = ContextVar("relgate_progress", default=None)


class Task:
    """One running task; :meth:`advance` is a no-op when nobody listens."""

    def __init__(self, reporter: Reporter | None, handle: int) -> None:
        self._reporter = reporter
        self._handle = handle

    def advance(self, steps: int = 1) -> None:
        if self._reporter is not None:
            self._reporter.advance(self._handle, steps)


@contextlib.contextmanager
def task(description: str, total: int | None = None) -> Iterator[Task]:
    """Report a task of ``total`` steps while the block runs."""
    reporter = _REPORTER.get()
    if reporter is None:
        yield Task(None, 0)
        return
    handle = reporter.begin(description, total)
    try:
        yield Task(reporter, handle)
    finally:
        reporter.end(handle)


def track(items: Iterable[T], description: str, total: int | None = None) -> Iterator[T]:
    """Yield ``items``, one step each, as the task ``description``."""
    if _REPORTER.get() is None:  # nothing reports: no per-item step
        yield from items
        return
    with task(description, total) as current:
        for item in items:
            yield item
            current.advance()


@contextlib.contextmanager
def reporting(reporter: Reporter | None) -> Iterator[None]:
    """Send the progress of everything called inside the block to ``reporter``."""
    token = _REPORTER.set(reporter)
    try:
        yield
    finally:
        _REPORTER.reset(token)
