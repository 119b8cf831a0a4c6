"""Per-row SHA-256 over an Arrow binary column: the production kernel beside the candidates.

Workload: ``rows`` rows of ``width`` random bytes, each hashed separately.  Baselines measured
in the same run: hashlib called once per row from Python (the pre-kernel path) and one
hashlib call over all the bytes (the floor: raw single-core SHA-256 with no row boundaries).
Also timed: the production kernel (:mod:`relgate.integrity.kernel`) on one and on all
threads, the RFC 6962 root over the same rows as leaves, and the candidates that were
measured before it was chosen (docs/performance.md).  Candidates that are not installed
(``datafusion``, ``polars-hash``) are reported as unavailable, never silently skipped.  Every
output is compared byte for byte with hashlib's.
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
from cffi import VerificationError

from bench.record import Comparison, compare
from relgate.integrity.hashing import merkle_root_rows, sha256_rows
from relgate.integrity.merkle import MerkleTree

QUICK = {"rows": 200_000}

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


def _hashlib_per_row(column: pa.LargeBinaryArray) -> bytes:
    """The pre-kernel path: one hashlib call per row, sliced from the Arrow buffers."""
    data = memoryview(column.buffers()[2])
    offs = np.frombuffer(column.buffers()[1], dtype=np.int64).tolist()
    sha = hashlib.sha256
    return b"".join(sha(data[offs[i] : offs[i + 1]]).digest() for i in range(len(column)))


def _kernel(threads: int) -> Callable[[pa.LargeBinaryArray], bytes]:
    def run(column: pa.LargeBinaryArray) -> bytes:
        os.environ["RELGATE_HASH_WORKERS"] = str(threads)
        return sha256_rows(column)

    return run


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


def _ns(seconds: float, rows: int) -> float:
    return round(seconds / rows * 1e9, 1)


def _candidates(column: pa.LargeBinaryArray, expected: bytes, baseline_s: float) -> dict[str, Any]:
    makers: dict[str, Callable[[], Callable[[pa.LargeBinaryArray], bytes]]] = {
        "relgate.kernel, 1 thread": lambda: _kernel(1),
        f"relgate.kernel, {os.cpu_count()} threads": lambda: _kernel(os.cpu_count() or 1),
        "cffi+openssl-evp": _cffi_kernel,
        "datafusion.sha256": lambda: _datafusion,
        "polars-hash.sha2_256": lambda: _polars_hash,
    }
    out: dict[str, Any] = {}
    for name, make in makers.items():
        try:
            kernel = make()
            secs, got = _best_of(lambda kernel=kernel: kernel(column))  # type: ignore[misc]
        except (ImportError, OSError, VerificationError) as exc:  # cffi wraps compile errors
            if name.startswith("relgate."):
                raise  # the production kernel must run: a failure here is a bug, not an absence
            out[name] = {"unavailable": f"{type(exc).__name__}: {exc}"[:200]}  # not installed
            continue
        out[name] = {
            "nsPerRow": _ns(secs, len(column)),
            "speedupVsHashlibPerRow": round(baseline_s / secs, 2),
            "identicalToHashlib": got == expected,
        }
    return out


def main(rows: int = 1_000_000, width: int = 64) -> dict[str, Any]:
    column = _column(rows, width)
    baseline_s, expected = _best_of(lambda: _hashlib_per_row(column))
    floor_s, _ = _best_of(lambda: hashlib.sha256(column.buffers()[2]).digest())
    candidates = _candidates(column, expected, baseline_s)
    os.environ["RELGATE_HASH_WORKERS"] = "1"
    root_s, root = _best_of(lambda: merkle_root_rows(column))
    sample = column.slice(0, min(rows, 20_000))
    os.environ.pop("RELGATE_HASH_WORKERS", None)
    one = candidates["relgate.kernel, 1 thread"]
    return {
        "workload": f"{rows} rows x {width} B, per-row SHA-256 (and RFC 6962 root over them)",
        "baseline": {
            "hashlibPerRowNs": _ns(baseline_s, rows),
            "rawSha256OneCallNsPerRow": _ns(floor_s, rows),
        },
        "kernelNsPerRow": one.get("nsPerRow"),
        "ratioKernelVsHashlibPerRow": one.get("speedupVsHashlibPerRow"),
        "ratioRawSha256VsKernel": round(floor_s / (one["nsPerRow"] * rows / 1e9), 3),
        "merkleRootNsPerLeaf1Thread": _ns(root_s, rows),
        "merkleRootMatchesReferenceOnSample": merkle_root_rows(sample)
        == MerkleTree(sample.to_pylist()).root,
        "merkleRootBytes": len(root),
        "candidates": candidates,
        "target": "no Python call per row; within 3x of raw SHA-256 over the same bytes",
        "peakRssMiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def comparisons(result: dict[str, Any]) -> list[Comparison]:
    """Each installed candidate against hashlib per row and one hashlib call (the floor)."""
    base = result["baseline"]
    return [
        compare(
            f"per-row SHA-256: {name}",
            "ns/row",
            (name, figures["nsPerRow"]),
            ("hashlib per row", base["hashlibPerRowNs"]),
            ("one hashlib call (floor)", base["rawSha256OneCallNsPerRow"]),
        )
        for name, figures in result["candidates"].items()
        if "nsPerRow" in figures
    ]
