"""Control-plane report path: decoding agents' have-bitmaps on the coordinator (numpy).

Workload: ``reports`` progress reports, each a ``chunks``-chunk have-bitmap (half the chunks
verified, random), counted the way the coordinator's progress cache counts them
(relgate_agent.storage.count_bits). Baseline, same run: the per-bit pure-Python decode the
coordinator used before (the issue measured ~1.9 ms per 12,500-chunk report). The figure the
issue's "<= 1 core" target needs is the decode cost of a fleet's report rate: ``hosts``
agents reporting every ``interval_s`` seconds -> cores = seconds per report x hosts / interval.
A delta report (``delta`` newly verified chunks, ~2 s of a 100 Gbps host at 64 MB chunks) is
timed too: merged into the cached bitmap and recounted, as the coordinator does.

Not yet measured here: the full load test of item 2 (simulated grpc.aio agents against the
real server, leader failover); see docs/distribution.md, "Control plane at fleet scale".
"""

from __future__ import annotations

import random
import resource
import time
from typing import Any

from relgate_agent.storage import apply_delta, bitmap_from_bits, count_bits, pack_indexes

QUICK: dict[str, int] = {"reports": 400, "chunks": 12_500, "hosts": 4096, "delta": 200}


def _python_count(bitmap: bytes, n: int) -> int:
    """The pre-numpy decode: one Python step per chunk."""
    out = bytearray(n)
    for i in range(min(n, len(bitmap) * 8)):
        if bitmap[i >> 3] >> (i & 7) & 1:
            out[i] = 1
    return sum(out)


def _per_report_s(fn: Any, bitmaps: list[bytes], n: int) -> float:
    t0 = time.process_time()
    for b in bitmaps:
        fn(b, n)
    return (time.process_time() - t0) / len(bitmaps)


def _delta_s(bitmaps: list[bytes], reports: int, chunks: int, delta: int) -> tuple[float, int]:
    """Seconds per delta report merged (coordinator side) and the delta's wire bytes."""
    wire = pack_indexes(list(range(0, chunks, max(1, chunks // max(1, delta))))[:delta])
    t0 = time.process_time()
    for i in range(reports):
        merged = apply_delta(bitmaps[i % len(bitmaps)], wire, chunks)
        assert merged is not None
        count_bits(merged, chunks)
    return (time.process_time() - t0) / reports, len(wire)


def main(
    reports: int = 4096, chunks: int = 12_500, hosts: int = 4096, delta: int = 200
) -> dict[str, Any]:
    rng = random.Random(11)
    bitmaps = [
        bitmap_from_bits(bytearray(rng.getrandbits(1) for _ in range(chunks)))
        for _ in range(min(reports, 64))
    ]
    batch = [bitmaps[i % len(bitmaps)] for i in range(reports)]
    assert all(count_bits(b, chunks) == _python_count(b, chunks) for b in bitmaps)
    interval_s = 2.0
    new_s = _per_report_s(count_bits, batch, chunks)
    base_s = _per_report_s(_python_count, batch[: max(1, reports // 8)], chunks)
    delta_s, delta_bytes = _delta_s(bitmaps, reports, chunks, delta)
    return {
        "workload": (
            f"{reports} have-bitmap decodes of {chunks} chunks (half verified); "
            f"fleet cost at {hosts} hosts reporting every {interval_s:g} s"
        ),
        "baseline": {"pythonDecodeMicros": round(base_s * 1e6, 1)},
        "numpyDecodeMicros": round(new_s * 1e6, 1),
        "ratio": round(base_s / new_s, 1) if new_s else None,
        "decodeCoresAtFleet": round(new_s * hosts / interval_s, 4),
        "deltaMergeMicros": round(delta_s * 1e6, 1),
        "deltaBytes": delta_bytes,
        "bitmapBytes": (chunks + 7) // 8,
        "baselineCoresAtFleet": round(base_s * hosts / interval_s, 3),
        "target": "coordinator <= 1 core for the whole report load (decode is a part of it)",
        "peakRssMiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }
