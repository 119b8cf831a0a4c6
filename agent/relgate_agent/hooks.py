"""Hooks: the typed seam where a test lab injects faults; no-ops in production.

Production code calls :func:`current` at a few points (a block about to go on the wire, a
chunk just written to staging, the moment before placement). Nothing here reads the
environment: the lab (``relgate_lab.faults``, outside this package) builds hooks from its
own configuration and calls :func:`install` before the normal command line runs.
"""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Protocol


class StagingFile(Protocol):
    """What a chunk hook may touch: the staged bytes at manifest offsets."""

    def pread(self, offset: int, size: int) -> bytes: ...

    def pwrite(self, offset: int, data: bytes) -> None: ...


class JobHooks:
    """Per job on one host (one instance per job runner)."""

    def chunk_written(self, chunk: int, offset: int, staging: StagingFile) -> None:
        """The last block of ``chunk`` (at ``offset``) was just written, before hashing."""

    def before_place(self, staging_tree: Path, stop: threading.Event) -> None:
        """Every chunk verified; placement (re-verify, rename) starts when this returns."""


class Hooks:
    """Per process. Subclasses override what they need; the defaults change nothing."""

    def wire_block(self, block: int, data: bytes) -> bytes:
        """The payload of ``block`` as the data-plane server sends it."""
        return data

    def job(self, job_id: str) -> JobHooks:
        """Hooks for one job runner (created when the runner is)."""
        return JobHooks()


_current: Hooks = Hooks()


def install(hooks: Hooks) -> None:
    """Replace this process's hooks (the lab does, before starting an agent)."""
    global _current  # noqa: PLW0603 - one process-wide seam, set once at start-up
    _current = hooks


def current() -> Hooks:
    return _current


__all__ = ["Hooks", "JobHooks", "StagingFile", "current", "install"]
