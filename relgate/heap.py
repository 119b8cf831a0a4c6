"""The Python heap during bulk row handling: the cyclic collector paused.

CPython's cyclic garbage collector runs after every 700 net allocations of container
objects (tuples, lists, dataclass instances), and a full collection walks every live
container in the process.  Turning a million database rows or stored-object listings into
Arrow columns allocates millions of short-lived tuples; with a large heap alive beside them
(a listing, a Dagster process), the collector's walks cost more than the work itself: the
GC plan over 1M objects and 10k versions spent ~5 of its 15 s there (``gc_seen`` read into
Arrow: 3.9 s with the collector, 1.0 s without).  None of that work builds reference cycles,
and reference counting frees it as before; the collector resumes when the outermost pause
ends (nested and concurrent pauses count, so a thread never re-enables it under another).
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Iterator
from contextlib import contextmanager

_lock = threading.Lock()
_depth = 0
_was_enabled = False


@contextmanager
def collector_paused() -> Iterator[None]:
    """Automatic cyclic collection off for the block (restored as it was found when the
    outermost block ends)."""
    global _depth, _was_enabled  # noqa: PLW0603 - one process-wide switch, counted under a lock
    with _lock:
        if _depth == 0:
            _was_enabled = gc.isenabled()
            gc.disable()
        _depth += 1
    try:
        yield
    finally:
        with _lock:
            _depth -= 1
            if _depth == 0 and _was_enabled:
                gc.enable()
