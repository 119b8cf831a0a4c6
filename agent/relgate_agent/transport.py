"""Peer data plane: framed TCP with credit-based flow control.

Requests (downstream -> upstream), one per connection:

    b"RGD1" | u8 op | u32 len | JSON header
      op 1 STREAM_STRIPE {"job", "stripe", "fromPos", "credits"}   blocks of one stripe, in order
      op 2 FETCH_CHUNK   {"job", "chunk"}                          all blocks of one verified chunk

After STREAM_STRIPE the downstream sends credit grants (u32 count) as it consumes blocks;
the upstream never has more than the granted number of blocks outstanding.

Frames (upstream -> downstream): ``!BQQII`` kind, block, offset, length, crc32c + payload.
kind 1 BLOCK, 2 END, 3 ERROR (payload: UTF-8 message), 4 HEARTBEAT (upstream is alive but
waiting for its own upstream; lets a downstream tell "slow chain" from "dead peer").

The CRC sent is the manifest's CRC for the block; receivers check it against the manifest
themselves, so the frame CRC is informational. Blocks are served from disk (the staging or
placed files), which is what lets a reconnecting downstream be replayed without the origin.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Protocol

log = logging.getLogger(__name__)

MAGIC = b"RGD1"
OP_STREAM_STRIPE = 1
OP_FETCH_CHUNK = 2
KIND_BLOCK = 1
KIND_END = 2
KIND_ERROR = 3
KIND_HEARTBEAT = 4
FRAME = struct.Struct("!BQQII")
CREDIT = struct.Struct("!I")
REQ = struct.Struct("!4sBI")
DEFAULT_CREDITS = 16
HEARTBEAT_S = 1.0
# Test-only fault hook, read by the *sending* agent: "corrupt_send=<block>[:<times>]" flips a
# byte of that block on the wire (after it was read from disk) so receivers must catch it.
FAULT_ENV = "RELGATE_AGENT_FAULT"


class TransportError(Exception):
    """Connection-level failure (reset, refused, protocol error, upstream error frame)."""


class BlockSource(Protocol):
    """What the data-plane server needs from a job on this host."""

    def stripe_blocks(self, stripe: int) -> list[int]: ...

    def wait_block(self, block: int, timeout: float) -> bool: ...

    def read_block(self, block: int) -> tuple[int, bytes, int]:
        """(offset, data, crc32c)"""
        ...

    def chunk_verified(self, chunk: int) -> bool: ...

    def chunk_blocks(self, chunk: int) -> range: ...

    def count_tx(self, n: int) -> None: ...

    @property
    def closed(self) -> bool: ...


@dataclass
class Fault:
    corrupt_block: int = -1
    remaining: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def from_env(cls) -> Fault:
        spec = os.environ.get(FAULT_ENV, "")
        f = cls()
        for item in filter(None, spec.split(",")):
            key, _, val = item.partition("=")
            if key == "corrupt_send":
                block, _, times = val.partition(":")
                f.corrupt_block = int(block)
                f.remaining = int(times or 1)
        return f

    def maybe_corrupt(self, block: int, data: bytes) -> bytes:
        if block != self.corrupt_block:
            return data
        with self.lock:
            if self.remaining <= 0:
                return data
            self.remaining -= 1
        log.warning("fault hook: corrupting block %d on the wire", block)
        b = bytearray(data)
        b[len(b) // 2] ^= 0xFF
        return bytes(b)


def _recv_exact(sock: socket.socket, n: int) -> bytes:
    buf = bytearray(n)
    view = memoryview(buf)
    got = 0
    while got < n:
        k = sock.recv_into(view[got:], n - got)
        if k == 0:
            raise TransportError("connection closed by peer")
        got += k
    return bytes(buf)


def _graceful_close(conn: socket.socket) -> None:
    """Half-close, then drain the peer's credit grants until it closes.

    Closing a socket with unread bytes (late credit grants) makes the kernel send RST, and
    an RST discards frames the peer has not read yet (the last blocks and END).
    """
    with contextlib.suppress(OSError):
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(5.0)
        while conn.recv(4096):
            pass
    with contextlib.suppress(OSError):
        conn.close()


def _send_frame(
    sock: socket.socket,
    kind: int,
    block: int = 0,
    offset: int = 0,
    crc: int = 0,
    payload: bytes = b"",
) -> None:
    sock.sendall(FRAME.pack(kind, block, offset, len(payload), crc))
    if payload:
        sock.sendall(payload)


class DataServer:
    """Thread-per-connection TCP server for StreamStripe and FetchChunk."""

    def __init__(
        self,
        host: str,
        port: int,
        lookup: Callable[[str], BlockSource | None],
        tx_limit: Callable[[int], None] | None = None,
    ) -> None:
        self.lookup = lookup
        # per-host upload cap (e.g. a TokenBucket.take) so distribution never starves serving
        self.tx_limit = tx_limit
        self.fault = Fault.from_env()
        self.sock = socket.create_server((host, port), reuse_port=False, backlog=128)
        self.address = f"{host}:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="data-accept", daemon=True)
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()
        with self._lock:
            for c in list(self._conns):
                with contextlib.suppress(OSError):
                    c.shutdown(socket.SHUT_RDWR)

    def _accept_loop(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self.sock.accept()
            except OSError:
                return
            conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            with self._lock:
                self._conns.add(conn)
            threading.Thread(
                target=self._serve, args=(conn,), name="data-conn", daemon=True
            ).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            magic, op, n = REQ.unpack(_recv_exact(conn, REQ.size))
            if magic != MAGIC or n > 1 << 20:
                raise TransportError("bad request header")
            req = json.loads(_recv_exact(conn, n))
            src = self.lookup(str(req.get("job", "")))
            if src is None:
                _send_frame(conn, KIND_ERROR, payload=b"unknown job")
                return
            if op == OP_STREAM_STRIPE:
                self._stream(
                    conn,
                    src,
                    int(req["stripe"]),
                    int(req["fromPos"]),
                    int(req.get("credits", DEFAULT_CREDITS)),
                )
            elif op == OP_FETCH_CHUNK:
                self._fetch_chunk(conn, src, int(req["chunk"]))
            else:
                _send_frame(conn, KIND_ERROR, payload=b"unknown op")
        except (OSError, TransportError, ValueError, KeyError) as exc:
            log.warning("data connection ended: %r", exc)
        finally:
            with self._lock:
                self._conns.discard(conn)
            _graceful_close(conn)

    def _stream(
        self, conn: socket.socket, src: BlockSource, stripe: int, pos: int, credits: int
    ) -> None:
        blocks = src.stripe_blocks(stripe)
        pending = b""
        while pos < len(blocks):
            if self._stop.is_set() or src.closed:
                _send_frame(conn, KIND_ERROR, payload=b"job closed on upstream")
                return
            block = blocks[pos]
            if not src.wait_block(block, HEARTBEAT_S):
                _send_frame(conn, KIND_HEARTBEAT, block=block)
                continue
            while credits <= 0:
                data = conn.recv(4096)
                if not data:
                    raise TransportError("downstream closed")
                pending += data
                while len(pending) >= CREDIT.size:
                    credits += CREDIT.unpack(pending[: CREDIT.size])[0]
                    pending = pending[CREDIT.size :]
            offset, payload, crc = src.read_block(block)
            payload = self.fault.maybe_corrupt(block, payload)
            if self.tx_limit is not None:
                self.tx_limit(len(payload))
            _send_frame(conn, KIND_BLOCK, block, offset, crc, payload)
            src.count_tx(len(payload))
            credits -= 1
            pos += 1
        _send_frame(conn, KIND_END)

    def _fetch_chunk(self, conn: socket.socket, src: BlockSource, chunk: int) -> None:
        if not src.chunk_verified(chunk):
            _send_frame(conn, KIND_ERROR, payload=b"chunk not held")
            return
        for block in src.chunk_blocks(chunk):
            offset, payload, crc = src.read_block(block)
            payload = self.fault.maybe_corrupt(block, payload)
            if self.tx_limit is not None:
                self.tx_limit(len(payload))
            _send_frame(conn, KIND_BLOCK, block, offset, crc, payload)
            src.count_tx(len(payload))
        _send_frame(conn, KIND_END)


@dataclass
class Block:
    block: int
    offset: int
    crc32c: int
    data: bytes


def _connect(address: str, timeout: float) -> socket.socket:
    host, _, port = address.rpartition(":")
    sock = socket.create_connection((host, int(port)), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def _request(sock: socket.socket, op: int, header: dict[str, object]) -> None:
    body = json.dumps(header).encode()
    sock.sendall(REQ.pack(MAGIC, op, len(body)) + body)


def _read_frames(sock: socket.socket) -> Iterator[Block | None]:
    """Yields blocks; None for a heartbeat; returns at END; raises on ERROR."""
    # A buffered reader reads large payloads straight into the result object (one copy
    # from the kernel), which is measurably faster than recv_into + bytes().
    rfile = sock.makefile("rb", buffering=256 * 1024)
    try:
        while True:
            head = rfile.read(FRAME.size)
            if len(head) != FRAME.size:
                raise TransportError("connection closed by peer")
            kind, block, offset, length, crc = FRAME.unpack(head)
            payload = rfile.read(length) if length else b""
            if len(payload) != length:
                raise TransportError("connection closed by peer mid-frame")
            if kind == KIND_BLOCK:
                yield Block(block, offset, crc, payload)
            elif kind == KIND_HEARTBEAT:
                yield None
            elif kind == KIND_END:
                return
            elif kind == KIND_ERROR:
                raise TransportError(f"upstream error: {payload.decode(errors='replace')}")
            else:
                raise TransportError(f"unknown frame kind {kind}")
    finally:
        rfile.close()


class StripeStream:
    """Client side of StreamStripe. Iterate blocks; call ``grant()`` after consuming each."""

    def __init__(
        self,
        address: str,
        job: str,
        stripe: int,
        from_pos: int,
        credits: int = DEFAULT_CREDITS,
        stall_s: float = 5.0,
    ) -> None:
        self.address = address
        try:
            self.sock = _connect(address, timeout=stall_s)
        except (OSError, ValueError) as exc:
            raise TransportError(f"connection to {address} failed: {exc}") from exc
        self.sock.settimeout(stall_s)  # no frame (not even a heartbeat) for stall_s -> stalled
        try:
            _request(
                self.sock,
                OP_STREAM_STRIPE,
                {"job": job, "stripe": stripe, "fromPos": from_pos, "credits": credits},
            )
        except OSError as exc:
            self.close()
            raise TransportError(f"connection to {address} failed: {exc}") from exc

    def __iter__(self) -> Iterator[Block | None]:
        try:
            yield from _read_frames(self.sock)
        except TimeoutError as exc:
            raise TransportError(f"stalled: no frame from {self.address}") from exc
        except OSError as exc:
            raise TransportError(f"connection to {self.address} failed: {exc}") from exc

    def grant(self, n: int = 1) -> None:
        try:
            self.sock.sendall(CREDIT.pack(n))
        except OSError as exc:
            raise TransportError(f"connection to {self.address} failed: {exc}") from exc

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.close()


def fetch_chunk(address: str, job: str, chunk: int, timeout: float = 30.0) -> list[Block]:
    """Client side of FetchChunk (repair path)."""
    try:
        sock = _connect(address, timeout)
    except (OSError, ValueError) as exc:
        raise TransportError(f"connection to {address} failed: {exc}") from exc
    try:
        _request(sock, OP_FETCH_CHUNK, {"job": job, "chunk": chunk})
        return [b for b in _read_frames(sock) if b is not None]
    except OSError as exc:
        raise TransportError(f"fetch of chunk {chunk} from {address} failed: {exc}") from exc
    finally:
        sock.close()
