"""Per-row hashing over Arrow columns.

The digests here are SHA-256 by contract, and Python's per-call overhead (~1 us) is the
cost that dominates at millions of rows, so rows are hashed straight out of the Arrow
buffers (no per-row Python objects but the digest) and, above a size threshold, across
processes that each hash a contiguous slice.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import struct
from concurrent.futures import ProcessPoolExecutor
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from relgate.integrity.merkle import root_from_packed_leaves

_LEN = struct.Struct(">I")

#: Below this many rows the process pool costs more than it saves.
PARALLEL_THRESHOLD = 400_000


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


def _offsets_and_data(arr: pa.Array) -> tuple[np.ndarray, memoryview]:
    arr = pc.cast(arr, pa.large_binary())
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64, count=len(arr) + 1, offset=arr.offset * 8)
    data = memoryview(buffers[2]) if buffers[2] is not None else memoryview(b"")
    return offsets, data


def _hash_slice(offsets: np.ndarray, data: memoryview, lo: int, hi: int, prefix: bytes) -> bytes:
    sha = hashlib.sha256
    out = bytearray()
    offs = offsets.tolist()
    if prefix:
        for i in range(lo, hi):
            h = sha(prefix)
            h.update(data[offs[i] : offs[i + 1]])
            out += h.digest()
    else:
        for i in range(lo, hi):
            out += sha(data[offs[i] : offs[i + 1]]).digest()
    return bytes(out)


_SHARED: dict[str, Any] = {}


def _worker_slice(args: tuple[int, int, bytes]) -> bytes:
    offsets, data = _SHARED["job"]
    return _hash_slice(offsets, data, args[0], args[1], args[2])


def sha256_rows(arr: pa.Array | pa.ChunkedArray, prefix: bytes = b"") -> bytes:
    """SHA-256 of ``prefix || row`` for every row, concatenated (32 bytes per row)."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    offsets, data = _offsets_and_data(arr)
    n = len(arr)
    nworkers = workers()
    if n < PARALLEL_THRESHOLD or nworkers == 1:
        return _hash_slice(offsets, data, 0, n, prefix)
    # Fork after staging the buffers so children read them copy-on-write, not pickled.

    _SHARED["job"] = (offsets, data)
    try:
        step = (n + nworkers - 1) // nworkers
        ranges = [(lo, min(n, lo + step), prefix) for lo in range(0, n, step)]
        with ProcessPoolExecutor(max_workers=nworkers, mp_context=mp.get_context("fork")) as pool:
            return b"".join(pool.map(_worker_slice, ranges))
    finally:
        _SHARED.pop("job", None)


def _subtree_roots(offsets: np.ndarray, data: memoryview, lo: int, hi: int, chunk: int) -> bytes:
    """RFC 6962 roots of the aligned leaf chunks [lo, hi) (``chunk`` a power of two)."""
    out = bytearray()
    for start in range(lo, hi, chunk):
        leaves = _hash_slice(offsets, data, start, min(hi, start + chunk), b"\x00")
        out += root_from_packed_leaves(leaves)
    return bytes(out)


def _worker_roots(args: tuple[int, int, int]) -> bytes:
    offsets, data = _SHARED["job"]
    return _subtree_roots(offsets, data, args[0], args[1], args[2])


#: Leaves per aligned subtree whose root a worker computes; a power of two.
MERKLE_CHUNK = 1 << 16


def merkle_root_rows(arr: pa.Array | pa.ChunkedArray) -> bytes:
    """RFC 6962 root over rows as leaves, computed as aligned subtrees in parallel.

    After log2(chunk) levels of pairing, the level-wise RFC 6962 construction holds exactly
    the roots of the aligned chunks (the last, partial one reduced the same way), so the
    root over the chunk roots is the root over the leaves.
    """
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    offsets, data = _offsets_and_data(arr)
    n = len(arr)
    nworkers = workers()
    if n < PARALLEL_THRESHOLD or nworkers == 1:
        return (
            root_from_packed_leaves(_subtree_roots(offsets, data, 0, n, MERKLE_CHUNK))
            if n
            else root_from_packed_leaves(b"")
        )

    chunks = (n + MERKLE_CHUNK - 1) // MERKLE_CHUNK
    per = (chunks + nworkers - 1) // nworkers
    ranges = [
        (c * MERKLE_CHUNK, min(n, (c + per) * MERKLE_CHUNK), MERKLE_CHUNK)
        for c in range(0, chunks, per)
    ]
    _SHARED["job"] = (offsets, data)
    try:
        with ProcessPoolExecutor(max_workers=nworkers, mp_context=mp.get_context("fork")) as pool:
            return root_from_packed_leaves(b"".join(pool.map(_worker_roots, ranges)))
    finally:
        _SHARED.pop("job", None)


def digests_to_strings(raw: bytes) -> pa.Array:
    """32-byte digests -> ``sha256:<hex>`` strings."""
    n = len(raw) // 32
    hexed = raw.hex()
    return pa.array(["sha256:" + hexed[64 * i : 64 * (i + 1)] for i in range(n)], pa.string())


def digests_to_list(raw: bytes) -> list[bytes]:
    return [raw[32 * i : 32 * (i + 1)] for i in range(len(raw) // 32)]
