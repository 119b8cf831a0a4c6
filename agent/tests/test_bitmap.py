"""Have-bitmap codec (numpy): round trip, the reference layout, hostile lengths."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from relgate_agent.storage import bitmap_from_bits, bits_from_bitmap, count_bits


def _reference_bits(bitmap: bytes, n: int) -> bytearray:
    out = bytearray(n)
    for i in range(min(n, len(bitmap) * 8)):
        if bitmap[i >> 3] >> (i & 7) & 1:
            out[i] = 1
    return out


@given(st.lists(st.integers(0, 1), max_size=300))
def test_round_trip(bits: list[int]) -> None:
    packed = bitmap_from_bits(bits)
    assert len(packed) == (len(bits) + 7) // 8
    assert bits_from_bitmap(packed, len(bits)) == bytearray(bits)
    assert bitmap_from_bits(bytearray(bits)) == packed
    assert count_bits(packed, len(bits)) == sum(bits)


@given(st.binary(max_size=64), st.integers(-5, 600))
def test_hostile_length_bounded(bitmap: bytes, n: int) -> None:
    # a peer's bitmap may be shorter or longer than the manifest says: never more than n bits,
    # missing bytes read as not verified, extra bytes (and bits past n) ignored
    want = _reference_bits(bitmap, max(n, 0))
    assert bits_from_bitmap(bitmap, n) == want
    assert count_bits(bitmap, n) == sum(want)


def test_layout_lsb_first() -> None:
    assert bitmap_from_bits(bytearray([1] + [0] * 7 + [1])) == b"\x01\x01"
    assert count_bits(b"\xff" * 4096, 12) == 12
    assert count_bits(b"", 12_500) == 0
