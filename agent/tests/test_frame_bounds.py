"""A hostile upstream (a fleet host with a valid certificate) that announces frames larger
than a block, or more blocks than a chunk holds: the downstream refuses at the frame header,
before it reads (or allocates) the announced bytes. A real TLS 1.3 server on loopback."""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from relgate_agent.dataplane.transport import (
    FRAME,
    KIND_BLOCK,
    KIND_END,
    REQ,
    ChunkFetch,
    StripeStream,
    TransportError,
)
from relgate_agent.pki import TlsFiles, data_client_context, data_server_context, ensure_dev_pki

BLOCK = 64 * 1024


class HostileUpstream:
    """Answers any request with ``frames`` (kind, length, payload-bytes-actually-sent)."""

    def __init__(self, pki: Path, frames: list[tuple[int, int, int]]) -> None:
        self.ctx = data_server_context(TlsFiles.from_pki(pki, "h00"))
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.sock.getsockname()[1]}"
        self.frames = frames
        self.sent_payload = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        raw, _ = self.sock.accept()
        with self.ctx.wrap_socket(raw, server_side=True) as conn:
            head = conn.recv(REQ.size)
            _, _, n = REQ.unpack(head)
            conn.recv(n)
            for i, (kind, length, send) in enumerate(self.frames):
                conn.sendall(FRAME.pack(kind, i, i * BLOCK, length, 0) + b"x" * send)
                self.sent_payload += send
            conn.settimeout(5)
            with contextlib.suppress(OSError):
                conn.recv(1)  # until the downstream hangs up

    def close(self) -> None:
        self.sock.close()
        self.thread.join(timeout=5)


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_dev_pki(tmp_path_factory.mktemp("frames"), [("h00", "r0"), ("h01", "r0")])


@pytest.fixture
def upstream(pki: Path) -> Iterator[list[HostileUpstream]]:
    made: list[HostileUpstream] = []
    yield made
    for u in made:
        u.close()


def test_a_frame_announcing_2_gib_is_refused_at_its_header(pki: Path, upstream: list) -> None:
    up = HostileUpstream(pki, [(KIND_BLOCK, 2**31, 16)])
    upstream.append(up)
    tls = data_client_context(TlsFiles.from_pki(pki, "h01"))
    stream = StripeStream(up.address, "dj_1", 0, 0, tls=tls, peer="h00", max_block=BLOCK)
    try:
        with pytest.raises(TransportError, match=f"frame of {2**31} bytes exceeds {BLOCK}"):
            list(stream)
    finally:
        stream.close()


def test_a_chunk_fetch_refuses_frames_past_a_block_and_blocks_past_a_chunk(
    pki: Path, upstream: list
) -> None:
    tls = data_client_context(TlsFiles.from_pki(pki, "h01"))
    big = HostileUpstream(pki, [(KIND_BLOCK, BLOCK + 1, BLOCK + 1), (KIND_END, 0, 0)])
    upstream.append(big)
    fetch = ChunkFetch(big.address, "dj_1", 0, 10, tls=tls, peer="h00", max_block=BLOCK)
    with pytest.raises(TransportError, match=f"exceeds {BLOCK}"):
        fetch.run()
    many = HostileUpstream(pki, [(KIND_BLOCK, BLOCK, BLOCK)] * 5 + [(KIND_END, 0, 0)])
    upstream.append(many)
    fetch = ChunkFetch(
        many.address, "dj_1", 0, 10, tls=tls, peer="h00", max_block=BLOCK, max_blocks=4
    )
    with pytest.raises(TransportError, match="sent more than 4 blocks for chunk 0"):
        fetch.run()
    honest = HostileUpstream(pki, [(KIND_BLOCK, BLOCK, BLOCK)] * 4 + [(KIND_END, 0, 0)])
    upstream.append(honest)
    fetch = ChunkFetch(
        honest.address, "dj_1", 0, 10, tls=tls, peer="h00", max_block=BLOCK, max_blocks=4
    )
    assert [b.block for b in fetch.run()] == [0, 1, 2, 3]
