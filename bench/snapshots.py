"""Snapshot build + validation at 1M and 5M members: wall time and peak RSS.

Workload: one Iceberg table (pyiceberg, SQL catalog on SQLite) of N synthetic records
(~110 bytes of text each, 3 languages), default selection/split policies, the `normalize`
transform.  Each phase runs in a fresh process so its peak RSS is its own (hash worker
processes included).  Baseline in the same run: the validator's full multiset diff
against a plain polars group_by over the same membership table.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

SIZES = [int(x) for x in os.environ.get("RELGATE_BENCH_SIZES", "1000000,5000000").split(",")]


def _rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return round(max(own, kids) / 1024, 1)


def seed(home: Path, n: int) -> None:
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
    rng = np.random.default_rng(1)
    words = np.array(
        [
            "router",
            "thermostat",
            "firmware",
            "battery",
            "pairing",
            "reset",
            "order",
            "error",
            "update",
            "noise",
            "cable",
            "screen",
        ]
    )
    step = 1_000_000
    for lo in range(0, n, step):
        hi = min(n, lo + step)
        ids = pa.array([f"rec/{i:09d}" for i in range(lo, hi)])
        langs = pa.array(np.array(["en", "de", "fr"])[rng.integers(0, 3, hi - lo)])
        picks = words[rng.integers(0, len(words), (hi - lo, 12))]
        texts = pa.array([" ".join(row) + f" #{lo + i}" for i, row in enumerate(picks.tolist())])
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


def phase_build(home: Path) -> dict[str, object]:
    from relgate.snapshot.build import BuildSpec, build_snapshot
    from relgate.workspace import Workspace

    ws = Workspace.open(home)
    t = time.perf_counter()
    result = build_snapshot(ws, BuildSpec.from_config(ws.config), actor="bench")
    return {
        "seconds": round(time.perf_counter() - t, 2),
        "peakRssMB": _rss_mb(),
        "digest": result.digest,
        "members": result.manifest.member_count,
    }


def phase_validate(home: Path, digest: str) -> dict[str, object]:
    from relgate.snapshot.validate import validate_snapshot
    from relgate.workspace import Workspace

    ws = Workspace.open(home)
    t = time.perf_counter()
    report = validate_snapshot(ws, digest, actor="bench")
    return {
        "seconds": round(time.perf_counter() - t, 2),
        "peakRssMB": _rss_mb(),
        "outcome": report.outcome,
    }


def phase_diff(home: Path, digest: str) -> dict[str, object]:
    import polars as pl

    from relgate.snapshot.compare import load_members
    from relgate.snapshot.validate import multiset_diff
    from relgate.workspace import Workspace

    ws = Workspace.open(home)
    stored = load_members(ws, digest)
    expected = stored.sample(fraction=1.0, shuffle=True, seed=3)
    t = time.perf_counter()
    ours = multiset_diff(stored, expected)
    ours_s = time.perf_counter() - t
    t = time.perf_counter()
    cols = stored.columns
    a = stored.group_by(cols).len()
    b = expected.group_by(cols).len()
    baseline = (
        a.join(b, on=cols, how="full", coalesce=True)
        .filter(pl.col("len") != pl.col("len_right"))
        .height
    )
    base_s = time.perf_counter() - t
    assert not any(ours.values()) and baseline == 0
    return {
        "multisetDiffSeconds": round(ours_s, 2),
        "polarsGroupByBaselineSeconds": round(base_s, 2),
        "ratioOverBaseline": round(ours_s / base_s, 2),
    }


def _child(*args: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-m", "bench.snapshots", *args], capture_output=True, text=True
    )
    if out.returncode != 0:
        raise RuntimeError(
            f"bench phase {args[0]} failed ({out.returncode}):\n{out.stderr[-4000:]}"
        )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> dict[str, object]:
    results: dict[str, object] = {
        "workload": "Iceberg source of N synthetic records, default policies, normalize transform",
        "runs": [],
    }
    for n in SIZES:
        with tempfile.TemporaryDirectory(prefix="relgate-bench-") as tmp:
            home = Path(tmp) / "home"
            t = time.perf_counter()
            _child("seed", str(home), str(n))
            seeded = round(time.perf_counter() - t, 1)
            build = _child("build", str(home))
            validate = _child("validate", str(home), str(build["digest"]))
            diff = _child("diff", str(home), str(build["digest"]))
            run = {
                "records": n,
                "seedSeconds": seeded,
                "build": build,
                "validate": validate,
                "diff": diff,
            }
            run["validateTarget"] = {"seconds<=": 10, "peakRssMB<=": 3072}
            results["runs"].append(run)  # type: ignore[attr-defined]
            print(json.dumps(run), flush=True)
    return results


if __name__ == "__main__":
    cmd, *rest = sys.argv[1:]
    if cmd == "seed":
        seed(Path(rest[0]), int(rest[1]))
        print(json.dumps({"ok": True}))
    elif cmd == "build":
        print(json.dumps(phase_build(Path(rest[0]))))
    elif cmd == "validate":
        print(json.dumps(phase_validate(Path(rest[0]), rest[1])))
    elif cmd == "diff":
        print(json.dumps(phase_diff(Path(rest[0]), rest[1])))
