"""The native kernel is byte-identical to hashlib: per-row digests, RFC 6962 roots, hex text."""

from __future__ import annotations

import hashlib

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relgate.integrity import hashing, kernel, merkle
from relgate.integrity.merkle import MerkleAccumulator, MerkleTree, root_from_packed_leaves
from relgate.integrity.tuples import encode_fields
from relgate.records.tokens import whitespace_runs

rows = st.lists(st.binary(max_size=200), max_size=300)
prefixes = st.sampled_from([b"", b"\x00", b"\x01", b"relgate.split.v1\x00"])


def _reference_root(leaves: list[bytes]) -> bytes:
    return MerkleTree(leaves).root


@settings(max_examples=150, deadline=None)
@given(rows, prefixes)
def test_sha256_rows_match_hashlib(values: list[bytes], prefix: bytes) -> None:
    expected = b"".join(hashlib.sha256(prefix + v).digest() for v in values)
    for arr in (pa.array(values, pa.binary()), pa.array(values, pa.large_binary())):
        assert hashing.sha256_rows(arr, prefix) == expected


@settings(max_examples=60, deadline=None)
@given(rows, st.integers(0, 20), st.integers(0, 20))
def test_sliced_and_chunked_arrays_hash_their_own_rows(values: list[bytes], a: int, b: int) -> None:
    arr = pa.array(values, pa.binary())
    sliced = arr.slice(min(a, len(values)), b)
    expected = b"".join(hashlib.sha256(v).digest() for v in sliced.to_pylist())
    assert hashing.sha256_rows(sliced) == expected
    chunked = pa.chunked_array([arr.slice(0, a), arr.slice(a)], pa.binary())
    assert hashing.sha256_rows(chunked) == b"".join(hashlib.sha256(v).digest() for v in values)


fields = st.integers(1, 4).flatmap(
    lambda k: st.lists(st.tuples(*[st.text(max_size=30)] * k), max_size=120)
)


@settings(max_examples=150, deadline=None)
@given(fields, prefixes)
def test_fused_fields_equal_hashing_the_built_encoding(
    table: list[tuple[str, ...]], prefix: bytes
) -> None:
    k = len(table[0]) if table else 2
    columns = [pa.array([row[c] for row in table], pa.string()) for c in range(k)]
    expected = b"".join(hashlib.sha256(prefix + encode_fields(list(row))).digest() for row in table)
    assert hashing.sha256_fields(*columns, prefix=prefix) == expected
    assert hashing.sha256_rows(hashing.length_prefixed(*columns), prefix) == expected


@pytest.mark.parametrize("size", [0, 1, 2038, 2039, 2040, 2041, 3000, 70_000])
def test_fused_fields_on_both_sides_of_the_row_buffer(size: int) -> None:
    """Rows whose encoding fits the kernel's 2 KiB row buffer are hashed from it, longer
    ones field by field: both give hashlib's digest, also at the exact boundary."""
    big = pa.array(["x" * size, "", "y" * (size // 2)], pa.string())
    small = pa.array(["a", "bc", ""], pa.string())
    for prefix in (b"", b"\x00"):
        expected = b"".join(
            hashlib.sha256(prefix + _lp((a.encode(), b.encode()))).digest()
            for a, b in zip(big.to_pylist(), small.to_pylist(), strict=True)
        )
        assert hashing.sha256_fields(big, small, prefix=prefix) == expected


def test_fused_fields_threaded_sliced_and_with_nulls(monkeypatch: pytest.MonkeyPatch) -> None:
    a = pa.array([f"id-{i}" for i in range(3000)], pa.string())
    b = pa.chunked_array([pa.array(["x" * (i % 40) for i in range(3000)], pa.large_string())])
    reference = hashing.sha256_rows(hashing.length_prefixed(a, b), b"\x00")
    monkeypatch.setattr(hashing, "PARALLEL_THRESHOLD", 10)
    monkeypatch.setenv("RELGATE_HASH_WORKERS", "3")
    assert hashing.sha256_fields(a, b, prefix=b"\x00") == reference
    assert hashing.sha256_fields(a.slice(7, 100), b.slice(7, 100)) == hashing.sha256_rows(
        hashing.length_prefixed(a.slice(7, 100), b.slice(7, 100))
    )
    with_null = pa.array(["p", None, "q"], pa.string())
    same = pa.array(["1", "2", "3"], pa.string())
    assert hashing.sha256_fields(with_null, same) == hashing.sha256_rows(
        hashing.length_prefixed(with_null, same)
    )
    with pytest.raises(ValueError, match="different lengths"):
        hashing.sha256_fields(a, a.slice(1))


@settings(max_examples=150, deadline=None)
@given(rows)
def test_merkle_roots_match_the_reference_tree(values: list[bytes]) -> None:
    arr = pa.array(values, pa.binary())
    assert hashing.merkle_root_rows(arr) == _reference_root(values)
    assert root_from_packed_leaves(hashing.sha256_rows(arr, b"\x00")) == _reference_root(values)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.integers(0, 70), max_size=8))
def test_accumulator_root_is_the_root_over_all_leaves(batches: list[int]) -> None:
    acc = MerkleAccumulator()
    leaves: list[bytes] = []
    for size in batches:
        batch = [len(leaves).to_bytes(4, "big") + bytes([i]) for i in range(size)]
        leaves += batch
        acc.add_packed_leaf_hashes(hashing.sha256_rows(pa.array(batch, pa.binary()), b"\x00"))
    assert acc.size == len(leaves)
    assert acc.root() == _reference_root(leaves)


def test_accumulator_across_chunk_boundaries(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(merkle, "ACCUMULATOR_CHUNK", 4)
    for n in (0, 1, 3, 4, 5, 8, 9, 12, 16, 17, 31, 33, 100):
        leaves = [i.to_bytes(2, "big") for i in range(n)]
        acc = merkle.MerkleAccumulator()
        packed = hashing.sha256_rows(pa.array(leaves, pa.binary()), b"\x00")
        for i in range(0, len(packed), 96):  # uneven batches of 3 leaves
            acc.add_packed_leaf_hashes(packed[i : i + 96])
            # O(log n) memory: less than one chunk pending, one stacked subtree per bit.
            assert len(acc._pending) < 4 * 32
            assert len(acc._stack) <= max(1, n.bit_length())
        assert acc.root() == _reference_root(leaves), n


def test_threaded_slices_match_one_call(monkeypatch: pytest.MonkeyPatch) -> None:
    values = [bytes([i % 251]) * (i % 97) for i in range(5000)]
    arr = pa.array(values, pa.binary())
    monkeypatch.setenv("RELGATE_HASH_WORKERS", "1")
    single = hashing.sha256_rows(arr, b"\x07"), hashing.merkle_root_rows(arr)
    monkeypatch.setattr(hashing, "PARALLEL_THRESHOLD", 10)
    monkeypatch.setattr(hashing, "MERKLE_CHUNK", 64)
    monkeypatch.setenv("RELGATE_HASH_WORKERS", "3")
    assert (hashing.sha256_rows(arr, b"\x07"), hashing.merkle_root_rows(arr)) == single
    assert single[1] == _reference_root(values)


@settings(max_examples=100, deadline=None)
@given(st.lists(st.binary(min_size=32, max_size=32), max_size=50))
def test_digest_strings_are_prefixed_lowercase_hex(digests: list[bytes]) -> None:
    text = hashing.digests_to_strings(b"".join(digests))
    assert text.type == pa.string()
    assert text.to_pylist() == ["sha256:" + d.hex() for d in digests]


def test_hostile_offsets_are_refused_before_native_code_reads() -> None:
    data = b"abcdef"
    out = memoryview(bytearray(64))
    past_end = np.array([0, 3, 7], dtype=np.int64)
    with pytest.raises(ValueError, match="offsets"):
        kernel.sha256_rows_into(data, past_end, 0, 2, b"", out)
    backwards = np.array([0, 4, 2], dtype=np.int64)
    with pytest.raises(ValueError, match="offsets"):
        kernel.sha256_rows_into(data, backwards, 0, 2, b"", out)
    with pytest.raises(ValueError, match="output"):
        kernel.sha256_rows_into(data, np.array([0, 3, 6], dtype=np.int64), 0, 2, b"", out[:32])
    with pytest.raises(ValueError, match="multiple of 32"):
        kernel.merkle_root(b"x" * 33)


def test_row_ranges_and_offsets_outside_the_buffers_are_refused() -> None:
    out = memoryview(bytearray(96))
    offsets = np.array([0, 1, 2, 3], dtype=np.int64)
    for lo, hi in ((0, 4), (-1, 2)):  # hi past the last offset; a negative row
        with pytest.raises(ValueError, match="row range"):
            kernel.sha256_rows_into(b"abc", offsets, lo, hi, b"", out)
    with pytest.raises(ValueError, match="offsets"):
        kernel.sha256_rows_into(b"abc", np.array([-1, 1], dtype=np.int64), 0, 1, b"", out)
    with pytest.raises(ValueError, match="row range"):
        kernel.sha256_fields_into([(b"abc", offsets)], 0, 4, b"", out)
    kernel.sha256_rows_into(b"abc", offsets, 2, 1, b"", out)  # an empty range writes nothing
    assert bytes(out) == bytes(96)


def test_hex_text_is_exactly_prefix_plus_64_hex_digits_per_digest() -> None:
    digests = hashlib.sha256(b"a").digest() + hashlib.sha256(b"b").digest()
    text = kernel.hex_digests(digests, b"sha256:")
    assert len(text) == 2 * 71
    assert (
        text == b"sha256:" + digests[:32].hex().encode() + b"sha256:" + digests[32:].hex().encode()
    )


def test_accumulator_refuses_a_partial_hash_and_counts_in_integers() -> None:
    acc = MerkleAccumulator()
    with pytest.raises(ValueError, match="multiple of 32"):
        acc.add_packed_leaf_hashes(b"x" * 33)
    acc.add_packed_leaf_hashes(bytes(96))
    assert acc.size == 3 and type(acc.size) is int


def test_only_the_hashed_rows_offsets_are_checked() -> None:
    """A slice is checked over its own offsets: what lies past ``hi`` is not read."""
    out = memoryview(bytearray(64))
    kernel.sha256_rows_into(b"ab", np.array([0, 1, 2, 0, 0], dtype=np.int64), 0, 2, b"", out)
    assert bytes(out) == hashlib.sha256(b"a").digest() + hashlib.sha256(b"b").digest()


def _reference_runs(value: bytes | None) -> int:
    """Maximal runs of bytes above 0x20, counted byte by byte in Python."""
    runs, inside = 0, False
    for byte in value or b"":
        word = byte > 0x20
        runs += word and not inside
        inside = word
    return runs


texts = st.lists(
    st.one_of(st.none(), st.binary(max_size=60), st.text(max_size=40).map(str.encode)),
    max_size=200,
)


@settings(max_examples=150, deadline=None)
@given(texts, st.integers(0, 30), st.integers(0, 30))
def test_word_runs_match_a_byte_by_byte_count(values: list[bytes | None], a: int, b: int) -> None:
    """Every row counted on its own (a run never continues into the next row), for string
    and large_string, sliced and chunked columns; a null row has no run."""
    as_text = [None if v is None else v.decode("utf-8", "replace") for v in values]
    for kind in (pa.string(), pa.large_string()):
        arr = pa.array(as_text, kind)
        expected = [_reference_runs(None if t is None else t.encode()) for t in as_text]
        assert whitespace_runs(arr).to_pylist() == expected
        sliced = arr.slice(min(a, len(arr)), b)
        assert whitespace_runs(sliced).to_pylist() == expected[min(a, len(arr)) :][:b]
        chunked = pa.chunked_array([arr.slice(0, a), arr.slice(a)], kind)
        assert whitespace_runs(chunked).to_pylist() == expected


def test_word_runs_refuse_offsets_outside_the_data() -> None:
    data = np.frombuffer(b"ab cd", dtype=np.uint8)
    assert kernel.word_runs(data, np.array([0, 2, 5]), 0x20).tolist() == [1, 1]
    assert kernel.word_runs(data, np.array([0, 5]), ord("b")).tolist() == [1]  # only 'cd' > 'b'
    with pytest.raises(ValueError, match="offsets"):
        kernel.word_runs(data, np.array([0, 6]), 0x20)
    with pytest.raises(ValueError, match="offsets"):
        kernel.word_runs(data, np.array([3, 1]), 0x20)
    with pytest.raises(ValueError, match="byte value"):
        kernel.word_runs(data, np.array([0, 5]), 256)
    assert kernel.word_runs(data, np.array([0]), 0x20).tolist() == []


def _lp(fields: tuple[bytes, ...]) -> bytes:
    return b"".join(len(f).to_bytes(4, "big") + f for f in fields)


@settings(max_examples=150, deadline=None)
@given(
    st.lists(st.tuples(st.binary(max_size=40), st.binary(max_size=70_000 // 50)), max_size=60),
    st.data(),
    prefixes,
)
def test_stream_hash_is_one_sha256_over_the_encodings_in_order(
    rows_: list[tuple[bytes, bytes]], data: st.DataObject, header: bytes
) -> None:
    """One digest over header || encode(row) for the rows in the given order (repeats and
    omissions allowed), equal to hashlib over the built encoding."""
    order = data.draw(st.lists(st.integers(0, max(0, len(rows_) - 1)), max_size=80))
    if not rows_:
        order = []
    a = pa.array([r[0] for r in rows_], pa.binary())
    b = pa.array([r[1] for r in rows_], pa.large_binary())
    chosen = [rows_[i] for i in order]
    expected = hashlib.sha256(header + b"".join(_lp(r) for r in chosen)).digest()
    assert hashing.sha256_stream(a, b, order=np.array(order, np.int64), header=header) == expected
    in_turn = hashlib.sha256(header + b"".join(_lp(r) for r in rows_)).digest()
    assert hashing.sha256_stream(a.slice(0), b, header=header) == in_turn


def test_stream_hash_crosses_the_staging_buffer_with_large_fields() -> None:
    """Fields larger than the 64 KiB staging buffer, and rows that straddle it."""
    values = [b"x" * 70_000, b"y" * 65_532, b"", b"z" * 65_536, b"w" * 3]
    arr = pa.array(values, pa.large_binary())
    expected = hashlib.sha256(b"h" + b"".join(_lp((v, v)) for v in values)).digest()
    assert hashing.sha256_stream(arr, arr, header=b"h") == expected


def test_stream_hash_refuses_orders_and_columns_that_do_not_fit() -> None:
    data = np.frombuffer(b"abcdef", dtype=np.uint8)
    offsets = np.array([0, 2, 6], np.int64)
    with pytest.raises(ValueError, match="outside the columns"):
        kernel.sha256_stream([(data, offsets)], np.array([0, 2]), b"")
    with pytest.raises(ValueError, match="outside the columns"):
        kernel.sha256_stream([(data, offsets)], np.array([-1]), b"")
    with pytest.raises(ValueError, match="different lengths"):
        kernel.sha256_stream([(data, offsets), (data, np.array([0, 6]))], None, b"")
    with pytest.raises(ValueError, match="different lengths"):  # the later column longer
        kernel.sha256_stream([(data, np.array([0, 6])), (data, offsets)], None, b"")
    with pytest.raises(ValueError, match="offsets"):
        kernel.sha256_stream([(data, np.array([0, 7]))], None, b"")
    assert kernel.sha256_stream([], None, b"h") == hashlib.sha256(b"h").digest()


def test_word_runs_accept_every_byte_value_as_separator_bound() -> None:
    """0 and 255 are byte values (mutation survivors: a bound of 254, or 0 refused)."""
    data = np.frombuffer(b"a\x00b\xff", dtype=np.uint8)
    offsets = np.array([0, 4], np.int64)
    assert kernel.word_runs(data, offsets, 0).tolist() == [2]  # 'a', then 'b\xff'
    assert kernel.word_runs(data, offsets, 0xFF).tolist() == [0]  # nothing is above 0xff
    assert kernel.word_runs(data, offsets, 0xFE).tolist() == [1]  # only '\xff'
    with pytest.raises(ValueError, match="byte value"):
        kernel.word_runs(data, offsets, -1)
    assert kernel.word_runs(data, np.array([], np.int64), 0x20).tolist() == []  # no offsets


def test_stream_hash_refuses_an_order_past_the_last_row() -> None:
    """A row number beyond the columns would make native code read outside them."""
    data = np.frombuffer(b"abcdef", dtype=np.uint8)
    offsets = np.array([0, 2, 6], np.int64)
    for order in ([0, 7], [3], [2**40]):
        with pytest.raises(ValueError, match="outside the columns"):
            kernel.sha256_stream([(data, offsets)], np.array(order, np.int64), b"")


def test_stream_hash_over_many_rows_and_with_nulls_in_order() -> None:
    """More rows than small-integer identity covers, and the null path with an order: a
    row with a null field contributes nothing, wherever the order puts it."""
    n = 1000
    a = pa.array([f"id-{i}".encode() for i in range(n)], pa.binary())
    b = pa.array([bytes([i % 256]) * (i % 7) for i in range(n)], pa.binary())
    order = np.array(list(range(n - 1, -1, -3)), np.int64)
    expected = hashlib.sha256(
        b"H" + b"".join(_lp((a[i].as_py(), b[i].as_py())) for i in order.tolist())
    ).digest()
    assert hashing.sha256_stream(a, b, order=order, header=b"H") == expected
    with_null = pa.array([None if i % 5 == 0 else f"x{i}".encode() for i in range(n)], pa.binary())
    kept = [i for i in order.tolist() if i % 5]
    expected = hashlib.sha256(
        b"H" + b"".join(_lp((with_null[i].as_py(), b[i].as_py())) for i in kept)
    ).digest()
    assert hashing.sha256_stream(with_null, b, order=order, header=b"H") == expected
    in_turn = [i for i in range(n) if i % 5]
    expected = hashlib.sha256(
        b"H" + b"".join(_lp((with_null[i].as_py(), b[i].as_py())) for i in in_turn)
    ).digest()
    assert hashing.sha256_stream(with_null, b, header=b"H") == expected
