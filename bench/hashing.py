"""Per-row SHA-256 over an Arrow binary column: the kernel candidates side by side.

Issue 10 asks for one vectorized hashing kernel; this measures the candidates before one is
chosen (results and the physical bound in docs/performance.md).  Candidates that are not
installed (``datafusion``, ``polars-hash``) or cannot be built (no C compiler or OpenSSL
headers for the cffi kernel) are reported as unavailable, never silently skipped.  Every
candidate's output is compared byte for byte with today's ``sha256_rows`` (hashlib per row, from the
Arrow buffers), which is also the baseline.
"""

from __future__ import annotations

import hashlib
import os
import resource
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa

from relgate.integrity.hashing import sha256_rows

ROWS = int(os.environ.get("RELGATE_BENCH_HASH_ROWS", "1000000"))
WIDTH = int(os.environ.get("RELGATE_BENCH_HASH_WIDTH", "64"))

_C_SOURCE = """
#include <openssl/evp.h>
void sha256_rows(const unsigned char *data, const long long *offsets, long long n,
                 unsigned char *out) {
    EVP_MD *md = EVP_MD_fetch(NULL, "SHA256", NULL);
    EVP_MD_CTX *ctx = EVP_MD_CTX_new();
    unsigned int len;
    for (long long i = 0; i < n; i++) {
        EVP_DigestInit_ex2(ctx, md, NULL);
        EVP_DigestUpdate(ctx, data + offsets[i], (size_t)(offsets[i + 1] - offsets[i]));
        EVP_DigestFinal_ex(ctx, out + 32 * i, &len);
    }
    EVP_MD_CTX_free(ctx);
    EVP_MD_free(md);
}
"""


def _column(rows: int, width: int) -> pa.LargeBinaryArray:
    data = np.random.default_rng(7).integers(0, 256, rows * width, dtype=np.uint8).tobytes()
    offsets = np.arange(0, (rows + 1) * width, width, dtype=np.int64)
    buffers = [None, pa.py_buffer(offsets.tobytes()), pa.py_buffer(data)]
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), rows, buffers)


def _production_rows(column: pa.LargeBinaryArray) -> bytes:
    """Today's path (:func:`relgate.integrity.hashing.sha256_rows`), on one core."""
    os.environ["RELGATE_HASH_WORKERS"] = "1"
    return sha256_rows(column)


def _cffi_kernel() -> Callable[[pa.LargeBinaryArray], bytes]:
    from cffi import FFI

    ffi = FFI()
    ffi.cdef(
        "void sha256_rows(const unsigned char *, const long long *, long long, unsigned char *);"
    )
    ffi.set_source("_relgate_bench_sha256", _C_SOURCE, libraries=["crypto"])
    build = Path(tempfile.mkdtemp(prefix="relgate-bench-sha256-"))
    library = ffi.dlopen(ffi.compile(tmpdir=str(build)))

    def run(column: pa.LargeBinaryArray) -> bytes:
        out = bytearray(32 * len(column))
        offsets = ffi.cast("const long long *", ffi.from_buffer(column.buffers()[1]))
        library.sha256_rows(
            ffi.from_buffer(column.buffers()[2]), offsets, len(column), ffi.from_buffer(out)
        )
        return bytes(out)

    return run


def _datafusion(column: pa.LargeBinaryArray) -> bytes:
    import datafusion

    ctx = datafusion.SessionContext(datafusion.SessionConfig().with_target_partitions(1))
    frame = ctx.from_arrow(pa.table({"x": column}))
    table = frame.select(datafusion.functions.sha256(datafusion.col("x"))).to_arrow_table()
    return b"".join(table.column(0).to_pylist())


def _polars_hash(column: pa.LargeBinaryArray) -> bytes:
    import polars as pl
    import polars_hash  # noqa: F401 - registers the chash namespace

    frame = pl.DataFrame({"x": pl.from_arrow(column)})
    return bytes.fromhex("".join(frame.select(pl.col("x").chash.sha2_256()).to_series()))


def _best_of(fn: Callable[[], bytes], reps: int = 3) -> tuple[float, bytes]:
    best, out = float("inf"), b""
    for _ in range(reps):
        started = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - started)
    return best, out


def main() -> dict[str, Any]:
    column = _column(ROWS, WIDTH)
    baseline_s, expected = _best_of(lambda: _production_rows(column))
    floor_s, _ = _best_of(lambda: hashlib.sha256(column.buffers()[2]).digest())  # type: ignore[arg-type]
    result: dict[str, Any] = {
        "workload": f"{ROWS} rows x {WIDTH} B, per-row SHA-256, one core",
        "baselineSha256RowsNs": round(baseline_s / ROWS * 1e9, 1),
        "floorOneCallNsPerRow": round(floor_s / ROWS * 1e9, 1),
        "candidates": {},
    }
    candidates: dict[str, Callable[[], Callable[[pa.LargeBinaryArray], bytes]]] = {
        "cffi+openssl-evp": _cffi_kernel,
        "datafusion.sha256": lambda: _datafusion,
        "polars-hash.sha2_256": lambda: _polars_hash,
    }
    for name, make in candidates.items():
        try:
            kernel = make()
            secs, out = _best_of(lambda kernel=kernel: kernel(column))  # type: ignore[misc]
        except Exception as exc:  # not installed, or no compiler: say so
            result["candidates"][name] = {"unavailable": f"{type(exc).__name__}: {exc}"[:200]}
            continue
        result["candidates"][name] = {
            "nsPerRow": round(secs / ROWS * 1e9, 1),
            "speedupVsBaseline": round(baseline_s / secs, 2),
            "identicalToHashlib": out == expected,
        }
    result["peakRssMiB"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)
    return result
