"""Peer data plane: framed TCP over mutual TLS 1.3 with credit-based flow control.

Requests (downstream -> upstream), one per connection:

    b"RGD1" | u8 op | u32 len | JSON header
      op 1 STREAM_STRIPE {"job", "stripe", "fromPos", "credits"[, "toPos"][, "compress"]}
                                                       blocks of one stripe, in order (from
                                                       fromPos up to toPos, else the end);
                                                       "compress": "zstd-split2" on a WAN
                                                       link asks for ZBLOCK frames
      op 2 FETCH_CHUNK   {"job", "chunk"}                          all blocks of one verified chunk
      op 3 FETCH_MANIFEST {"job", "digest"}                        the job's signed manifest
                                                                   envelope (one frame), if it
                                                                   is the one named

After STREAM_STRIPE the downstream sends credit grants (u32 count) as it consumes blocks;
the upstream never has more than the granted number of blocks outstanding.

Frames (upstream -> downstream): ``!BQQII`` kind, block, offset, length, crc32c + payload.
kind 1 BLOCK, 2 END, 3 ERROR (payload: UTF-8 message), 4 HEARTBEAT (upstream is alive but
waiting for its own upstream; lets a downstream tell "slow chain" from "dead peer"), 5 ZBLOCK
(a block compressed by ``relgate_agent.dataplane.wan``; only on a stream that asked for it, and only
when it is smaller than the block, so a frame is never longer than a block), 6 PACE (no
payload; at most every ``PACE_S`` on a stripe stream: ``block`` is how many blocks past the
one about to be sent the upstream holds ready for this stream (at most ``PACE_AHEAD_MAX``),
``offset`` how many its own upstream held ready for it when it last said so, 0 when that
says nothing of its receive; what a downstream needs to find the slow hop, see
``relgate_agent.agent.bypass``).

The CRC sent is the manifest's CRC for the block; receivers check it against the manifest
themselves, so the frame CRC is informational. Blocks are served from disk (the staging or
placed files), which is what lets a reconnecting downstream be replayed without the origin.

Every connection is TLS 1.3 with a client certificate from the fleet CA; the server serves a
stripe only to a host its *current* assignment names as that stripe's downstream, and a
chunk only to a host of the job's current topology (see ``relgate_agent.identity.authz``). Nothing a
peer sends can hold the server: handshake, request and idle timeouts, a bound on
connections per peer and in total, an accept loop that survives EMFILE, and every malformed
request answered with one ERROR frame and a closed connection.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import socket
import ssl
import struct
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, Protocol

from relgate_agent import hooks
from relgate_agent.dataplane import wan
from relgate_agent.errors import AgentError
from relgate_agent.identity.authz import STALE_TOPOLOGY
from relgate_agent.pki import Identity, identity_from_peercert, peer_cert_refusal

log = logging.getLogger(__name__)

MAGIC = b"RGD1"
OP_STREAM_STRIPE = 1
OP_FETCH_CHUNK = 2
OP_FETCH_MANIFEST = 3
OPS = (OP_STREAM_STRIPE, OP_FETCH_CHUNK, OP_FETCH_MANIFEST)
KIND_BLOCK = 1
KIND_END = 2
KIND_ERROR = 3
KIND_HEARTBEAT = 4
KIND_ZBLOCK = 5
KIND_PACE = 6
FRAME = struct.Struct("!BQQII")
CREDIT = struct.Struct("!I")
REQ = struct.Struct("!4sBI")
DEFAULT_CREDITS = 16
MAX_JOB_ID_LEN = 128
MAX_DIGEST_LEN = 128
NOT_HELD = "not held"  # how a FETCH_MANIFEST refusal for a manifest not held ends
# refusal kinds that mean "not yet, ask again" (a manifest or chunk not held here yet): a
# peer doing its job, never counted with the refusals an attack raises
ASK_AGAIN_KINDS = frozenset({"not_held", "stale"})
SOURCE_POLL_S = 0.05  # how often a request for a job registering here looks again
HEARTBEAT_S = 1.0
PACE_S = 0.5  # how often a stripe stream tells its downstream how far ahead it is
PACE_AHEAD_MAX = 64  # blocks counted ahead at most (the count is a signal, not a ledger)


class TransportError(AgentError):
    """Connection-level failure (reset, refused, protocol error, upstream error frame)."""


class PeerCertRefused(TransportError):
    """The peer's certificate expired or was revoked (``check``: certlife's name for it):
    refused at the handshake, or the open connection cut at the first frame after it."""

    def __init__(self, address: str, check: str, why: str, mid_stream: bool = False) -> None:
        cut = "cut mid-stream: " if mid_stream else ""
        super().__init__(f"{address}: {cut}{check}: {why}")
        self.check, self.why, self.mid_stream = check, why, mid_stream


def refuse_expired_peer(sock: socket.socket, address: str, mid_stream: bool = True) -> None:
    """Raise :class:`PeerCertRefused` when the peer's certificate on ``sock`` expired or was
    revoked by now: checked at the handshake and on every frame read from the peer (TLS
    checks expiry only when a connection opens; a stream lives for minutes)."""
    refused = peer_cert_refusal(sock)  # type: ignore[arg-type]  # an SSLSocket
    if refused is not None:
        raise PeerCertRefused(address, *refused, mid_stream=mid_stream)


class ManifestNotHeld(TransportError):
    """The peer does not hold the manifest named (yet: it may be verifying it now)."""


class RequestError(AgentError):
    """A malformed or refused request: answered with one ERROR frame, then the connection
    is closed. ``kind`` is the refusal counter it is counted under."""

    def __init__(self, message: str, kind: str = "malformed") -> None:
        super().__init__(message)
        self.kind = kind


@dataclass(frozen=True)
class DataPlaneLimits:
    handshake_timeout_s: float = 5.0
    request_timeout_s: float = 5.0  # the request header must arrive within this
    idle_timeout_s: float = 30.0  # a peer that neither reads nor grants credit this long is cut
    max_conns_total: int = 512
    max_conns_per_peer: int = 32  # per certificate host id, once authenticated
    max_handshaking_per_address: int = 64  # connections still in the TLS handshake, per address
    max_header_bytes: int = 4096
    max_credits: int = 1024
    topology_wait_s: float = 3.0  # a peer ahead of our topology version: wait this long for it
    unhealthy_for_s: float = 30.0  # an accept failure keeps the server "unhealthy" this long


# (job, peer, op, stripe, peer's topology version) -> refusal text or None
Authorizer = Callable[[str, Identity | None, int, int, int], str | None]


def _refusal_kind(why: str) -> str:
    return "stale" if why.startswith(STALE_TOPOLOGY) else "unauthorized"


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

    def pace(self, stripe: int, blocks: list[int], pos: int) -> tuple[int, int]:
        """(blocks held ready past ``blocks[pos]``, at most PACE_AHEAD_MAX; what this
        host's own upstream of the stripe held ready for it, 0 when that says nothing)"""
        ...

    def envelope(self) -> tuple[str, bytes] | None:
        """(manifest digest, signed envelope) of the job, once this host verified it."""
        ...

    @property
    def closed(self) -> bool: ...


def _recv_request_part(sock: socket.socket, n: int, what: str) -> bytes:
    buf = bytearray()
    try:
        while len(buf) < n:
            data = sock.recv(n - len(buf))
            if not data:
                raise RequestError(f"{what} incomplete: {len(buf)}/{n} bytes, peer closed")
            buf += data
    except TimeoutError:
        raise RequestError(f"{what} incomplete: {len(buf)}/{n} bytes before the timeout") from None
    return bytes(buf)


def _graceful_close(conn: socket.socket) -> None:
    """Half-close, then drain the peer's credit grants until it closes.

    Closing a socket with unread bytes (late credit grants) makes the kernel send RST, and
    an RST discards frames the peer has not read yet (the last blocks and END).
    """
    with contextlib.suppress(OSError, ValueError):
        conn.shutdown(socket.SHUT_WR)
        conn.settimeout(5.0)
        deadline = time.monotonic() + 5.0
        while conn.recv(4096) and time.monotonic() < deadline:
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


def _int_field(req: dict[str, Any], name: str, lo: int, hi: int, default: int | None = None) -> int:
    """A request integer: a JSON integer (not a bool, float or string) within [lo, hi]."""
    v = req.get(name, default)
    if type(v) is not int:
        raise RequestError(f"{name} must be an integer")
    if not lo <= v <= hi:
        raise RequestError(f"{name} {v} out of range [{lo}, {hi}]")
    return v


def parse_request(
    head: bytes, body_reader: Callable[[int], bytes], max_header: int
) -> tuple[int, dict[str, Any]]:
    """Validate a request envelope: magic, op, bounded length, a JSON object with a job id."""
    magic, op, n = REQ.unpack(head)
    if magic != MAGIC:
        raise RequestError("bad magic")
    if op not in OPS:
        raise RequestError(f"unknown op {op}")
    if n > max_header:
        raise RequestError(f"request header too large ({n} > {max_header} bytes)")
    body = body_reader(n)
    try:
        req = json.loads(body.decode("utf-8"))
    except (UnicodeDecodeError, ValueError):
        raise RequestError("request header is not JSON") from None
    if not isinstance(req, dict):
        raise RequestError("request header is not a JSON object")
    job = req.get("job")
    if not isinstance(job, str) or not 0 < len(job) <= MAX_JOB_ID_LEN:
        raise RequestError("job must be a non-empty string")
    return op, req


class DataServer:
    """Thread-per-connection TLS server for StreamStripe and FetchChunk."""

    def __init__(
        self,
        host: str,
        port: int,
        lookup: Callable[[str], BlockSource | None],
        tx_limit: Callable[[int], None] | None = None,
        *,
        tls: ssl.SSLContext,
        authorize: Authorizer,
        limits: DataPlaneLimits | None = None,
    ) -> None:
        self.lookup = lookup
        # per-host upload cap (e.g. a TokenBucket.take) so distribution never starves serving
        self.tx_limit = tx_limit
        self.tls = tls
        self.authorize = authorize
        self.limits = limits or DataPlaneLimits()
        self.hooks = hooks.current()
        self.sock = socket.create_server((host, port), reuse_port=False, backlog=128)
        self.address = f"{host}:{self.sock.getsockname()[1]}"
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, name="data-accept", daemon=True)
        self._conns: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._per_addr: Counter[str] = Counter()  # connections still handshaking, per address
        self._per_host: Counter[str] = Counter()  # authenticated connections, per host id
        self.refusals: Counter[str] = Counter()  # refusal kind -> count
        self.accept_errors: Counter[str] = Counter()
        self._trouble = ("", 0.0)  # (what, when) of the last accept failure

    # ------------------------------------------------------------------ health, counters
    @property
    def refusals_total(self) -> int:
        with self._lock:
            return sum(self.refusals.values())

    def health(self) -> str:
        """ "" while healthy; otherwise the last accept failure (kept for unhealthy_for_s)."""
        what, when = self._trouble
        if what and time.monotonic() - when < self.limits.unhealthy_for_s:
            return what
        return ""

    def counters(self) -> dict[str, Any]:
        with self._lock:
            return {
                "refusals": dict(self.refusals),
                "refusals_total": sum(self.refusals.values()),
                "accept_errors": dict(self.accept_errors),
                "connections": len(self._conns),
                "authenticated": sum(self._per_host.values()),
                "health": self.health(),
            }

    def _refuse(self, kind: str, why: str, peer: str) -> None:
        if kind in ASK_AGAIN_KINDS:  # a legitimate "not yet", not a refusal of the caller
            log.info("data plane: %s asked for what is not held here yet: %s", peer, why)
            return
        with self._lock:
            self.refusals[kind] += 1
        log.warning("data plane refused %s: %s", peer, why)

    # ------------------------------------------------------------------ lifecycle
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
        backoff = 0.01
        while not self._stop.is_set():
            try:
                conn, addr = self.sock.accept()
            except OSError as exc:
                if self._stop.is_set():
                    return
                if exc.errno in (errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM):
                    # out of descriptors/memory: back off and keep serving what we have
                    name = errno.errorcode.get(exc.errno or 0, str(exc.errno))
                    with self._lock:
                        self.accept_errors[name] += 1
                    self._trouble = (
                        f"data plane accept failed: {name} ({exc.strerror})",
                        time.monotonic(),
                    )
                    log.warning("data plane accept failed (%s); backing off %.2fs", name, backoff)
                    self._stop.wait(backoff)
                    backoff = min(backoff * 2, 1.0)
                    continue
                if exc.errno in (errno.ECONNABORTED, errno.EPROTO, errno.EINTR, errno.EAGAIN):
                    continue
                if exc.errno == errno.EBADF or isinstance(exc, ConnectionError):
                    return
                log.warning("data plane accept: %r", exc)
                self._stop.wait(backoff)
                continue
            backoff = 0.01
            peer_addr = str(addr[0]) if isinstance(addr, tuple) else str(addr)
            with self._lock:
                over = (
                    len(self._conns) >= self.limits.max_conns_total
                    or self._per_addr[peer_addr] >= self.limits.max_handshaking_per_address
                )
                if not over:
                    self._conns.add(conn)
                    self._per_addr[peer_addr] += 1
            if over:
                self._refuse("limit", "connection limit reached", peer_addr)
                with contextlib.suppress(OSError):
                    conn.close()
                continue
            try:
                threading.Thread(
                    target=self._serve, args=(conn, peer_addr), name="data-conn", daemon=True
                ).start()
            except RuntimeError as exc:  # cannot start a thread: same as EMFILE
                self._trouble = (f"data plane cannot start a thread: {exc}", time.monotonic())
                self._forget(conn, peer_addr, None)
                with contextlib.suppress(OSError):
                    conn.close()
                self._stop.wait(backoff)

    def _forget(self, conn: socket.socket, addr: str, host: str | None) -> None:
        with self._lock:
            self._conns.discard(conn)
            if addr in self._per_addr:
                self._per_addr[addr] -= 1
                if self._per_addr[addr] <= 0:
                    del self._per_addr[addr]
            if host is not None:
                self._per_host[host] -= 1
                if self._per_host[host] <= 0:
                    del self._per_host[host]

    # ------------------------------------------------------------------ one connection
    def _serve(self, raw: socket.socket, addr: str) -> None:
        conn: socket.socket = raw
        counted_addr: str = addr
        host: str | None = None
        lim = self.limits
        try:
            raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            raw.settimeout(lim.handshake_timeout_s)
            try:
                conn = self.tls.wrap_socket(raw, server_side=True)
            except (ssl.SSLError, OSError) as exc:
                self._refuse("handshake", f"TLS handshake failed: {exc}", addr)
                return
            peer = identity_from_peercert(conn.getpeercert())
            refused = peer_cert_refusal(conn)
            if refused is not None:  # expired since the CA signed it, or revoked
                self._refuse("certificate", f"{refused[0]}: {refused[1]}", addr)
                with contextlib.suppress(OSError, ValueError):
                    conn.settimeout(2.0)
                    _send_frame(conn, KIND_ERROR, payload=f"{refused[0]}: {refused[1]}".encode())
                return
            name, over = self._admit(raw, conn, addr, peer)
            counted_addr = ""
            if not over:
                host = name
            who = str(peer) if peer else addr
            try:
                if over:
                    raise RequestError(f"too many connections from {name}", "limit")
                self._dispatch(conn, peer)
            except RequestError as exc:
                self._refuse(exc.kind, str(exc), who)
                with contextlib.suppress(OSError, ValueError):
                    conn.settimeout(2.0)
                    _send_frame(conn, KIND_ERROR, payload=str(exc).encode()[:1024])
        except (OSError, TransportError, ValueError) as exc:
            log.info("data connection from %s ended: %r", addr, exc)
        except Exception as exc:  # never an uncaught exception in a connection thread
            # refusals (RequestError) and peer faults are handled above: this is our bug,
            # logged with its trace and named to the peer by its type
            log.exception("data connection from %s failed", addr)
            with contextlib.suppress(OSError, ValueError):
                _send_frame(
                    conn, KIND_ERROR, payload=f"internal error: {type(exc).__name__}".encode()
                )
        finally:
            self._forget(conn, counted_addr, host)
            self._forget(raw, "", None)
            _graceful_close(conn)

    def _admit(
        self, raw: socket.socket, conn: socket.socket, addr: str, peer: Identity | None
    ) -> tuple[str, bool]:
        """Handshake done: count the connection against its certificate, not its address.
        (peer name, over the per-peer limit)."""
        with self._lock:
            self._conns.discard(raw)  # wrap_socket detached it; track the TLS socket
            self._conns.add(conn)
            self._per_addr[addr] -= 1
            if self._per_addr[addr] <= 0:
                del self._per_addr[addr]
            name = peer.name if peer else f"?{addr}"
            over = self._per_host[name] >= self.limits.max_conns_per_peer
            if not over:
                self._per_host[name] += 1
        return name, over

    def _dispatch(self, conn: socket.socket, peer: Identity | None) -> None:
        """Read one request and serve it; a bad or refused one raises RequestError."""
        lim = self.limits
        conn.settimeout(lim.request_timeout_s)
        head = _recv_request_part(conn, REQ.size, "request header")
        op, req = parse_request(
            head,
            lambda n: _recv_request_part(conn, n, "request header"),
            lim.max_header_bytes,
        )
        src = self._source(req["job"])
        if src is None:
            if op == OP_FETCH_MANIFEST:
                # a manifest source is named as soon as the coordinator sends it the envelope,
                # a moment before it holds the job: "not held (yet)", which is asked again
                raise RequestError(f"manifest {NOT_HELD}", "not_held")
            raise RequestError("unknown job", "unknown_job")
        topo = _int_field(req, "topo", 0, 2**62, 0)
        conn.settimeout(lim.idle_timeout_s)
        if op == OP_STREAM_STRIPE:
            stripe = _int_field(req, "stripe", 0, 1 << 20)
            blocks = src.stripe_blocks(stripe)
            if not blocks:
                raise RequestError(f"stripe {stripe} out of range")
            pos = _int_field(req, "fromPos", 0, len(blocks))
            # a downstream that holds the blocks past a gap (delta) asks for the gap only
            end = _int_field(req, "toPos", pos, len(blocks), len(blocks))
            credits = _int_field(req, "credits", 1, lim.max_credits, DEFAULT_CREDITS)
            codec = req.get("compress")
            if codec is not None and codec != wan.CODEC:
                raise RequestError(f"unknown codec {str(codec)[:40]!r} (speaks {wan.CODEC})")
            why = self.authorize(req["job"], peer, op, stripe, topo)
            if why is not None:
                raise RequestError(why, _refusal_kind(why))
            self._stream(conn, src, stripe, blocks[:end], pos, credits, compress=codec is not None)
        elif op == OP_FETCH_CHUNK:
            chunk = _int_field(req, "chunk", 0, 1 << 40)
            why = self.authorize(req["job"], peer, op, -1, topo)
            if why is not None:
                raise RequestError(why, _refusal_kind(why))
            self._fetch_chunk(conn, src, chunk)
        else:
            digest = req.get("digest")
            if not isinstance(digest, str) or not 0 < len(digest) <= MAX_DIGEST_LEN:
                raise RequestError("digest must be a non-empty string")
            why = self.authorize(req["job"], peer, op, -1, topo)
            if why is not None:
                raise RequestError(why, _refusal_kind(why))
            self._fetch_manifest(conn, src, digest)

    def _source(self, job_id: str) -> BlockSource | None:
        """The job's blocks here, waiting (bounded, as for a topology catching up) for a job
        this host is registering right now: its downstreams learn of it from the same push
        and may dial a moment before it serves. Without the wait every start raced, each
        loss a WARNING and a data-plane refusal, the counter an attack raises."""
        deadline = time.monotonic() + self.limits.topology_wait_s
        src = self.lookup(job_id)
        while src is None and time.monotonic() < deadline and not self._stop.is_set():
            self._stop.wait(SOURCE_POLL_S)
            src = self.lookup(job_id)
        return src

    def _stream(
        self,
        conn: socket.socket,
        src: BlockSource,
        stripe: int,
        blocks: list[int],
        pos: int,
        credits: int,
        *,
        compress: bool = False,
    ) -> None:
        pending = b""
        max_credits = self.limits.max_credits
        next_pace = 0.0
        while pos < len(blocks):
            if self._stop.is_set() or src.closed:
                _send_frame(conn, KIND_ERROR, payload=b"job closed on upstream")
                return
            self._still_valid(conn)
            block = blocks[pos]
            if not src.wait_block(block, HEARTBEAT_S):
                _send_frame(conn, KIND_HEARTBEAT, block=block)
                continue
            while credits <= 0:
                self._still_valid(conn)
                try:
                    data = conn.recv(4096)
                except TimeoutError:
                    raise RequestError(
                        "idle: no credit granted before the timeout", "idle"
                    ) from None
                if not data:
                    raise TransportError("downstream closed")
                pending += data
                while len(pending) >= CREDIT.size:
                    credits += CREDIT.unpack(pending[: CREDIT.size])[0]
                    pending = pending[CREDIT.size :]
                if credits > max_credits:
                    raise RequestError(f"credit overflow ({credits} > {max_credits})")
            now = time.monotonic()
            if now >= next_pace:
                ahead, fed = src.pace(stripe, blocks, pos)
                _send_frame(conn, KIND_PACE, block=ahead, offset=fed)
                next_pace = now + PACE_S
            offset, payload, crc = src.read_block(block)
            payload = self.hooks.wire_block(block, payload)
            packed = wan.encode(payload) if compress else None
            kind = KIND_BLOCK if packed is None else KIND_ZBLOCK
            wire = payload if packed is None else packed
            if self.tx_limit is not None:
                self.tx_limit(len(wire))
            _send_frame(conn, kind, block, offset, crc, wire)
            src.count_tx(len(wire))
            credits -= 1
            pos += 1
        _send_frame(conn, KIND_END)

    @staticmethod
    def _still_valid(conn: socket.socket) -> None:
        """The downstream's certificate before each block (and each wait for credit): once
        it expired or was revoked the stream is cut, refused with the check's name."""
        refused = peer_cert_refusal(conn)  # type: ignore[arg-type]  # an SSLSocket
        if refused is not None:
            raise RequestError(f"cut mid-stream: {refused[0]}: {refused[1]}", "certificate")

    def _fetch_manifest(self, conn: socket.socket, src: BlockSource, digest: str) -> None:
        held = src.envelope()
        if held is None or held[0] != digest:
            raise RequestError(f"manifest {digest} {NOT_HELD}", "not_held")
        envelope = held[1]
        if self.tx_limit is not None:
            self.tx_limit(len(envelope))
        _send_frame(conn, KIND_BLOCK, payload=envelope)
        src.count_tx(len(envelope))
        _send_frame(conn, KIND_END)

    def _fetch_chunk(self, conn: socket.socket, src: BlockSource, chunk: int) -> None:
        if not src.chunk_verified(chunk):
            raise RequestError("chunk not held", "not_held")
        for block in src.chunk_blocks(chunk):
            offset, payload, crc = src.read_block(block)
            payload = self.hooks.wire_block(block, payload)
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


@dataclass
class WireCount:
    """Bytes of block frames on one stream: as sent on the wire, and as decoded."""

    wire: int = 0
    raw: int = 0

    def add(self, wire: int, raw: int) -> None:
        self.wire += wire
        self.raw += raw


@dataclass
class Pace:
    """What a stripe stream's upstream last said of how far ahead it is (PACE frames):
    ``ahead`` blocks held ready for this stream, ``fed`` blocks its own upstream held ready
    for it, ``at`` the monotonic time it said so (0: never). A heartbeat says ahead = 0."""

    ahead: int = 0
    fed: int = 0
    at: float = 0.0


def _connect(address: str, timeout: float, tls: ssl.SSLContext, peer: str) -> socket.socket:
    """TCP + TLS 1.3 with our certificate; the server must present host ``peer``'s certificate."""
    host, _, port = address.rpartition(":")
    raw = socket.create_connection((host, int(port)), timeout=timeout)
    try:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock = tls.wrap_socket(raw, server_side=False)
    except BaseException:
        raw.close()
        raise
    ident = identity_from_peercert(sock.getpeercert())
    if ident is None or ident.role != "host" or ident.name != peer:
        sock.close()
        raise TransportError(f"{address} presented {ident}, expected host {peer}")
    try:
        refuse_expired_peer(sock, address, mid_stream=False)
    except PeerCertRefused:
        sock.close()
        raise
    return sock


def _request(sock: socket.socket, op: int, header: dict[str, object]) -> None:
    body = json.dumps(header).encode()
    sock.sendall(REQ.pack(MAGIC, op, len(body)) + body)


def _read_frames(
    sock: socket.socket,
    max_payload: int | None = None,
    block_length: Callable[[int], int] | None = None,
    wire: WireCount | None = None,
    address: str = "",
    pace: Pace | None = None,
) -> Iterator[Block | None]:
    """Yields blocks; None for a heartbeat; returns at END; raises on ERROR (and on a frame
    longer than ``max_payload``, before reading it). ZBLOCK frames are decoded to exactly
    ``block_length(block)`` bytes; without ``block_length`` (not asked for) one is refused.
    Every frame is read under the peer's certificate: once it expired or was revoked the
    stream is cut (:class:`PeerCertRefused`) before the frame is used."""
    # A buffered reader reads large payloads straight into the result object (one copy
    # from the kernel), which is measurably faster than recv_into + bytes().
    rfile = sock.makefile("rb", buffering=256 * 1024)
    count = wire if wire is not None else WireCount()
    try:
        while True:
            head = rfile.read(FRAME.size)
            if len(head) != FRAME.size:
                raise TransportError("connection closed by peer")
            kind, block, offset, length, crc = FRAME.unpack(head)
            if max_payload is not None and length > max_payload:
                raise TransportError(f"frame of {length} bytes exceeds {max_payload}")
            payload = rfile.read(length) if length else b""
            if len(payload) != length:
                raise TransportError("connection closed by peer mid-frame")
            refuse_expired_peer(sock, address)
            if kind == KIND_BLOCK:
                count.add(length, length)
                yield Block(block, offset, crc, payload)
            elif kind == KIND_ZBLOCK and block_length is not None:
                data = _decoded(block, payload, block_length)
                count.add(length, len(data))
                yield Block(block, offset, crc, data)
            elif kind == KIND_HEARTBEAT:
                _note_pace(pace, 0, None)  # waiting on its own upstream: nothing held ready
                yield None
            elif kind == KIND_PACE and pace is not None and not length:
                _note_pace(pace, block, offset)
            elif kind == KIND_END:
                return
            elif kind == KIND_ERROR:
                raise TransportError(f"upstream error: {payload.decode(errors='replace')}")
            else:
                raise TransportError(f"unknown frame kind {kind}")
    finally:
        rfile.close()


def _note_pace(pace: Pace | None, ahead: int, fed: int | None) -> None:
    """Record what the upstream said (``fed`` None: a heartbeat, which says nothing of it)."""
    if pace is None:
        return
    pace.ahead = min(ahead, PACE_AHEAD_MAX)
    if fed is not None:
        pace.fed = min(fed, PACE_AHEAD_MAX)
    pace.at = time.monotonic()


def _decoded(block: int, payload: bytes, block_length: Callable[[int], int]) -> bytes:
    try:
        return wan.decode(payload, block_length(block))
    except wan.WanFrameError as exc:
        raise TransportError(f"bad compressed frame for block {block}: {exc}") from None


class StripeStream:
    """Client side of StreamStripe. Iterate blocks; call ``grant()`` after consuming each."""

    def __init__(  # noqa: PLR0913 - the StreamStripe request header, field by field
        self,
        address: str,
        job: str,
        stripe: int,
        from_pos: int,
        credits: int = DEFAULT_CREDITS,
        stall_s: float = 5.0,
        *,
        tls: ssl.SSLContext,
        peer: str,
        topo: int = 0,
        to_pos: int | None = None,
        max_block: int | None = None,
        block_length: Callable[[int], int] | None = None,
    ) -> None:
        self.address = address
        self.max_block = max_block  # a longer frame is refused before a byte of it is read
        # set on a WAN link: ask for compressed frames, decoded to the manifest's lengths
        self.block_length = block_length
        self.wire = WireCount()
        self.pace = Pace()  # the upstream's last PACE frame
        try:
            self.sock = _connect(address, stall_s, tls, peer)
        except (OSError, ValueError) as exc:
            raise TransportError(f"connection to {address} failed: {exc}") from exc
        self.sock.settimeout(stall_s)  # no frame (not even a heartbeat) for stall_s -> stalled
        header: dict[str, object] = {
            "job": job,
            "stripe": stripe,
            "fromPos": from_pos,
            "credits": credits,
            "topo": topo,
        }
        if to_pos is not None:
            header["toPos"] = to_pos
        if block_length is not None:
            header["compress"] = wan.CODEC
        try:
            _request(self.sock, OP_STREAM_STRIPE, header)
        except OSError as exc:
            self.close()
            raise TransportError(f"connection to {address} failed: {exc}") from exc

    def __iter__(self) -> Iterator[Block | None]:
        try:
            yield from _read_frames(
                self.sock, self.max_block, self.block_length, self.wire, self.address, self.pace
            )
        except TimeoutError as exc:
            # a quiet stream past the peer's expiry is cut for it, not judged stalled
            refuse_expired_peer(self.sock, self.address)
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


class FrameFetch:
    """One request on its own connection and every block frame up to END, bounded (frame
    length, frame count); another thread may ``cancel`` it (an end-game duplicate whose
    chunk verified from another peer first): the socket is shut down under the reader."""

    def __init__(  # noqa: PLR0913 - a request, its peer and its read bounds
        self,
        address: str,
        op: int,
        header: dict[str, object],
        what: str,
        timeout: float = 30.0,
        *,
        tls: ssl.SSLContext,
        peer: str,
        max_block: int | None = None,
        max_blocks: int | None = None,
    ) -> None:
        self.address, self.op, self.header, self.what = address, op, header, what
        self.timeout, self.tls, self.peer = timeout, tls, peer
        self.max_block, self.max_blocks = max_block, max_blocks
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self.cancelled = False

    def run(self) -> list[Block]:
        try:
            sock = _connect(self.address, self.timeout, self.tls, self.peer)
        except (OSError, ValueError) as exc:
            raise TransportError(f"connection to {self.address} failed: {exc}") from exc
        with self._lock:
            self._sock = sock
            cancelled = self.cancelled
        try:
            if cancelled:
                raise TransportError(f"fetch of {self.what} cancelled")
            _request(sock, self.op, self.header)
            blocks: list[Block] = []
            for b in _read_frames(sock, self.max_block, address=self.address):
                if b is None:
                    continue
                blocks.append(b)
                if self.max_blocks is not None and len(blocks) > self.max_blocks:
                    raise TransportError(
                        f"{self.address} sent more than {self.max_blocks} blocks for {self.what}"
                    )
            return blocks
        except (OSError, ValueError) as exc:
            why = "cancelled" if self.cancelled else f"from {self.address} failed: {exc}"
            raise TransportError(f"fetch of {self.what} {why}") from exc
        except TransportError:
            if self.cancelled:
                raise TransportError(f"fetch of {self.what} cancelled") from None
            raise
        finally:
            sock.close()

    def cancel(self) -> None:
        with self._lock:
            self.cancelled = True
            sock = self._sock
        if sock is not None:
            with contextlib.suppress(OSError):
                # the kernel socket, not SSLSocket.shutdown (which tears the TLS object down
                # under a reader in another thread): the reader sees EOF and returns
                socket.socket.shutdown(sock, socket.SHUT_RDWR)


class ChunkFetch(FrameFetch):
    """Client side of FetchChunk (repair and end-game paths)."""

    def __init__(  # noqa: PLR0913 - the FetchChunk request header and its read bounds
        self,
        address: str,
        job: str,
        chunk: int,
        timeout: float = 30.0,
        *,
        tls: ssl.SSLContext,
        peer: str,
        topo: int = 0,
        max_block: int | None = None,
        max_blocks: int | None = None,
    ) -> None:
        header: dict[str, object] = {"job": job, "chunk": chunk, "topo": topo}
        super().__init__(
            address,
            OP_FETCH_CHUNK,
            header,
            f"chunk {chunk}",
            timeout,
            tls=tls,
            peer=peer,
            max_block=max_block,
            max_blocks=max_blocks,
        )


def fetch_manifest(
    address: str,
    job: str,
    digest: str,
    timeout: float = 30.0,
    *,
    tls: ssl.SSLContext,
    peer: str,
    topo: int = 0,
    max_bytes: int,
) -> bytes:
    """Client side of FetchManifest: the envelope bytes ``peer`` holds for ``digest``
    (unverified: the caller verifies them with its own trusted keys)."""
    header: dict[str, object] = {"job": job, "digest": digest, "topo": topo}
    fetch = FrameFetch(
        address,
        OP_FETCH_MANIFEST,
        header,
        "manifest",
        timeout,
        tls=tls,
        peer=peer,
        max_block=max_bytes,
        max_blocks=1,
    )
    try:
        frames = fetch.run()
    except TransportError as exc:
        if str(exc).endswith(NOT_HELD):  # not yet verified there: worth asking again
            raise ManifestNotHeld(str(exc)) from exc
        raise
    if not frames:
        raise TransportError(f"{address} sent no manifest")
    return frames[0].data
