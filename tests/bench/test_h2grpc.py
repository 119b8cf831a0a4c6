"""bench/_h2grpc.py, the coordinator bench's lean gRPC client, against a real grpc.aio server
with mutual TLS: messages both ways, status codes as grpc reports them, a server that dies,
one that is not there, and the framing of what a server sends split at any byte."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import struct
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from bench import _h2grpc as h2grpc
from relgate_agent.pki import COORDINATOR_DNS, TlsFiles, ensure_dev_pki
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg

SERVICE = "/relgate.distribution.v1.AgentService/"
REFUSED = "refused by the test server"


class Servicer(pbg.AgentServiceServicer):  # type: ignore[misc]
    async def ReportStream(self, requests: Any, context: Any) -> Any:
        async for r in requests:
            if r.host_id == "refuse":
                await context.abort(grpc.StatusCode.PERMISSION_DENIED, REFUSED)
            if not r.quiet:
                yield pb.ReportProgressResponse(topology_version=7, seq=r.seq)

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
                SERVICE + "Register",
                pb.RegisterRequest(host_id="h", have=have),
                pb.RegisterResponse,
                5,
            )
            assert reply.manifest_envelope == have * 3 and reply.manifest_digest == "d"
            with pytest.raises(h2grpc.RpcError) as refused:
                await ch.unary(
                    SERVICE + "Register",
                    pb.RegisterRequest(host_id="refuse"),
                    pb.RegisterResponse,
                    5,
                )
            assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
            assert refused.value.details() == REFUSED

            conn, call = await ch.stream(SERVICE + "ReportStream")
            for seq in range(1, 6):  # quiet ones get no answer
                call.write(pb.ReportProgressRequest(host_id="h", seq=seq, quiet=seq % 2 == 0))
            await conn.drained()
            got = [await call.read(pb.ReportProgressResponse) for _ in range(3)]
            assert [(r.seq, r.topology_version) for r in got if r] == [(1, 7), (3, 7), (5, 7)]
            call.write(pb.ReportProgressRequest(host_id="refuse", seq=6))
            with pytest.raises(h2grpc.RpcError) as denied:
                await call.read(pb.ReportProgressResponse)
            assert denied.value.code() == grpc.StatusCode.PERMISSION_DENIED
            assert call.code() == grpc.StatusCode.PERMISSION_DENIED
            with pytest.raises(h2grpc.RpcError):
                call.write(pb.ReportProgressRequest(seq=7))  # an ended call takes nothing

            _, watch = await ch.stream(SERVICE + "Watch")
            watch.write(pb.WatchRequest(host_id="h"))
            watch.done_writing()
            versions = []
            while (ev := await watch.read(pb.WatchEvent)) is not None:
                versions += [a.topology_version for a in ev.assignments]
            assert versions == [1, 2, 3] and watch.code() == grpc.StatusCode.OK
            ch.close()

    asyncio.run(go())


def test_server_gone_is_unavailable(pki: Path) -> None:
    async def go() -> None:
        async with server(pki) as (address, srv):
            ch = channel(pki, address)
            _, call = await ch.stream(SERVICE + "ReportStream")
            call.write(pb.ReportProgressRequest(host_id="h", seq=1))
            assert (await call.read(pb.ReportProgressResponse)) is not None
            await srv.stop(None)  # the leader dies with the stream open
            with pytest.raises(h2grpc.RpcError) as lost:
                async with asyncio.timeout(10):
                    await call.read(pb.ReportProgressResponse)
            assert lost.value.code() == grpc.StatusCode.UNAVAILABLE
        with pytest.raises(h2grpc.RpcError) as refused:  # nobody listens there any more
            await ch.unary(SERVICE + "Register", pb.RegisterRequest(), pb.RegisterResponse, 5)
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
                await ch.unary(SERVICE + "Register", pb.RegisterRequest(), pb.RegisterResponse, 5)
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
