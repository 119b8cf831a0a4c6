"""Staging without the page cache: O_DIRECT writes and reads through page-aligned buffers.

A buffered write of a new file copies every byte into freshly allocated page-cache pages;
on the lab's VMs that costs ~1.9 CPU-s per GiB, more than a SHA-256 of the same bytes, and a
checkpoint that is written once, re-hashed once and then loaded by the inference server
gains nothing from staying cached on the way.  With ``--staging-io direct`` the staging
files get a second descriptor opened with ``O_DIRECT`` (the same inode, reopened through
``/proc/self/fd``: no path is looked up again).  A write's whole pages go through it from
a page-aligned buffer (``BUFFERS`` of ``BUFFER_BYTES`` per store, lent per call); the
unaligned head and tail of a write, which share their page with a neighbouring file
segment, go through the buffered
descriptor as before (a page is only ever written one way).  Reads (the placement re-hash,
blocks served to downstream peers) read the aligned cover of the range through the direct
descriptor and keep the requested bytes.  ``fsync`` on either descriptor syncs the inode.

File systems without ``O_DIRECT`` (ramfs, some FUSE and network mounts; tmpfs has it since
Linux 6.6) answer EINVAL: :func:`probe` refuses such a
models root before the agent serves (check ``staging-direct``).
"""

from __future__ import annotations

import contextlib
import errno
import mmap
import os
import queue
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from relgate_agent.errors import StorageError

#: Alignment of offsets, lengths and buffer addresses (the logical block size of every
#: disk in practice is 512 or 4096 bytes; 4096 satisfies both).
ALIGN = 4096
#: One page-aligned buffer a write or read goes through, and how many a store holds.
BUFFER_BYTES = 4 << 20
BUFFERS = 8
#: The refusal when the models root's file system cannot do O_DIRECT.
CHECK_DIRECT = "staging-direct"
#: What ``--staging-io`` accepts.
BUFFERED, DIRECT = "buffered", "direct"
MODES = (BUFFERED, DIRECT)


class DirectUnsupported(StorageError):
    """The staging file system refuses O_DIRECT (ramfs, some FUSE and network mounts)."""

    check = CHECK_DIRECT


def _down(n: int) -> int:
    return n - n % ALIGN


def _up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def reopen_direct(fd: int, *, writable: bool) -> int:
    """A second descriptor of ``fd``'s inode with O_DIRECT (DirectUnsupported on EINVAL)."""
    flags = (os.O_RDWR if writable else os.O_RDONLY) | os.O_DIRECT | os.O_CLOEXEC
    try:
        return os.open(f"/proc/self/fd/{fd}", flags)
    except OSError as exc:
        if exc.errno == errno.EINVAL:
            raise DirectUnsupported(
                f"the staging file system refuses O_DIRECT (check {CHECK_DIRECT}); "
                "use --staging-io buffered"
            ) from None
        raise


def probe(directory: Path) -> None:
    """Refuse ``directory`` (DirectUnsupported) unless a file in it opens with O_DIRECT and
    takes one aligned write."""
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f".direct-probe-{os.getpid()}-{threading.get_ident()}"
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        direct = reopen_direct(fd, writable=True)
        buf = mmap.mmap(-1, ALIGN)
        try:
            os.pwrite(direct, buf, 0)
        except OSError as exc:
            if exc.errno == errno.EINVAL:
                raise DirectUnsupported(
                    f"{directory}: aligned O_DIRECT write refused (check {CHECK_DIRECT})"
                ) from None
            raise
        finally:
            buf.close()
            os.close(direct)
    finally:
        os.close(fd)
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)


class DirectIO:
    """Aligned writes and reads for one store, through a bounded set of page-aligned buffers
    (at most ``buffers`` calls run at once; the rest wait for a buffer, so memory stays at
    ``buffers * buffer_bytes`` however many data-plane threads serve peers)."""

    def __init__(self, buffer_bytes: int = BUFFER_BYTES, buffers: int = BUFFERS) -> None:
        if buffer_bytes <= 0 or buffer_bytes % ALIGN:
            raise ValueError("the buffer must be a positive multiple of the alignment")
        if buffers <= 0:
            raise ValueError("at least one buffer")
        self.buffer_bytes = buffer_bytes
        self._free: queue.LifoQueue[mmap.mmap] = queue.LifoQueue()
        self._slots = threading.BoundedSemaphore(buffers)
        self._made: list[mmap.mmap] = []
        self._lock = threading.Lock()

    @contextlib.contextmanager
    def _buffer(self) -> Iterator[mmap.mmap]:
        self._slots.acquire()
        try:
            try:
                buf = self._free.get_nowait()
            except queue.Empty:
                buf = mmap.mmap(-1, self.buffer_bytes)  # anonymous: page-aligned
                with self._lock:
                    self._made.append(buf)
            try:
                yield buf
            finally:
                self._free.put(buf)
        finally:
            self._slots.release()

    def write(self, direct_fd: int, buffered_fd: int, data: memoryview, offset: int) -> int:
        """Write ``data`` at ``offset``: its whole pages directly, its partial pages through
        the page cache.  Returns the bytes written (short only when the disk is full)."""
        end = offset + len(data)
        body_start, body_end = _up(offset), _down(end)
        if body_end <= body_start:  # no whole page: all of it through the page cache
            return os.pwrite(buffered_fd, data, offset)
        written = 0
        if body_start > offset:
            written += os.pwrite(buffered_fd, data[: body_start - offset], offset)
        with self._buffer() as buf, memoryview(buf) as view:
            pos = body_start
            while pos < body_end:
                n = min(self.buffer_bytes, body_end - pos)
                start = pos - offset
                view[:n] = data[start : start + n]
                done = os.pwrite(direct_fd, view[:n], pos)
                written += done
                if done != n:
                    return written
                pos += n
        if end > body_end:
            written += os.pwrite(buffered_fd, data[body_end - offset :], body_end)
        return written

    def feed(
        self, direct_fd: int, offset: int, length: int, sink: Callable[[memoryview], object]
    ) -> int:
        """Pass the ``length`` bytes at ``offset`` to ``sink`` in pieces (views of the aligned
        buffer, valid only during the call), read as the aligned pages that cover them.
        Returns how many were passed (fewer when the file ends first)."""
        passed = 0
        with self._buffer() as buf, memoryview(buf) as view:
            pos, end = _down(offset), offset + length
            while pos < end:
                n = min(self.buffer_bytes, _up(end) - pos)
                got = os.preadv(direct_fd, [view[:n]], pos)
                lo = max(offset, pos) - pos
                hi = min(end, pos + got) - pos
                if hi > lo:
                    sink(view[lo:hi])
                    passed += hi - lo
                if got < n:  # end of file
                    break
                pos += n
        return passed

    def read(self, direct_fd: int, offset: int, length: int) -> bytes:
        """``length`` bytes at ``offset`` (fewer when the file ends first)."""
        out = bytearray()
        self.feed(direct_fd, offset, length, out.extend)
        return bytes(out)

    def close(self) -> None:
        with self._lock:
            buffers, self._made = self._made, []
        for buf in buffers:
            with contextlib.suppress(BufferError):
                buf.close()
