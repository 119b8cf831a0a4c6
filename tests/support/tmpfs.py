"""Put the test run's temporary files on a tmpfs when there is a suitable one.

The suite is dominated by small durable writes: every SQLite catalog commit and every
object the local store creates is fsynced, which on a disk costs milliseconds each and on
a tmpfs nothing.  The code paths are identical (the fsync calls still run).

``RELGATE_TEST_TMPDIR`` names the directory to use (``disk`` keeps the default temporary
directory).  Without it ``/dev/shm`` is used if it is a writable directory with at least
``MIN_FREE_BYTES`` free, and only when pytest deletes the directories of passed tests
(``tmp_path_retention_policy = "failed"``), so a run keeps in memory only what failed
tests left.  An explicit ``--basetemp`` or ``PYTEST_DEBUG_TEMPROOT`` always wins.
The choice is exported as ``TMPDIR``, so servers and agents the tests start use it too.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path

import pytest

TMPDIR_ENV = "RELGATE_TEST_TMPDIR"
DEFAULT_TMPFS = Path("/dev/shm")
MIN_FREE_BYTES = 4 << 30


def _free_bytes(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def fast_temp_root(config: pytest.Config) -> Path | None:
    """The directory to use instead of the default temporary directory, or None."""
    if config.option.basetemp or os.environ.get("PYTEST_DEBUG_TEMPROOT"):
        return None
    given = os.environ.get(TMPDIR_ENV)
    if given:
        return None if given == "disk" else Path(given)
    if config.getini("tmp_path_retention_policy") != "failed":
        return None
    usable = DEFAULT_TMPFS.is_dir() and os.access(DEFAULT_TMPFS, os.W_OK | os.X_OK)
    if not usable or _free_bytes(DEFAULT_TMPFS) < MIN_FREE_BYTES:
        return None
    return DEFAULT_TMPFS


def use_fast_temp_root(config: pytest.Config) -> None:
    """Point ``tempfile`` (and so pytest's ``tmp_path``) and child processes at it."""
    root = fast_temp_root(config)
    if root is None:
        return
    root.mkdir(parents=True, exist_ok=True)
    mp = pytest.MonkeyPatch()
    config.add_cleanup(mp.undo)
    mp.setenv("TMPDIR", str(root))
    mp.setattr(tempfile, "tempdir", None)  # recomputed from TMPDIR on next use
