"""Per-row hashing over Arrow columns.

The digests here are SHA-256 by contract.  Python's per-call overhead (~1 us) would dominate
at millions of rows, so rows are hashed by the native kernel (:mod:`relgate.integrity.kernel`)
straight out of the Arrow buffers, one native call per slice, and above a size threshold on
threads (the kernel releases the GIL) that each hash a contiguous slice.
"""

from __future__ import annotations

import hashlib
import os
import struct
from concurrent.futures import ThreadPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from relgate.integrity import kernel
from relgate.integrity.merkle import root_from_packed_leaves

_LEN = struct.Struct(">I")

#: Below this many rows a second thread costs more than it saves.
PARALLEL_THRESHOLD = 50_000


def workers() -> int:
    return max(1, int(os.environ.get("RELGATE_HASH_WORKERS", str(os.cpu_count() or 1))))


def length_prefixed(*columns: pa.Array | pa.ChunkedArray, prefix: bytes = b"") -> pa.Array:
    """Row-wise ``prefix || len(c1) c1 || len(c2) c2 ...`` with 4-byte big-endian lengths.

    The same bytes :func:`relgate.integrity.tuples.encode_fields` produces for one row, built column
    at a time.
    """
    parts: list[Any] = []
    n = len(columns[0])
    for column in columns:
        col = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
        binary = pc.cast(col, pa.large_binary())
        lengths = pc.binary_length(binary).to_numpy(zero_copy_only=False).astype(">u4")
        prefix_arr = pa.FixedSizeBinaryArray.from_buffers(
            pa.binary(4), n, [None, pa.py_buffer(lengths.tobytes())]
        )
        parts.append(pc.cast(prefix_arr, pa.large_binary()))
        parts.append(binary)
    joined = pc.binary_join_element_wise(*parts, pa.scalar(b"", pa.large_binary()))
    if prefix:
        joined = pc.binary_join_element_wise(
            pa.scalar(prefix, pa.large_binary()), joined, pa.scalar(b"", pa.large_binary())
        )
    return joined


def _offsets_and_data(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, Any]:
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    arr = pc.cast(arr, pa.large_binary())
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64, count=len(arr) + 1, offset=arr.offset * 8)
    data = buffers[2] if buffers[2] is not None else b""
    return offsets, data


def _slices(n: int, parts: int) -> list[tuple[int, int]]:
    step = (n + parts - 1) // parts
    return [(lo, min(n, lo + step)) for lo in range(0, n, step)]


def _hash_into(offsets: np.ndarray, data: Any, prefix: bytes, out: memoryview) -> None:
    n = len(offsets) - 1
    nworkers = workers()
    if n < PARALLEL_THRESHOLD or nworkers == 1:
        kernel.sha256_rows_into(data, offsets, 0, n, prefix, out)
        return
    with ThreadPoolExecutor(max_workers=nworkers) as pool:
        jobs = [
            pool.submit(kernel.sha256_rows_into, data, offsets, lo, hi, prefix, out)
            for lo, hi in _slices(n, nworkers)
        ]
        for job in jobs:
            job.result()


def sha256_rows(arr: pa.Array | pa.ChunkedArray, prefix: bytes = b"") -> bytes:
    """SHA-256 of ``prefix || row`` for every row, concatenated (32 bytes per row)."""
    offsets, data = _offsets_and_data(arr)
    out = bytearray(kernel.DIGEST_BYTES * (len(offsets) - 1))
    _hash_into(offsets, data, prefix, memoryview(out))
    return bytes(out)


def _field_columns(columns: tuple[pa.Array | pa.ChunkedArray, ...]) -> list[tuple[np.ndarray, Any]]:
    return [_offsets_and_data(c) for c in columns]


def sha256_fields(*columns: pa.Array | pa.ChunkedArray, prefix: bytes = b"") -> bytes:
    """``sha256_rows(length_prefixed(*columns), prefix)`` without building the encoding.

    The tuple encoding is hashed field by field from each column's own buffers; columns
    with nulls take the composite path (what it does with a null row is the reference).
    """
    if any(c.null_count for c in columns):
        return sha256_rows(length_prefixed(*columns), prefix)
    parts = _field_columns(columns)
    n = len(parts[0][0]) - 1 if parts else 0
    if any(len(offsets) - 1 != n for offsets, _ in parts):
        raise ValueError("columns of different lengths")
    out = bytearray(kernel.DIGEST_BYTES * n)
    view = memoryview(out)
    pairs = [(data, offsets) for offsets, data in parts]
    if n < PARALLEL_THRESHOLD or workers() == 1:
        kernel.sha256_fields_into(pairs, 0, n, prefix, view)
        return bytes(out)
    with ThreadPoolExecutor(max_workers=workers()) as pool:
        jobs = [
            pool.submit(kernel.sha256_fields_into, pairs, lo, hi, prefix, view)
            for lo, hi in _slices(n, workers())
        ]
        for job in jobs:
            job.result()
    return bytes(out)


def sha256_stream(
    *columns: pa.Array | pa.ChunkedArray, order: np.ndarray | None = None, header: bytes = b""
) -> bytes:
    """SHA-256 of ``header`` and then the concatenated rows of ``length_prefixed(*columns)``
    taken in ``order`` (None: row order), without building the encoding.

    Columns with nulls take the composite path: a row with a null field is a null encoded
    row, which contributes no bytes (the reference behaviour, kept byte for byte).
    """
    if any(c.null_count for c in columns):
        encoded = length_prefixed(*columns)
        if order is not None:
            encoded = encoded.take(pa.array(order, pa.int64()))
        h = hashlib.sha256(header)
        for row in pc.drop_null(encoded).to_pylist():
            h.update(row)
        return h.digest()
    pairs = [(data, offsets) for offsets, data in _field_columns(columns)]
    return kernel.sha256_stream(pairs, order, header)


#: Leaves per aligned subtree whose root one thread reduces; a power of two.
MERKLE_CHUNK = 1 << 16


def merkle_root_rows(arr: pa.Array | pa.ChunkedArray) -> bytes:
    """RFC 6962 root over rows as leaves (``SHA-256(0x00 || row)``).

    Above the threshold, aligned subtrees of :data:`MERKLE_CHUNK` leaves are reduced on
    threads: after log2(chunk) levels the level-wise construction holds exactly the roots of
    the aligned chunks (the last, partial one reduced the same way), so the root over the
    chunk roots is the root over the leaves.
    """
    leaves = memoryview(sha256_rows(arr, b"\x00"))
    n = len(leaves) // kernel.DIGEST_BYTES
    if n <= MERKLE_CHUNK or n < PARALLEL_THRESHOLD or workers() == 1:
        return root_from_packed_leaves(leaves)
    step = MERKLE_CHUNK * kernel.DIGEST_BYTES
    with ThreadPoolExecutor(max_workers=workers()) as pool:
        roots = pool.map(
            kernel.merkle_root, [leaves[i : i + step] for i in range(0, len(leaves), step)]
        )
        return root_from_packed_leaves(b"".join(roots))


#: Digest strings per Arrow ``string`` chunk: 32-bit offsets must hold 71 bytes a row.
_STRINGS_PER_CHUNK = (2**31 - 1) // 71


def digests_to_strings(raw: bytes) -> pa.Array | pa.ChunkedArray:
    """32-byte digests -> ``sha256:<hex>`` strings (chunked above 2 GiB of text)."""
    n = len(raw) // kernel.DIGEST_BYTES
    chunks = []
    for lo in range(0, max(n, 1), _STRINGS_PER_CHUNK):
        hi = min(n, lo + _STRINGS_PER_CHUNK)
        text = kernel.hex_digests(memoryview(raw)[32 * lo : 32 * hi], b"sha256:")
        offsets = np.arange(0, 71 * (hi - lo) + 1, 71, dtype=np.int32)
        buffers = [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(text)]
        chunks.append(pa.StringArray.from_buffers(hi - lo, buffers[1], buffers[2]))
    return chunks[0] if len(chunks) == 1 else pa.chunked_array(chunks, pa.string())
