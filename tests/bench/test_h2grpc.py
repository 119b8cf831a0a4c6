"""bench/_h2grpc.py, the coordinator bench's lean gRPC client, against a real grpc.aio server
with mutual TLS: messages both ways, status codes as grpc reports them, a server that dies,
one that is not there, and the framing of what a server sends split at any byte."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import hpack
import pytest
from hyperframe.frame import GoAwayFrame, HeadersFrame, PingFrame, SettingsFrame
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import _h2grpc as h2grpc
from relgate_agent.pki import COORDINATOR_DNS, TlsFiles, ensure_dev_pki
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg

AGENT = pb.DESCRIPTOR.services_by_name["AgentService"]
REFUSED = "refused by the test server"
DATA, RST_STREAM, PING = 0x0, 0x3, 0x6  # HTTP/2 frame types


CANCELLED_ON_SERVER = asyncio.Event()
CANCEL_ME = "cancel-me"


class Servicer(pbg.AgentServiceServicer):  # type: ignore[misc]
    async def ReportStream(self, requests: Any, context: Any) -> Any:
        last = ""
        try:
            async for r in requests:
                last = r.host_id
                if r.host_id == "refuse":
                    await context.abort(grpc.StatusCode.PERMISSION_DENIED, REFUSED)
                if not r.quiet:
                    yield pb.ReportProgressResponse(topology_version=7, seq=r.seq)
        finally:  # ended by the client's cancel (no half-close from this host)
            if last == CANCEL_ME:
                CANCELLED_ON_SERVER.set()

    async def Register(self, request: Any, context: Any) -> Any:
        if request.host_id == "refuse":
            await context.abort(grpc.StatusCode.FAILED_PRECONDITION, REFUSED)
        return pb.RegisterResponse(manifest_envelope=request.have * 3, manifest_digest="d")

    async def Watch(self, request: Any, context: Any) -> Any:
        for v in range(3):
            yield pb.WatchEvent(assignments=[pb.Assignment(topology_version=v + 1)])


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_dev_pki(tmp_path_factory.mktemp("pki"), [("h00001", "r1")])


@contextlib.asynccontextmanager
async def server(pki: Path) -> AsyncIterator[tuple[str, grpc.aio.Server]]:
    ca, cert, key = TlsFiles.from_pki(pki, "coordinator").read()
    srv = grpc.aio.server()
    pbg.add_AgentServiceServicer_to_server(Servicer(), srv)
    creds = grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )
    port = srv.add_secure_port("127.0.0.1:0", creds)
    await srv.start()
    try:
        yield f"127.0.0.1:{port}", srv
    finally:
        await srv.stop(None)


def channel(pki: Path, address: str) -> h2grpc.Channel:
    tls = TlsFiles.from_pki(pki, "h00001")
    ctx = h2grpc.client_context(str(tls.ca), str(tls.cert), str(tls.key))
    return h2grpc.Channel(address, ctx, COORDINATOR_DNS)


def test_unary_stream_and_status(pki: Path) -> None:
    async def go() -> None:
        async with server(pki) as (address, _):
            ch = channel(pki, address)
            have = b"\x01" * 4096  # three times that back: several DATA frames
            reply = await ch.unary(
                h2grpc.method_path(AGENT, "Register"),
                pb.RegisterRequest(host_id="h", have=have),
                pb.RegisterResponse,
                5,
            )
            assert reply.manifest_envelope == have * 3 and reply.manifest_digest == "d"
            with pytest.raises(h2grpc.RpcError) as refused:
                await ch.unary(
                    h2grpc.method_path(AGENT, "Register"),
                    pb.RegisterRequest(host_id="refuse"),
                    pb.RegisterResponse,
                    5,
                )
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert refused.value.details() == REFUSED

            call = await ch.stream(h2grpc.method_path(AGENT, "ReportStream"))
            for seq in range(1, 6):  # quiet ones get no answer
                call.write(pb.ReportProgressRequest(host_id="h", seq=seq, quiet=seq % 2 == 0))
            await call.conn.drained()
            got = [await call.read(pb.ReportProgressResponse) for _ in range(3)]
            assert [(r.seq, r.topology_version) for r in got if r] == [(1, 7), (3, 7), (5, 7)]
            call.write(pb.ReportProgressRequest(host_id="refuse", seq=6))
            with pytest.raises(h2grpc.RpcError) as denied:
                await call.read(pb.ReportProgressResponse)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert call.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(h2grpc.RpcError) as ended:
                call.write(pb.ReportProgressRequest(seq=7))  # an ended call takes nothing
            assert ended.value.code() == grpc.StatusCode.PERMISSION_DENIED  # and says why

            watch = await ch.stream(h2grpc.method_path(AGENT, "Watch"))
            watch.write(pb.WatchRequest(host_id="h"))
            watch.done_writing()
            versions = []
            while (ev := await watch.read(pb.WatchEvent)) is not None:
                versions += [a.topology_version for a in ev.assignments]
            assert versions == [1, 2, 3] and watch.code() == grpc.StatusCode.OK
            with pytest.raises(h2grpc.RpcError) as done:
                watch.write(pb.WatchRequest(host_id="h"))
            assert done.value.code() == grpc.StatusCode.CANCELLED

            # the client's half-close ends the server's request stream: the call ends OK
            closing = await ch.stream(h2grpc.method_path(AGENT, "ReportStream"))
            closing.write(pb.ReportProgressRequest(host_id="h", seq=1, quiet=True))
            closing.done_writing()
            async with asyncio.timeout(10):
                assert await closing.read(pb.ReportProgressResponse) is None
            assert closing.code() == grpc.StatusCode.OK

            # cancelled by the client: CANCELLED here, and the server's handler ends
            cancelled = await ch.stream(h2grpc.method_path(AGENT, "ReportStream"))
            cancelled.write(pb.ReportProgressRequest(host_id=CANCEL_ME, seq=1))
            assert await cancelled.read(pb.ReportProgressResponse) is not None
            cancelled.cancel()
            assert cancelled.code() == grpc.StatusCode.CANCELLED
            with pytest.raises(h2grpc.RpcError):
                await cancelled.read(pb.ReportProgressResponse)
            async with asyncio.timeout(10):
                await CANCELLED_ON_SERVER.wait()
            ch.close()

    asyncio.run(go())


def test_server_gone_is_unavailable(pki: Path) -> None:
    async def go() -> None:
        async with server(pki) as (address, srv):
            ch = channel(pki, address)
            ch.warm()  # connects in the background, as grpc's try_to_connect
            async with asyncio.timeout(10):
                while ch.conn is None:
                    await asyncio.sleep(0.01)
            warmed = ch.conn
            call = await ch.stream(h2grpc.method_path(AGENT, "ReportStream"))
            call.write(pb.ReportProgressRequest(host_id="h", seq=1))
            assert (await call.read(pb.ReportProgressResponse)) is not None
            assert call.conn is warmed  # the call went on the warmed connection
            await srv.stop(None)  # the leader dies with the stream open
            with pytest.raises(h2grpc.RpcError) as lost:
                async with asyncio.timeout(10):
                    await call.read(pb.ReportProgressResponse)
            assert lost.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(h2grpc.RpcError) as refused:  # nobody listens there any more
            await ch.unary(
                h2grpc.method_path(AGENT, "Register"), pb.RegisterRequest(), pb.RegisterResponse, 5
            )
        assert refused.value.code() == grpc.StatusCode.UNAVAILABLE
        assert address in refused.value.details()

    asyncio.run(go())


def test_untrusted_client_is_unavailable(pki: Path, tmp_path: Path) -> None:
    """A host whose certificate the server's CA did not sign gets no call through."""
    other = ensure_dev_pki(tmp_path, [("h00001", "r1")])

    async def go() -> None:
        async with server(pki) as (address, _):
            tls = TlsFiles.from_pki(other, "h00001")
            ctx = h2grpc.client_context(str(pki / tls.ca.name), str(tls.cert), str(tls.key))
            ch = h2grpc.Channel(address, ctx, COORDINATOR_DNS)
            with pytest.raises(h2grpc.RpcError) as refused:
                await ch.unary(
                    h2grpc.method_path(AGENT, "Register"),
                    pb.RegisterRequest(),
                    pb.RegisterResponse,
                    5,
                )
            assert refused.value.code() == grpc.StatusCode.UNAVAILABLE

    asyncio.run(go())


def _framed(body: bytes, compressed: int = 0) -> bytes:
    return struct.pack(">BI", compressed, len(body)) + body


class _Conn:
    def __init__(self) -> None:
        self.resets: list[int] = []

    def reset(self, stream_id: int) -> None:
        self.resets.append(stream_id)


@settings(max_examples=200, deadline=None)
@given(
    st.lists(st.binary(max_size=300), max_size=6),
    st.lists(st.integers(min_value=0, max_value=2000), max_size=8),
)
def test_framing_split_anywhere(bodies: list[bytes], cuts: list[int]) -> None:
    """The messages read back are the ones framed, wherever the bytes were split."""
    wire = b"".join(_framed(b) for b in bodies)
    points = sorted({0, len(wire), *(c % (len(wire) + 1) for c in cuts)})
    s = h2grpc.Stream(_Conn(), 1)  # type: ignore[arg-type]
    for a, b in itertools.pairwise(points):
        s._feed(wire[a:b])
    assert list(s.messages) == bodies and not s.buf and not s.ended


def test_method_paths_come_from_the_proto() -> None:
    assert h2grpc.method_path(AGENT, "ReportStream") == (
        "/relgate.distribution.v1.AgentService/ReportStream"
    )
    with pytest.raises(KeyError):
        h2grpc.method_path(AGENT, "NoSuchMethod")


@pytest.mark.parametrize(
    "wire",
    [_framed(b"x", compressed=1), struct.pack(">BI", 0, h2grpc.MAX_MESSAGE + 1)],
    ids=["compressed", "oversized"],
)
def test_hostile_frame_ends_the_call(wire: bytes) -> None:
    conn = _Conn()
    s = h2grpc.Stream(conn, 3)  # type: ignore[arg-type]
    s._feed(wire)
    assert s.ended and s.code() == grpc.StatusCode.INTERNAL and conn.resets == [3]
    assert not s.messages


def test_a_message_of_the_largest_size_is_waited_for() -> None:
    """A prefix announcing exactly MAX_MESSAGE bytes is legal: the call waits for its body."""
    conn = _Conn()
    s = h2grpc.Stream(conn, 5)  # type: ignore[arg-type]
    s._feed(struct.pack(">BI", 0, h2grpc.MAX_MESSAGE))
    assert not s.ended and not conn.resets and len(s.buf) == 5


class Peer:
    """A loopback TCP server that speaks raw HTTP/2 bytes to one client Connection: what
    a broken or hostile server can send, and what the client put on the wire."""

    def __init__(self, conn: h2grpc.Connection, call: h2grpc.Stream, reader: Any, writer: Any):
        self.conn, self.call, self.reader, self.writer = conn, call, reader, writer
        self.got = b""

    async def send(self, data: bytes) -> None:
        self.writer.write(data)
        await self.writer.drain()

    async def frames(self) -> list[tuple[int, int, int]]:
        """(type, stream id, length) of the frames the client sent so far, after its preface."""
        with contextlib.suppress(TimeoutError):
            while True:
                self.got += await asyncio.wait_for(self.reader.read(65536), 0.2)
        buf, out = self.got[len(b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n") :], []
        while len(buf) >= 9:
            length = int.from_bytes(buf[:3], "big")
            out.append((buf[3], int.from_bytes(buf[5:9], "big") & 0x7FFFFFFF, length))
            buf = buf[9 + length :]
        return out


async def until(done: Callable[[], bool]) -> None:
    async with asyncio.timeout(5):
        while not done():
            await asyncio.sleep(0.005)


@contextlib.asynccontextmanager
async def peer() -> AsyncIterator[Peer]:
    accepted: asyncio.Queue[tuple[Any, Any]] = asyncio.Queue()
    server = await asyncio.start_server(lambda r, w: accepted.put_nowait((r, w)), "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    _, conn = await asyncio.get_running_loop().create_connection(
        lambda: h2grpc.Connection(f"127.0.0.1:{port}"), "127.0.0.1", port
    )
    reader, writer = await accepted.get()
    p = Peer(conn, conn.open(h2grpc.method_path(AGENT, "ReportStream")), reader, writer)
    await p.send(SettingsFrame(0).serialize())  # the server's preface
    try:
        yield p
    finally:
        conn.close()
        writer.close()
        server.close()
        await server.wait_closed()


def _headers(stream_id: int, headers: list[tuple[bytes, bytes]], end: bool) -> bytes:
    frame = HeadersFrame(stream_id, data=hpack.Encoder().encode(headers))
    frame.flags.add("END_HEADERS")
    if end:
        frame.flags.add("END_STREAM")
    return bytes(frame.serialize())


@pytest.mark.parametrize(
    ("wire_bytes", "code"),
    [
        # the server's GOAWAY, and a PING after it in the same read: the server went away
        (GoAwayFrame(0).serialize() + PingFrame(0).serialize(), grpc.StatusCode.UNAVAILABLE),
        # DATA on the connection's stream 0: a protocol error
        (b"\x00\x00\x00\x00\x00\x00\x00\x00\x00", grpc.StatusCode.INTERNAL),
        # a frame header announcing more than the 16 KiB we allow: failed at the header
        (b"\x7f\xff\xff\x00\x00\x00\x00\x00\x01", grpc.StatusCode.INTERNAL),
    ],
    ids=["goaway-then-ping", "data-on-stream-0", "oversized-frame"],
)
def test_what_the_server_sends_fails_the_connection(
    wire_bytes: bytes, code: grpc.StatusCode
) -> None:
    async def go() -> None:
        async with peer() as p:
            await p.send(wire_bytes)
            await until(lambda: p.call.ended)
            assert p.call.code() == code and p.conn.closed is not None
            await asyncio.wait_for(p.reader.read(), 5)  # to EOF: the client closed its end
            with pytest.raises(h2grpc.RpcError) as refused:  # and opens nothing more
                p.conn.open(h2grpc.method_path(AGENT, "Watch"))
            assert refused.value.code() == code

    asyncio.run(go())


@pytest.mark.parametrize(
    ("headers", "code"),
    [
        ([(b"grpc-status", b"x7")], grpc.StatusCode.UNKNOWN),  # not a number
        ([(b"grpc-status", b"99")], grpc.StatusCode.UNKNOWN),  # no such code
        ([(b"grpc-status", b"5"), (b"grpc-message", b"gone")], grpc.StatusCode.NOT_FOUND),
        ([(b"content-type", b"application/grpc")], grpc.StatusCode.UNKNOWN),  # no status
    ],
)
def test_trailers_name_the_status(
    headers: list[tuple[bytes, bytes]], code: grpc.StatusCode
) -> None:
    async def go() -> None:
        async with peer() as p:
            await p.send(_headers(p.call.id, [(b":status", b"200")], end=False))
            await p.send(PingFrame(0).serialize())  # answered after the headers were read
            async with asyncio.timeout(5):
                while not any(f[0] == PING for f in await p.frames()):
                    pass
            assert not p.call.ended  # the response's headers: messages may follow
            await p.send(_headers(p.call.id, headers, end=True))
            await until(lambda: p.call.ended)
            assert p.call.code() == code

    asyncio.run(go())


def test_a_non_200_response_ends_the_call() -> None:
    async def go() -> None:
        async with peer() as p:
            await p.send(_headers(p.call.id, [(b":status", b"503")], end=False))
            await until(lambda: p.call.ended)
            assert p.call.code() == grpc.StatusCode.UNKNOWN

    asyncio.run(go())


def test_a_write_beyond_the_servers_window_is_refused() -> None:
    async def go() -> None:
        async with peer() as p:
            with pytest.raises(h2grpc.RpcError) as refused:  # 65,535 bytes open by default
                p.call.write(pb.RegisterRequest(have=b"\x01" * 70_000))
            assert refused.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
            p.call.write(pb.RegisterRequest(have=b"\x01" * 10))  # the call goes on
            data = [f for f in await p.frames() if f[0] == DATA]
            assert data == [(DATA, p.call.id, 5 + 12)]  # only the small one went out

    asyncio.run(go())


def test_cancel_resets_the_stream_on_the_wire() -> None:
    async def go() -> None:
        async with peer() as p:
            p.call.cancel()
            p.call.cancel()  # once only
            resets = [f for f in await p.frames() if f[:2] == (RST_STREAM, p.call.id)]
            assert len(resets) == 1
            assert p.call.id not in p.conn.streams and p.conn.closed is None  # the rest stays

    asyncio.run(go())


def test_drained_waits_while_the_transport_is_full() -> None:
    async def go() -> None:
        async with peer() as p:  # the transport's flow control, as it calls the protocol
            p.conn.pause_writing()
            waiting = asyncio.create_task(p.conn.drained())
            await asyncio.sleep(0.05)
            assert not waiting.done()
            p.conn.resume_writing()
            async with asyncio.timeout(5):
                await waiting

    asyncio.run(go())
