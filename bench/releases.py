"""Shard release build and verification throughput against raw SHA-256 on this machine.

Workload: one Iceberg table (pyiceberg, SQL catalog on SQLite) of N records whose text is
random base64 (about 6 bits of entropy per character, so zstd cannot shrink it much: the
shards are close to incompressible), default policies, the ``normalize`` transform; the
snapshot is built and validated, then released in ``shard_mb`` shards.

Measured in the same run:

* baseline: single-core ``hashlib.sha256`` over exactly the stored shard bytes (in memory);
* release build: ``write_release`` wall time (re-reads every record from the pinned
  source, checks it against the membership, sorts, writes parquet, stages, signs);
* verifier core: ``verify_shard`` over every shard in this process (read the exact
  version, SHA-256, parquet decode, content digests recomputed from text, token recount,
  logical and member-set digests): the per-byte work, without process start-up;
* verifier end to end: ``verify_release`` with 1 and 2 worker processes (adds forkserver
  start-up, loading the snapshot membership, the full set diff and tuple root, signing).

Target: one verifier process at >= 0.5 of raw SHA-256 bytes/s.  Run once per parquet
codec (``RELGATE_BENCH_CODECS``, default ``zstd,lz4``: zstd is the writer default, lz4
shows what entropy decoding costs).  Sizes via ``RELGATE_BENCH_RELEASE_MB`` (default 64),
``RELGATE_BENCH_TEXT_CHARS`` (2048) and ``RELGATE_BENCH_SHARD_MB`` (16).
"""

from __future__ import annotations

import base64
import hashlib
import os
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relgate.release import root as rm
from relgate.release.verifier import verify_release
from relgate.release.verify_worker import ShardTask, verify_shard
from relgate.release.writer import ParquetParams, shard_key, write_release
from relgate.snapshot.build import BuildResult, BuildSpec, build_snapshot
from relgate.snapshot.validate import validate_snapshot
from relgate.workspace import Workspace

TARGET_MB = int(os.environ.get("RELGATE_BENCH_RELEASE_MB", "64"))
CODECS = os.environ.get("RELGATE_BENCH_CODECS", "zstd,lz4").split(",")
TEXT_CHARS = int(os.environ.get("RELGATE_BENCH_TEXT_CHARS", "2048"))
SHARD_MB = int(os.environ.get("RELGATE_BENCH_SHARD_MB", "16"))


def _random_text(rng: Any, n: int, chars: int) -> list[str]:
    raw = rng.bytes(n * chars * 3 // 4)
    enc = base64.b64encode(raw).decode()
    out = []
    for i in range(n):
        s = enc[i * chars : (i + 1) * chars]
        out.append(" ".join(s[j : j + 16] for j in range(0, len(s), 16)))
    return out


def seed(home: Path, n: int) -> Any:
    import numpy as np
    import pyarrow as pa

    from relgate.snapshot.transforms import tag_transform
    from relgate.sources.iceberg import open_catalog
    from relgate.workspace import Workspace

    ws = Workspace.init(home)
    tag_transform(ws.db, "registry.local/normalize:v1")
    catalog_uri = f"sqlite:///{home / 'iceberg.db'}"
    warehouse = f"file://{home / 'warehouse'}"
    (home / "warehouse").mkdir(parents=True, exist_ok=True)
    catalog = open_catalog(catalog_uri, warehouse)
    catalog.create_namespace("bench")
    schema = pa.schema([("sample_id", pa.string()), ("lang", pa.string()), ("text", pa.string())])
    table = catalog.create_table("bench.records", schema=schema)
    rng = np.random.default_rng(7)
    step = 20_000
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        ids = pa.array([f"rnd/{i:09d}" for i in range(lo, hi)])
        langs = pa.array(np.array(["en", "de", "fr"])[rng.integers(0, 3, hi - lo)])
        texts = pa.array(_random_text(rng, hi - lo, TEXT_CHARS))
        table.append(pa.table([ids, langs, texts], schema=schema))
    ws.config["sources"] = [
        {
            "id": "records",
            "kind": "iceberg",
            "catalogUri": catalog_uri,
            "warehouse": warehouse,
            "table": "bench.records",
        }
    ]
    ws.save()
    return ws


def _rate(amount: float, seconds: float) -> float:
    return round(amount / seconds, 1) if seconds > 0 else 0.0


def main() -> dict[str, Any]:
    return {"runs": [run(codec) for codec in CODECS], "target": {"verifierOneProcessRatio>=": 0.5}}


def run(codec: str) -> dict[str, Any]:
    n = max(1000, TARGET_MB * 1024 * 1024 // TEXT_CHARS)
    with tempfile.TemporaryDirectory(prefix="relgate-bench-rel-") as tmp:
        home = Path(tmp) / "home"
        t = time.perf_counter()
        ws = seed(home, n)
        seeded = time.perf_counter() - t
        try:
            snap, release, build_s = _build_release(ws, codec)
            stored, sha_s = _sha256_baseline(ws, release)
            core_s = _verifier_core_seconds(ws, snap, release)
            e2e = _verifier_end_to_end(ws, release, stored)
            timings = _Timings(
                seed_s=seeded, build_s=build_s, sha_s=sha_s, core_s=core_s, stored=stored
            )
            return _report(codec, release, timings, e2e)
        finally:
            ws.close()


@dataclass(frozen=True)
class _Timings:
    """One codec run's measured seconds, and the stored shard bytes they cover."""

    seed_s: float
    build_s: float
    sha_s: float
    core_s: float
    stored: int


def _build_release(ws: Workspace, codec: str) -> tuple[BuildResult, rm.ReleaseManifest, float]:
    """Build and validate the snapshot, then release it; the release's build seconds."""
    snap = build_snapshot(ws, BuildSpec.from_config(ws.config), actor="bench")
    assert validate_snapshot(ws, snap.digest, actor="bench").ok

    t = time.perf_counter()
    release = write_release(
        ws,
        snap.digest,
        shard_mb=SHARD_MB,
        parquet=ParquetParams(codec=codec, level=3 if codec == "zstd" else None),
        actor="bench",
    )
    return snap, release, time.perf_counter() - t


def _sha256_baseline(ws: Workspace, release: rm.ReleaseManifest) -> tuple[int, float]:
    """Stored shard bytes, and raw single-core SHA-256 seconds over them (best of 3)."""
    blobs = [
        ws.store.get(shard_key(d["digest"], encrypted=False), d["objectVersion"])
        for d in release.shards
    ]
    stored = sum(len(b) for b in blobs)
    sha_s = min(_time(lambda: [hashlib.sha256(b).digest() for b in blobs]) for _ in range(3))
    return stored, sha_s


def _verifier_core_seconds(ws: Workspace, snap: BuildResult, release: rm.ReleaseManifest) -> float:
    """``verify_shard`` over every shard in this process, best of 2."""
    snap_schema = snap.manifest.record_schema
    tasks = [
        ShardTask(
            ws.config["objectStore"],
            d,
            snap.digest,
            release.body["recordSchema"],
            snap_schema,
            None,
        )
        for d in release.shards
    ]
    core_s = min(_time(lambda: [verify_shard(x) for x in tasks]) for _ in range(2))
    assert all(verify_shard(x).ok for x in tasks[:1])
    return core_s


def _verifier_end_to_end(
    ws: Workspace, release: rm.ReleaseManifest, stored: int
) -> dict[str, dict[str, float]]:
    """``verify_release`` with 1 and 2 worker processes: seconds and rates per run."""
    records = release.body["totals"]["records"]
    e2e: dict[str, dict[str, float]] = {}
    for workers in (1, 2):
        # The same root verified twice: the second report is recorded too, the
        # state stays VERIFIED (forward only).
        t = time.perf_counter()
        report = verify_release(ws, release.digest, workers=workers, actor="bench")
        secs = time.perf_counter() - t
        assert report.ok, report.failing
        e2e[f"workers{workers}"] = {
            "seconds": round(secs, 2),
            "bytesPerSec": _rate(stored, secs),
            "recordsPerSec": _rate(records, secs),
        }
    return e2e


def _report(
    codec: str,
    release: rm.ReleaseManifest,
    timings: _Timings,
    e2e: dict[str, dict[str, float]],
) -> dict[str, Any]:
    """The run's result document (the keys the bench has always printed)."""
    totals = release.body["totals"]
    stored = timings.stored
    raw_bps = _rate(stored, timings.sha_s)
    core_bps = _rate(stored, timings.core_s)
    return {
        "workload": {
            "records": totals["records"],
            "textChars": TEXT_CHARS,
            "text": "random base64 in 16-char words (near-incompressible)",
            "shards": totals["shards"],
            "shardMB": SHARD_MB,
            "storedBytes": stored,
            "mediaType": rm.SHARD_MEDIA_TYPE,
            "codec": codec,
            "seedSeconds": round(timings.seed_s, 1),
        },
        "baseline": {"sha256SingleCoreBytesPerSec": raw_bps, "seconds": round(timings.sha_s, 3)},
        "releaseBuild": {
            "seconds": round(timings.build_s, 2),
            "bytesPerSec": _rate(stored, timings.build_s),
            "recordsPerSec": _rate(totals["records"], timings.build_s),
        },
        "verifierCoreOneProcess": {
            "seconds": round(timings.core_s, 2),
            "bytesPerSec": core_bps,
            "recordsPerSec": _rate(totals["records"], timings.core_s),
            "ratioOverSha256": round(core_bps / raw_bps, 3),
        },
        "verifierEndToEnd": {
            k: {**v, "ratioOverSha256": round(v["bytesPerSec"] / raw_bps, 3)}
            for k, v in e2e.items()
        },
    }


def _time(fn: Any) -> float:
    t = time.perf_counter()
    fn()
    return time.perf_counter() - t


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
