"""The CLI's progress policy: rich progress bars on stderr, or nothing.

Every command runs inside :func:`progress_bars` (see :func:`relgate.cli.common.command`):
the long ones (snapshot build and validate, release build and verify, gc plan and sweep,
distribute)
report their tasks through :mod:`relgate.progress`, and this module draws them.  Bars are
shown only when stderr is a terminal and the command was not given ``--json``, so a
script, a pipe, a CI log or a JSON consumer never sees them; rich is imported only then.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING

from relgate.progress import reporting

if TYPE_CHECKING:
    from rich.progress import Progress


def wanted(as_json: bool, stream: IO[str] | None = None) -> bool:
    """Bars only for a person: not under ``--json``, and only on a terminal's stderr."""
    stream = sys.stderr if stream is None else stream
    return not as_json and stream.isatty()


class RichReporter:
    """A :class:`relgate.progress.Reporter` drawing one rich bar per task.  The display
    (and rich itself) starts with the first task: a command without a long loop draws
    nothing."""

    def __init__(self) -> None:
        self.progress: Progress | None = None

    def _display(self) -> Progress:
        if self.progress is None:
            from rich.console import Console
            from rich.progress import (
                BarColumn,
                MofNCompleteColumn,
                Progress,
                TextColumn,
                TimeElapsedColumn,
                TimeRemainingColumn,
            )

            self.progress = Progress(
                TextColumn("{task.description}"),
                BarColumn(),
                MofNCompleteColumn(),
                TimeElapsedColumn(),
                TimeRemainingColumn(),
                console=Console(stderr=True),
            )
            self.progress.start()
        return self.progress

    def begin(self, description: str, total: int | None) -> int:
        return int(self._display().add_task(description, total=total))

    def advance(self, handle: int, steps: int) -> None:
        self._display().advance(handle, steps)  # type: ignore[arg-type]  # rich's TaskID is an int

    def end(self, handle: int) -> None:
        progress = self._display()
        task = next(t for t in progress.tasks if t.id == handle)
        if task.total is None:  # an open-ended task ends full
            progress.update(handle, total=task.completed)  # type: ignore[arg-type]

    def close(self) -> None:
        if self.progress is not None:
            self.progress.stop()


@contextlib.contextmanager
def progress_bars(as_json: bool) -> Iterator[None]:
    """Draw the progress of the block on stderr when :func:`wanted`; else report nowhere."""
    if not wanted(as_json):
        with reporting(None):
            yield
        return
    reporter = RichReporter()
    try:
        with reporting(reporter):
            yield
    finally:
        reporter.close()
