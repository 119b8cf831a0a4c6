"""WAN frames: byte planes + zstd, and a receiver that refuses every frame it did not ask
for or that does not decode to exactly the block the signed manifest names."""

from __future__ import annotations

import os

import numpy as np
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st
from test_frame_bounds import BLOCK, HostileUpstream, pki, upstream  # noqa: F401 - fixtures

from relgate_agent.dataplane import wan
from relgate_agent.dataplane.transport import KIND_BLOCK, KIND_ZBLOCK, StripeStream, TransportError


def bf16_block(n: int = 64 * 1024, seed: int = 3) -> bytes:
    """bf16 weights as a checkpoint stores them: the high halves of normal float32s."""
    w = (np.random.default_rng(seed).standard_normal(n // 2).astype(np.float32) * 0.02).view(
        np.uint32
    )
    return (w >> 16).astype(np.uint16).tobytes()


# noise (rarely compressible) and repeated patterns (always compressible), odd and even sizes
BLOCKS = st.binary(max_size=4096) | st.builds(
    lambda unit, n: unit * n, st.binary(min_size=1, max_size=17), st.integers(8, 400)
)


@settings(max_examples=300, deadline=None)
@given(BLOCKS)
def test_planes_and_frames_round_trip_any_bytes(data: bytes) -> None:
    assert wan.join_planes(wan.split_planes(data)) == data
    packed = wan.encode(data)
    if packed is not None:  # only ever sent when smaller
        assert len(packed) < len(data)
        assert wan.decode(packed, len(data)) == data


def test_bf16_weights_shrink_and_noise_is_sent_raw() -> None:
    block = bf16_block()
    packed = wan.encode(block)
    assert packed is not None and len(packed) < 0.8 * len(block)
    assert wan.decode(packed, len(block)) == block
    # the planes are what makes it pay: zstd over the raw bytes saves less
    assert len(packed) < len(zstandard.ZstdCompressor(level=wan.LEVEL).compress(block))
    assert wan.encode(os.urandom(64 * 1024)) is None


def test_split_planes_puts_each_byte_of_an_element_in_its_own_plane() -> None:
    assert wan.split_planes(b"aAbBcCd") == b"abcABCd"
    assert wan.join_planes(b"abcABCd") == b"aAbBcCd"


def test_a_frame_claiming_4_gib_is_refused_before_anything_is_decompressed() -> None:
    # the header's content size is read first: another size is refused on the header alone
    other = zstandard.ZstdCompressor().compress(b"\0" * 2048)
    with pytest.raises(wan.WanFrameError, match="declares 2048 bytes, the block has 1024"):
        wan.decode(other, 1024)
    frame_4g = _frame_declaring(4 << 30)
    assert len(frame_4g) < 100
    with pytest.raises(wan.WanFrameError, match=f"declares {4 << 30} bytes"):
        wan.decode(frame_4g, 64 * 1024)


def _frame_declaring(size: int) -> bytes:
    """A zstd frame header that declares ``size`` bytes of content, with a tiny body."""
    c = zstandard.ZstdCompressor(write_content_size=True)
    chunker = c.compressobj(size=size)
    return chunker.compress(b"\0" * 16) + chunker.flush(zstandard.COMPRESSOBJ_FLUSH_BLOCK)


def test_frames_without_a_size_garbage_and_truncation_are_refused() -> None:
    block = bf16_block()
    no_size = zstandard.ZstdCompressor(write_content_size=False).compress(wan.split_planes(block))
    with pytest.raises(wan.WanFrameError, match="declares -1 bytes"):
        wan.decode(no_size, len(block))
    with pytest.raises(wan.WanFrameError, match="not a zstd frame"):
        wan.decode(b"not zstd at all", len(block))
    packed = wan.encode(block)
    assert packed is not None
    with pytest.raises(wan.WanFrameError, match="does not decode"):
        wan.decode(packed[: len(packed) // 2], len(block))


# -- on the wire (a hostile upstream with a valid certificate, real TLS on loopback) --------


def _stream(up: HostileUpstream, pki_dir, *, compressed: bool) -> StripeStream:
    from relgate_agent.pki import TlsFiles, data_client_context

    tls = data_client_context(TlsFiles.from_pki(pki_dir, "h01"))
    return StripeStream(
        up.address,
        "dj_1",
        0,
        0,
        tls=tls,
        peer="h00",
        max_block=BLOCK,
        block_length=(lambda b: BLOCK) if compressed else None,
    )


def test_a_compressed_frame_nobody_asked_for_is_a_protocol_error(pki, upstream) -> None:  # noqa: F811
    up = HostileUpstream(pki, [(KIND_ZBLOCK, 16, 16)])
    upstream.append(up)
    stream = _stream(up, pki, compressed=False)
    try:
        with pytest.raises(TransportError, match="unknown frame kind 5"):
            list(stream)
    finally:
        stream.close()


def test_a_compressed_frame_that_is_not_the_block_is_refused(pki, upstream) -> None:  # noqa: F811
    up = HostileUpstream(pki, [(KIND_ZBLOCK, 16, 16)])  # 16 bytes of "x": not a zstd frame
    upstream.append(up)
    stream = _stream(up, pki, compressed=True)
    try:
        with pytest.raises(TransportError, match="bad compressed frame for block 0: not a zstd"):
            list(stream)
    finally:
        stream.close()
    assert KIND_BLOCK != KIND_ZBLOCK
