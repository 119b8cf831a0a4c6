"""Bounded reads of a signed manifest named by a path or URI.

Every manifest read (``relgate-agent manifest verify``, CreateJob, a new leader loading its
jobs) goes through :func:`read_manifest`: the size is bounded before a byte is parsed
(:data:`relgate_trust.dsse.MAX_ENVELOPE_BYTES`), a local path must be a regular file
(opened non-blocking, so a FIFO never blocks the open; a device such as ``/dev/zero`` is
refused before it is read), and the whole read has a deadline: it runs on a small pool of
its own and the caller stops waiting when the deadline passes, so a hung file system or a
server that drips bytes costs one pool thread, never the caller (the coordinator reads
outside its lock). Each refusal names its check.
"""

from __future__ import annotations

import os
import stat
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import TimeoutError as FutureTimeout
from typing import Any
from urllib.parse import urlparse

from relgate_trust.dsse import MAX_ENVELOPE_BYTES

from relgate_agent.errors import OriginError

CHECK_MANIFEST_READ = "manifest-read"  # not found, permission, network error
CHECK_MANIFEST_NOT_REGULAR = "manifest-not-regular"  # a FIFO, a device, a directory, a socket
CHECK_MANIFEST_TOO_LARGE = "manifest-too-large"  # over the envelope bound (or endless)
CHECK_MANIFEST_DEADLINE = "manifest-deadline"  # the read did not finish in time
READ_DEADLINE_S = 30.0
READ_PIECE = 1 << 20
READ_WORKERS = 4  # reads in flight at once; a stuck one holds a worker, not the caller

_pool: ThreadPoolExecutor | None = None
_pool_lock = threading.Lock()


class ManifestReadError(OriginError):
    """A manifest could not be read within its bounds; ``check`` names the rule."""

    def __init__(self, message: str, *, check: str) -> None:
        super().__init__(message)
        self.check = check


def _too_large(uri: str, size: int | str, max_bytes: int) -> ManifestReadError:
    return ManifestReadError(
        f"manifest {uri} is {size} bytes, over the {max_bytes}-byte bound",
        check=CHECK_MANIFEST_TOO_LARGE,
    )


def _bounded(uri: str, read: Callable[[int], bytes], max_bytes: int, deadline: float) -> bytes:
    """Pieces from ``read(n)`` (b"" at the end) until EOF; refused past ``max_bytes`` or
    past the monotonic ``deadline``."""
    parts: list[bytes] = []
    total = 0
    while True:
        if time.monotonic() > deadline:
            raise ManifestReadError(
                f"manifest {uri}: read not finished by its deadline ({total} bytes so far)",
                check=CHECK_MANIFEST_DEADLINE,
            )
        piece = read(min(READ_PIECE, max_bytes + 1 - total))
        if not piece:
            return b"".join(parts)
        parts.append(piece)
        total += len(piece)
        if total > max_bytes:
            raise _too_large(uri, f"over {max_bytes}", max_bytes)


def _read_local(path: str, max_bytes: int, deadline: float) -> bytes:
    try:
        # O_NONBLOCK: opening a FIFO for reading returns at once instead of waiting for a
        # writer; fstat then refuses it (and every other non-regular file) before a read
        fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY)
    except OSError as exc:
        raise ManifestReadError(
            f"manifest {path} cannot be read: {exc}", check=CHECK_MANIFEST_READ
        ) from exc
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ManifestReadError(
                f"manifest {path} is not a regular file (mode {stat.filemode(st.st_mode)})",
                check=CHECK_MANIFEST_NOT_REGULAR,
            )
        if st.st_size > max_bytes:
            raise _too_large(path, st.st_size, max_bytes)
        os.set_blocking(fd, True)
        try:
            return _bounded(path, lambda n: os.read(fd, n), max_bytes, deadline)
        except OSError as exc:
            raise ManifestReadError(
                f"manifest {path} cannot be read: {exc}", check=CHECK_MANIFEST_READ
            ) from exc
    finally:
        os.close(fd)


def _read_http(uri: str, max_bytes: int, deadline: float) -> bytes:
    timeout = max(0.1, deadline - time.monotonic())
    req = urllib.request.Request(uri)  # noqa: S310 - the operator's http(s) manifest URI
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:  # noqa: S310 - as above
            length = resp.headers.get("Content-Length")
            if length is not None and length.isdigit() and int(length) > max_bytes:
                raise _too_large(uri, int(length), max_bytes)
            read = getattr(resp, "read1", resp.read)  # what arrived: a drip cannot stall it
            return _bounded(uri, read, max_bytes, deadline)
    except (urllib.error.URLError, OSError, ValueError) as exc:
        raise ManifestReadError(
            f"manifest {uri} cannot be read: {exc}", check=CHECK_MANIFEST_READ
        ) from exc


def _read_s3(uri: str, max_bytes: int, deadline: float) -> bytes:
    import boto3  # noqa: PLC0415 - lazy: only S3 manifests need it
    from botocore.exceptions import BotoCoreError, ClientError  # noqa: PLC0415 - as boto3

    parsed = urlparse(uri)
    try:
        obj: Any = boto3.client(
            "s3", endpoint_url=os.environ.get("AWS_ENDPOINT_URL") or None
        ).get_object(Bucket=parsed.netloc, Key=parsed.path.lstrip("/"))
        size = int(obj.get("ContentLength", 0))
        if size > max_bytes:
            raise _too_large(uri, size, max_bytes)
        return _bounded(uri, obj["Body"].read, max_bytes, deadline)
    except (BotoCoreError, ClientError, OSError, ValueError) as exc:  # a refusal passes through
        raise ManifestReadError(
            f"manifest {uri} cannot be read: {exc}", check=CHECK_MANIFEST_READ
        ) from exc


def _read(uri: str, max_bytes: int, deadline: float) -> bytes:
    parsed = urlparse(uri)
    if parsed.scheme == "s3":
        return _read_s3(uri, max_bytes, deadline)
    if parsed.scheme in ("http", "https"):
        return _read_http(uri, max_bytes, deadline)
    if parsed.scheme not in ("", "file"):
        raise ManifestReadError(
            f"manifest URI {uri!r} has an unsupported scheme", check=CHECK_MANIFEST_READ
        )
    return _read_local(parsed.path if parsed.scheme == "file" else uri, max_bytes, deadline)


def _executor() -> ThreadPoolExecutor:
    global _pool  # noqa: PLW0603 - one pool per process, made on first use
    with _pool_lock:
        if _pool is None:
            _pool = ThreadPoolExecutor(READ_WORKERS, thread_name_prefix="manifest-read")
        return _pool


def read_manifest(
    uri: str, *, max_bytes: int = MAX_ENVELOPE_BYTES, deadline_s: float = READ_DEADLINE_S
) -> bytes:
    """The bytes of the manifest at ``uri`` (a path, ``file://``, ``http(s)://``, ``s3://``),
    at most ``max_bytes``, read within ``deadline_s``; :class:`ManifestReadError` (naming
    the check) otherwise."""
    deadline = time.monotonic() + deadline_s
    future: Future[bytes] = _executor().submit(_read, uri, max_bytes, deadline)
    try:
        return future.result(timeout=max(0.0, deadline - time.monotonic()) + 0.5)
    except FutureTimeout:
        future.cancel()  # not started yet (every worker busy): never runs
        raise ManifestReadError(
            f"manifest {uri}: read not finished within {deadline_s:.0f}s",
            check=CHECK_MANIFEST_DEADLINE,
        ) from None


__all__ = [
    "CHECK_MANIFEST_DEADLINE",
    "CHECK_MANIFEST_NOT_REGULAR",
    "CHECK_MANIFEST_READ",
    "CHECK_MANIFEST_TOO_LARGE",
    "ManifestReadError",
    "read_manifest",
]
