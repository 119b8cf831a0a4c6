"""A range's origin bytes are counted piece by piece as they come off the wire, and a range's
body is bounded (dataplane/origin.py): a real HTTP origin on loopback that sends what it was
asked, half of it then hangs up, or far more than it was asked."""

from __future__ import annotations

import io
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relgate_agent.dataplane.origin import WIRE_PIECE, HttpOrigin, LocalDirOrigin, read_counted
from relgate_agent.errors import OriginError

DATA = bytes(range(256)) * 8192  # 2 MiB


@pytest.fixture
def origin() -> Iterator[str]:
    """Serves DATA at /ok, half of the asked range then a hang-up at /half, and 3x the asked
    range (with a Content-Length that says so) at /more."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a: Any) -> None:
            pass

        def do_GET(self) -> None:
            if self.path == "/garbage":  # not HTTP at all: a hostile or broken origin
                self.wfile.write(b"SSH-2.0-nonsense\r\n\r\n")
                self.wfile.flush()
                self.close_connection = True
                return
            start, end = (int(x) for x in self.headers["Range"].split("=")[1].split("-"))
            body = DATA[start : end + 1]
            if self.path == "/more":
                body = body * 3
            self.send_response(206)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.path == "/half":
                self.wfile.write(body[: len(body) // 2])
                self.wfile.flush()
                self.connection.close()  # the rest never comes
                return
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}"
    finally:
        server.shutdown()
        server.server_close()
        t.join(5)


def test_a_whole_range_is_counted_in_pieces_to_the_byte(origin: str) -> None:
    pieces: list[int] = []
    length = 3 * WIRE_PIECE + 1234
    got = HttpOrigin(origin, timeout=10).read_range("ok", 100, length, received=pieces.append)
    assert got == DATA[100 : 100 + length]
    assert sum(pieces) == length and len(pieces) >= 4 and max(pieces) <= WIRE_PIECE


def test_a_range_cut_off_halfway_counts_what_came_and_is_an_origin_error(origin: str) -> None:
    pieces: list[int] = []
    length = 1 << 20
    with pytest.raises(OriginError, match=r"/half"):
        HttpOrigin(origin, timeout=10).read_range("half", 0, length, received=pieces.append)
    assert sum(pieces) == length // 2  # the origin sent half: half is counted


def test_an_origin_that_sends_more_than_the_range_is_refused_after_one_byte_more(
    origin: str,
) -> None:
    pieces: list[int] = []
    length = 1 << 20
    with pytest.raises(OriginError, match=f"wanted {length}"):
        HttpOrigin(origin, timeout=10).read_range("more", 0, length, received=pieces.append)
    assert sum(pieces) == length + 1  # never the 3 MiB it sent: one byte past is enough


def test_the_local_directory_origin_counts_its_reads(tmp_path: Path) -> None:
    (tmp_path / "f").write_bytes(DATA)
    pieces: list[int] = []
    assert LocalDirOrigin(tmp_path).read_range("f", 5, 1000, received=pieces.append) == DATA[5:1005]
    assert pieces == [1000]


class _Stream:
    """Returns at most ``sizes[i]`` bytes on its i-th read, then raises (or ends)."""

    def __init__(self, data: bytes, sizes: list[int], fail: bool) -> None:
        self.buf, self.sizes, self.fail, self.asked = io.BytesIO(data), sizes, fail, 0

    def read(self, n: int) -> bytes:
        assert 0 < n <= WIRE_PIECE
        self.asked += 1
        if not self.sizes:
            if self.fail:
                raise OSError("connection reset")
            return b""
        return self.buf.read(min(n, self.sizes.pop(0)))


@given(
    data=st.binary(max_size=3000),
    length=st.integers(0, 2500),
    sizes=st.lists(st.integers(1, 700), max_size=12),
    fail=st.booleans(),
)
def test_read_counted_counts_exactly_what_it_read_and_never_more_than_one_past(
    data: bytes, length: int, sizes: list[int], fail: bool
) -> None:
    pieces: list[int] = []
    stream = _Stream(data, list(sizes), fail)
    try:
        got = read_counted(stream.read, length, pieces.append)
    except OSError:
        got = None
    taken = sum(pieces)
    assert taken <= length + 1
    assert all(p > 0 for p in pieces)
    if got is not None:
        assert got == data[:taken] and len(got) == taken
    # the stream is read until it ends, fails, or one byte past the range came
    assert (
        got is None
        or taken == length + 1
        or taken == min(len(data), sum(sizes))
        or (not fail and taken == len(data))
    )


def test_an_origin_that_does_not_speak_http_is_an_origin_error(origin: str) -> None:
    """A status line that is not HTTP (http.client.BadStatusLine) is a refusal naming
    the URL and the range, never an internal error."""
    with pytest.raises(OriginError, match=r"/garbage bytes=0-99: BadStatusLine"):
        HttpOrigin(origin, timeout=10).read_range("garbage", 0, 100)
