"""The native SHA-256 kernel: typed wrappers over the cffi module built from kernel_build.py.

Every function takes and returns plain buffers (``bytes``, numpy arrays, Arrow buffers) and
makes one native call whatever the number of rows; the GIL is released for that call, so
callers may run slices on threads.  Output is byte-identical to hashlib (tested as a
property in tests/integrity/test_kernel.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from relgate.integrity._sha256 import ffi, lib

DIGEST_BYTES = 32
#: The largest value of one byte.
MAX_BYTE = 0xFF


def _source(buffer: Any) -> Any:
    return ffi.from_buffer("unsigned char[]", buffer) if len(buffer) else ffi.NULL


def _check_rows(data: Any, offsets: np.ndarray, lo: int, hi: int) -> None:
    if not (lo >= 0 and hi < len(offsets)):
        raise ValueError("row range outside the offsets")
    if (
        offsets[lo] < 0
        or offsets[hi] > len(data)
        or bool(np.any(np.diff(offsets[lo : hi + 1]) < 0))
    ):
        raise ValueError("offsets do not describe the data buffer")


def sha256_rows_into(
    data: Any, offsets: np.ndarray, lo: int, hi: int, prefix: bytes, out: memoryview
) -> None:
    """Hash rows ``[lo, hi)`` (``data[offsets[i]:offsets[i+1]]``) into ``out[32*lo:32*hi]``.

    ``offsets`` is int64 with at least ``hi + 1`` entries, absolute into ``data``; ``out``
    is a writable buffer holding 32 bytes for every row of the whole column.
    """
    if hi <= lo:
        return
    if len(out) < DIGEST_BYTES * hi:
        raise ValueError("output buffer too small for the row range")
    _check_rows(data, offsets, lo, hi)
    offs = ffi.cast("const int64_t *", ffi.from_buffer(offsets)) + lo
    target = ffi.from_buffer("unsigned char[]", out, require_writable=True) + DIGEST_BYTES * lo
    lib.rg_sha256_rows(_source(data), offs, hi - lo, prefix, len(prefix), target)


#: A field's length is encoded in 4 bytes.
MAX_FIELD_BYTES = 2**32 - 1


def sha256_fields_into(
    columns: list[tuple[Any, np.ndarray]], lo: int, hi: int, prefix: bytes, out: memoryview
) -> None:
    """Hash rows ``[lo, hi)`` of ``prefix || len(c1) c1 || ...`` into ``out[32*lo:32*hi]``.

    ``columns`` are ``(data, offsets)`` pairs as for :func:`sha256_rows_into`; lengths are
    4-byte big-endian (the tuple encoding), so a field longer than 4 GiB is refused.
    """
    if hi <= lo:
        return
    if len(out) < DIGEST_BYTES * hi:
        raise ValueError("output buffer too small for the row range")
    for data, offsets in columns:
        _check_rows(data, offsets, lo, hi)
        if bool(np.any(np.diff(offsets[lo : hi + 1]) > MAX_FIELD_BYTES)):
            raise ValueError("a field is longer than its 4-byte length prefix can say")
    keep = [(_source(d), ffi.from_buffer(o)) for d, o in columns]  # alive for the call
    datas = ffi.new("const unsigned char *[]", [d for d, _ in keep])
    offs = ffi.new("const int64_t *[]", [ffi.cast("const int64_t *", o) for _, o in keep])
    target = ffi.from_buffer("unsigned char[]", out, require_writable=True)
    lib.rg_sha256_fields(len(columns), datas, offs, lo, hi, prefix, len(prefix), target)


def sha256_stream(
    columns: list[tuple[Any, np.ndarray]], order: np.ndarray | None, header: bytes
) -> bytes:
    """SHA-256 of ``header`` followed by every row's ``len(c1) c1 || len(c2) c2 ...``
    (4-byte big-endian lengths), rows taken in ``order`` (a permutation or any selection of
    row numbers; None: every row in turn).  ``columns`` as for :func:`sha256_fields_into`."""
    n_rows = len(columns[0][1]) - 1 if columns else 0
    for data, offsets in columns:
        if len(offsets) - 1 != n_rows:
            raise ValueError("columns of different lengths")
        _check_rows(data, offsets, 0, n_rows)
        if bool(np.any(np.diff(offsets) > MAX_FIELD_BYTES)):
            raise ValueError("a field is longer than its 4-byte length prefix can say")
    if order is not None:
        order = np.ascontiguousarray(order, dtype=np.int64)
        if len(order) and (int(order.min()) < 0 or int(order.max()) >= n_rows):
            raise ValueError("row order names a row outside the columns")
    count = n_rows if order is None else len(order)
    keep = [(_source(d), ffi.from_buffer(o)) for d, o in columns]  # alive for the call
    datas = ffi.new("const unsigned char *[]", [d for d, _ in keep] or [ffi.NULL])
    offs = ffi.new(
        "const int64_t *[]", [ffi.cast("const int64_t *", o) for _, o in keep] or [ffi.NULL]
    )
    rows = ffi.NULL if order is None else ffi.cast("const int64_t *", ffi.from_buffer(order))
    out = bytearray(DIGEST_BYTES)
    lib.rg_sha256_stream(
        len(columns), datas, offs, rows, count, header, len(header), ffi.from_buffer(out)
    )
    return bytes(out)


def merkle_root(packed_leaf_hashes: bytes | bytearray | memoryview) -> bytes:
    """RFC 6962 root over packed 32-byte leaf hashes (``SHA-256("")`` when there are none)."""
    n, rest = divmod(len(packed_leaf_hashes), DIGEST_BYTES)
    if rest:
        raise ValueError("packed leaf hashes are not a multiple of 32 bytes")
    if n == 0:
        out = bytearray(DIGEST_BYTES)
        lib.rg_sha256_rows(ffi.NULL, ffi.new("int64_t[2]"), 1, b"", 0, ffi.from_buffer(out))
        return bytes(out)
    scratch = bytearray(packed_leaf_hashes)
    out = bytearray(DIGEST_BYTES)
    lib.rg_merkle_root(ffi.from_buffer(scratch), n, ffi.from_buffer(out))
    return bytes(out)


def hex_digests(packed: bytes | memoryview, prefix: bytes) -> bytes:
    """``prefix + hex(digest)`` for every packed 32-byte digest, concatenated (fixed width)."""
    n, rest = divmod(len(packed), DIGEST_BYTES)
    if rest:
        raise ValueError("packed digests are not a multiple of 32 bytes")
    out = bytearray((len(prefix) + 2 * DIGEST_BYTES) * n)
    if n:
        lib.rg_hex_digests(_source(packed), n, prefix, len(prefix), ffi.from_buffer(out))
    return bytes(out)


def word_runs(data: Any, offsets: np.ndarray, separator_max: int) -> np.ndarray:
    """Per row ``i`` of ``data[offsets[i]:offsets[i+1]]``: the number of maximal runs of
    bytes above ``separator_max`` (int64, one entry per row)."""
    n = len(offsets) - 1
    out = np.zeros(max(n, 0), dtype=np.int64)
    if n <= 0:
        return out
    if not 0 <= separator_max <= MAX_BYTE:
        raise ValueError("separator_max is not a byte value")
    offsets = np.ascontiguousarray(offsets, dtype=np.int64)
    _check_rows(data, offsets, 0, n)
    offs = ffi.cast("const int64_t *", ffi.from_buffer(offsets))
    target = ffi.from_buffer("int64_t[]", out, require_writable=True)
    lib.rg_word_runs(_source(data), offs, n, separator_max, target)
    return out
