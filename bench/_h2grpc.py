"""A lean gRPC client for the simulated agents of bench/coordinator.py: gRPC's wire format
(length-prefixed protobuf messages on HTTP/2 streams, the status in trailers) spoken with h2
over asyncio's TLS, one connection per simulated host with its own certificate.

Why not grpc.aio: with 4,096 hosts in one process its per-message machinery (a completion
queue polled by another thread, handed to the event loop under the GIL) held the load side
to 1,601 of the 2,048 reports/s offered against a server that only echoes, at p50 508 ms
(bench/results/coordinator.json, ``loadSideFloor``). Here a message is one HTTP/2 DATA
frame written to the host's TLS transport and read back on the same loop, nothing else.

Only what the bench's agents use: unary calls and bidirectional/server streams, no
compression (none is advertised), no client pings (the server's keepalive pings are
answered by h2). Failures map to gRPC status codes as a grpc client reports them:
a lost connection or a refused one is UNAVAILABLE, a deadline DEADLINE_EXCEEDED.
"""

from __future__ import annotations

import asyncio
import collections
import ssl
import struct
from typing import Any, TypeVar

import grpc
import h2.config
import h2.connection
import h2.events
import h2.exceptions
import h2.settings
from google.protobuf.descriptor import ServiceDescriptor
from google.protobuf.message import Message

M = TypeVar("M", bound=Message)
_PREFIX = struct.Struct(">BI")  # gRPC message prefix: compressed flag, length
WINDOW = 16 * 1024 * 1024  # our receive windows: a manifest envelope (a few MiB) in one go
MAX_MESSAGE = 256 * 1024 * 1024
CONNECT_TIMEOUT_S = 10.0
MAX_FRAME = 16_384  # HTTP/2's default SETTINGS_MAX_FRAME_SIZE, which we do not raise
_FRAME_HEADER = 9
_CODES = {c.value[0]: c for c in grpc.StatusCode}


def method_path(service: ServiceDescriptor, name: str) -> str:
    """The HTTP/2 ``:path`` of ``service``'s method ``name``, from the proto's descriptor
    (a name it does not have is a KeyError here, not an UNIMPLEMENTED at run time)."""
    return f"/{service.full_name}/{service.methods_by_name[name].name}"


class RpcError(Exception):
    """A call that ended without OK: its gRPC status code and details (as AioRpcError's)."""

    def __init__(self, code: grpc.StatusCode, details: str = "") -> None:
        super().__init__(f"{code.name}: {details}")
        self._code, self._details = code, details

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class Stream:
    """One call: ``write`` messages, ``read`` the answers (None once the call ended OK)."""

    def __init__(self, conn: Connection, stream_id: int) -> None:
        self.conn, self.id = conn, stream_id
        self.buf = bytearray()
        self.messages: collections.deque[bytes] = collections.deque()
        self.status: RpcError | None = None
        self.ended = False
        self.waiter: asyncio.Future[None] | None = None

    def _feed(self, data: bytes) -> None:
        self.buf += data
        at = 0  # the whole messages are taken off the buffer once, at the end
        while len(self.buf) - at >= 5:
            compressed, length = _PREFIX.unpack_from(self.buf, at)
            if compressed or length > MAX_MESSAGE:
                self._end(RpcError(grpc.StatusCode.INTERNAL, "compressed or oversized message"))
                self.conn.reset(self.id)
                return
            if len(self.buf) - at < 5 + length:
                break
            self.messages.append(bytes(self.buf[at + 5 : at + 5 + length]))
            at += 5 + length
        del self.buf[:at]
        self._wake()

    def _end(self, status: RpcError | None) -> None:
        if not self.ended:
            self.ended, self.status = True, status
        self._wake()

    def _wake(self) -> None:
        if self.waiter is not None and not self.waiter.done():
            self.waiter.set_result(None)

    def write(self, message: Message) -> None:
        """Queue ``message`` on the connection (the transport sends it; nothing to await)."""
        if self.ended:
            raise self.status or RpcError(grpc.StatusCode.CANCELLED, "call already ended")
        body = message.SerializeToString()
        self.conn.send(self.id, _PREFIX.pack(0, len(body)) + body)

    def done_writing(self) -> None:
        if not self.ended:
            self.conn.send(self.id, b"", end_stream=True)

    async def read(self, cls: type[M]) -> M | None:
        while not self.messages:
            if self.ended:
                if self.status is not None:
                    raise self.status
                return None
            self.waiter = asyncio.get_running_loop().create_future()
            await self.waiter
            self.waiter = None
        msg: M = cls.FromString(self.messages.popleft())
        return msg

    def code(self) -> grpc.StatusCode | None:
        """How the call ended: OK, its error's code, or None while it runs."""
        if not self.ended:
            return None
        return grpc.StatusCode.OK if self.status is None else self.status.code()

    def cancel(self) -> None:
        if not self.ended:
            self._end(RpcError(grpc.StatusCode.CANCELLED, "cancelled by the client"))
            self.conn.reset(self.id)


class Connection(asyncio.Protocol):
    """One TLS connection's HTTP/2 client: its streams by id, its writes to the transport."""

    def __init__(self, authority: str) -> None:
        self.authority = authority
        cfg = h2.config.H2Configuration(client_side=True, header_encoding=None)
        self.h2 = h2.connection.H2Connection(config=cfg)
        self.transport: asyncio.Transport | None = None
        self.streams: dict[int, Stream] = {}
        self.closed: RpcError | None = None
        self.inbox = bytearray()  # the server's bytes not yet a whole frame
        self.writable = asyncio.Event()  # the transport's buffer is under its high-water mark
        self.writable.set()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.h2.local_settings = h2.settings.Settings(
            client=True, initial_values={h2.settings.SettingCodes.INITIAL_WINDOW_SIZE: WINDOW}
        )
        self.h2.initiate_connection()
        self.h2.increment_flow_control_window(WINDOW)
        transport.write(self.h2.data_to_send())

    def data_received(self, data: bytes) -> None:
        """The server's bytes, handed to h2 a frame at a time: after its GOAWAY the
        connection is failed and what follows is not read (h2 would refuse it as a protocol
        error, hiding the GOAWAY); a frame longer than we allow fails it at its header."""
        self.inbox += data
        at = 0  # the whole frames are taken off the inbox once, at the end
        while len(self.inbox) - at >= _FRAME_HEADER and self.closed is None:
            length = int.from_bytes(self.inbox[at : at + 3], "big")
            if length > MAX_FRAME:
                self._fail(RpcError(grpc.StatusCode.INTERNAL, f"a {length}-byte HTTP/2 frame"))
                return
            end = at + _FRAME_HEADER + length
            if len(self.inbox) < end:
                break
            try:
                events = self.h2.receive_data(bytes(self.inbox[at:end]))
            except h2.exceptions.ProtocolError as exc:
                self._fail(RpcError(grpc.StatusCode.INTERNAL, f"HTTP/2 protocol error: {exc}"))
                return
            at = end
            for ev in events:
                self._event(ev)
        del self.inbox[:at]
        self._flush()

    def _event(self, ev: h2.events.Event) -> None:
        if isinstance(ev, h2.events.DataReceived):
            self.h2.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            s = self.streams.get(ev.stream_id)
            if s is not None:
                s._feed(ev.data)
        elif isinstance(ev, (h2.events.TrailersReceived, h2.events.ResponseReceived)):
            self._headers(
                ev.stream_id, ev.headers, trailers=isinstance(ev, h2.events.TrailersReceived)
            )
        elif isinstance(ev, h2.events.StreamReset):
            self._finish(ev.stream_id, RpcError(grpc.StatusCode.UNAVAILABLE, "stream reset"))
        elif isinstance(ev, h2.events.StreamEnded):
            self._finish(ev.stream_id, RpcError(grpc.StatusCode.INTERNAL, "ended without status"))
        elif isinstance(ev, h2.events.ConnectionTerminated):
            self._fail(RpcError(grpc.StatusCode.UNAVAILABLE, "the server closed (GOAWAY)"))

    def _headers(self, stream_id: int, headers: Any, trailers: bool) -> None:
        values = {bytes(k): bytes(v) for k, v in headers}
        raw = values.get(b"grpc-status")
        if raw is None:
            if trailers or values.get(b":status", b"200") != b"200":
                self._finish(
                    stream_id, RpcError(grpc.StatusCode.UNKNOWN, f"no grpc-status: {values}")
                )
            return  # the response's headers: messages follow
        code = _CODES.get(int(raw) if raw.isdigit() else -1, grpc.StatusCode.UNKNOWN)
        details = values.get(b"grpc-message", b"").decode("utf-8", "replace")
        self._finish(stream_id, None if code == grpc.StatusCode.OK else RpcError(code, details))

    def _finish(self, stream_id: int, status: RpcError | None) -> None:
        s = self.streams.pop(stream_id, None)
        if s is not None:
            s._end(status)

    def _fail(self, status: RpcError) -> None:
        self.closed = status
        for s in list(self.streams.values()):
            s._end(status)
        self.streams.clear()
        self.writable.set()
        if self.transport is not None:
            self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        if self.closed is None:
            self._fail(RpcError(grpc.StatusCode.UNAVAILABLE, f"connection lost: {exc}"))

    def pause_writing(self) -> None:
        self.writable.clear()

    def resume_writing(self) -> None:
        self.writable.set()

    async def drained(self) -> None:
        """Until the transport takes more (at once unless the peer stopped reading)."""
        if not self.writable.is_set():
            await self.writable.wait()

    def _flush(self) -> None:
        data = self.h2.data_to_send()
        if data and self.transport is not None and not self.transport.is_closing():
            self.transport.write(data)

    def open(self, path: str) -> Stream:
        if self.closed is not None:
            raise self.closed
        sid = self.h2.get_next_available_stream_id()
        headers = [
            (b":method", b"POST"),
            (b":scheme", b"https"),
            (b":path", path.encode()),
            (b":authority", self.authority.encode()),
            (b"content-type", b"application/grpc"),
            (b"te", b"trailers"),
        ]
        self.h2.send_headers(sid, headers)
        s = self.streams[sid] = Stream(self, sid)
        self._flush()
        return s

    def send(self, stream_id: int, data: bytes, end_stream: bool = False) -> None:
        if self.closed is not None:
            raise self.closed
        if len(data) > self.h2.local_flow_control_window(stream_id):
            raise RpcError(grpc.StatusCode.RESOURCE_EXHAUSTED, "the server's window is closed")
        self.h2.send_data(stream_id, data, end_stream=end_stream)
        self._flush()

    def reset(self, stream_id: int) -> None:
        self.streams.pop(stream_id, None)
        if self.closed is None:
            try:
                self.h2.reset_stream(stream_id, error_code=8)  # CANCEL
            except h2.exceptions.StreamClosedError:
                return
            self._flush()

    async def unary(self, path: str, request: Message, cls: type[M], timeout: float) -> M:
        s = self.open(path)
        try:
            s.write(request)
            s.done_writing()
            reply = await asyncio.wait_for(s.read(cls), timeout)
            if reply is None:
                raise RpcError(grpc.StatusCode.INTERNAL, "no reply message")
            return reply
        except TimeoutError:
            s.cancel()
            raise RpcError(grpc.StatusCode.DEADLINE_EXCEEDED, "deadline exceeded") from None

    def close(self) -> None:
        if self.closed is None:
            self._fail(RpcError(grpc.StatusCode.CANCELLED, "channel closed"))


async def connect(
    address: str, context: ssl.SSLContext, server_name: str, timeout: float
) -> Connection:
    """A connection to ``address`` (host:port) presenting ``context``'s certificate; a refused
    or failed handshake is UNAVAILABLE, as a grpc channel's first call reports it."""
    host, _, port = address.rpartition(":")
    loop = asyncio.get_running_loop()
    try:
        _, conn = await asyncio.wait_for(
            loop.create_connection(
                lambda: Connection(address),
                host,
                int(port),
                ssl=context,
                server_hostname=server_name,
            ),
            timeout,
        )
    except (OSError, ssl.SSLError, TimeoutError) as exc:
        raise RpcError(grpc.StatusCode.UNAVAILABLE, f"connect {address}: {exc!r}") from None
    return conn


def client_context(ca: str, cert: str, key: str) -> ssl.SSLContext:
    """A client context for one host's mTLS identity; ALPN h2, as gRPC servers require."""
    ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=ca)
    ctx.load_cert_chain(cert, key)
    ctx.set_alpn_protocols(["h2"])
    return ctx


class Channel:
    """A host's channel to one address, as a grpc channel behaves: it connects on first use
    and again after its connection is lost (calls on a lost one fail UNAVAILABLE)."""

    def __init__(self, address: str, context: ssl.SSLContext, server_name: str) -> None:
        self.address, self.context, self.server_name = address, context, server_name
        self.conn: Connection | None = None
        self.connecting: asyncio.Task[Connection] | None = None

    async def connection(self, timeout: float = CONNECT_TIMEOUT_S) -> Connection:
        if self.conn is not None and self.conn.closed is None:
            return self.conn
        if self.connecting is None or self.connecting.done():
            self.connecting = asyncio.create_task(
                connect(self.address, self.context, self.server_name, timeout)
            )
        self.conn = await asyncio.shield(self.connecting)
        return self.conn

    def warm(self) -> None:
        """Connect now in the background (grpc's ``get_state(try_to_connect=True)``)."""
        if self.conn is None or self.conn.closed is not None:
            task = asyncio.create_task(self.connection())
            task.add_done_callback(lambda t: t.cancelled() or t.exception())

    async def unary(self, path: str, request: Message, cls: type[M], timeout: float) -> M:
        conn = await self.connection(timeout)
        return await conn.unary(path, request, cls, timeout)

    async def stream(self, path: str) -> Stream:
        """A new call on the live connection (the call's ``conn``)."""
        return (await self.connection()).open(path)

    def close(self) -> None:
        if self.conn is not None:
            self.conn.close()
