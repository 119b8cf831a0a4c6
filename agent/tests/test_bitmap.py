"""Have-bitmap codec (numpy): round trip, the reference layout, hostile lengths."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from relgate_agent.staging.storage import (
    apply_delta,
    bitmap_from_bits,
    bits_from_bitmap,
    count_bits,
    delta_indexes,
    merge_delta,
    pack_indexes,
)


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


@given(st.lists(st.integers(0, 1), min_size=1, max_size=200), st.data())
def test_delta_round_trip(bits: list[int], data: st.DataObject) -> None:
    n = len(bits)
    new = [b | data.draw(st.integers(0, 1)) for b in bits]
    old_map, new_map = bitmap_from_bits(bits), bitmap_from_bits(new)
    delta = delta_indexes(old_map, new_map, n)
    assert len(delta) == 4 * (sum(new) - sum(bits))
    assert apply_delta(old_map, delta, n) == new_map
    assert apply_delta(new_map, delta, n) == new_map  # idempotent: a re-sent delta is harmless


@given(st.binary(max_size=80), st.integers(-3, 40))
def test_hostile_delta_refused_whole(delta: bytes, n: int) -> None:
    got = apply_delta(b"", delta, n)
    idx = [int.from_bytes(delta[i : i + 4], "little") for i in range(0, len(delta) - 3, 4)]
    well_formed = n > 0 and len(delta) % 4 == 0 and len(idx) <= n and all(i < n for i in idx)
    if not well_formed:
        assert got is None
    else:
        assert got is not None and bits_from_bitmap(got, n) == bytearray(
            1 if i in idx else 0 for i in range(n)
        )


def test_delta_bounds() -> None:
    assert apply_delta(b"", pack_indexes([0, 2**32 - 1]), 8) is None  # index past n
    assert apply_delta(b"", pack_indexes(list(range(9))), 8) is None  # more indexes than chunks
    assert apply_delta(b"", b"\x00\x00\x00", 8) is None  # not whole indexes
    assert apply_delta(b"", pack_indexes([7]), 8) == b"\x80"


@given(
    st.binary(max_size=40),
    st.integers(1, 300),
    st.lists(st.integers(0, 299), max_size=150),  # crosses SMALL_DELTA: both paths
)
def test_merge_counts_exactly_the_chunks_new_to_the_bitmap(
    bitmap: bytes, n: int, indexes: list[int]
) -> None:
    """A short, long or dirty (bits past n) bitmap, duplicate and repeated indexes: the merge
    equals the per-bit reference and its count is exactly what the count of the first n
    bits grew by (the coordinator keeps its cached count by it)."""
    indexes = [i % n for i in indexes]
    got = merge_delta(bitmap, pack_indexes(indexes), n)
    assert got is not None if len(indexes) <= n else got is None
    if got is None:
        return
    merged, added = got
    want = _reference_bits(bitmap, n)
    for i in indexes:
        want[i] = 1
    assert bits_from_bitmap(merged, n) == want
    assert len(merged) == (n + 7) // 8
    assert merged == bitmap_from_bits(want)  # bits past n cleared
    assert added == sum(want) - count_bits(bitmap, n)
    assert apply_delta(bitmap, pack_indexes(indexes), n) == merged


def test_merge_refuses_an_index_past_n_on_either_path() -> None:
    for many in (1, 100):
        assert merge_delta(b"", pack_indexes([0] * many + [300]), 300) is None
        assert merge_delta(b"", pack_indexes([0] * many + [299]), 300) == (
            bitmap_from_bits([1] + [0] * 298 + [1]),
            2,
        )
