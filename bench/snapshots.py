"""Snapshot build + validation: wall time and peak RSS (issue 10 targets).

Workload: one Iceberg table (pyiceberg, SQL catalog on SQLite) of N synthetic records
(~110 bytes of text each, 3 languages), default selection/split policies, the `normalize`
transform.  Each phase runs in a fresh process so its peak RSS is its own (hash worker
processes included).  Baseline in the same run: a plain in-memory polars group_by
multiset diff of the same membership table against a shuffled copy of itself; the
ratio is validation time over that.  ``validate_members`` (e.g. 50M) seeds, builds and
validates a second, larger corpus and reports its validation RSS against the first's
(flat memory: <= 1.2x).
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from bench.record import Comparison, compare

QUICK: dict[str, int] = {"members": 1_000_000}
TARGET = {"seconds<=": 10, "peakRssMiB<=": 2560}
LARGE_TARGET = {"peakRssMiB<=": 3072, "rssOverFirst<=": 1.2}


def _rss_mb() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    return round(max(own, kids) / 1024, 1)


def seed(home: Path, n: int) -> None:
    import numpy as np
    import pyarrow as pa

    from relgate.snapshot.transform_tags import tag_transform
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
        "peakRssMiB": _rss_mb(),
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
        "peakRssMiB": _rss_mb(),
        "outcome": report.outcome,
    }


def phase_diff(home: Path, digest: str) -> dict[str, object]:
    import polars as pl

    from relgate.snapshot.diff import load_members
    from relgate.snapshot.external_sort import aligned
    from relgate.snapshot.selection import MEMBER_FRAME_SCHEMA
    from relgate.snapshot.validate import multiset_diff
    from relgate.workspace import Workspace

    ws = Workspace.open(home)
    stored = load_members(ws, digest)
    expected = stored.sample(fraction=1.0, shuffle=True, seed=3)
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
    t = time.perf_counter()
    resorted = expected.sort("sampleId")
    step = 65_536
    streams = [
        (stored.slice(i, step) for i in range(0, stored.height, step)),
        (resorted.slice(i, step) for i in range(0, resorted.height, step)),
    ]
    empty = pl.DataFrame(schema=MEMBER_FRAME_SCHEMA)
    found = sum(sum(multiset_diff(x, y).values()) for x, y in aligned(streams, [empty, empty]))
    ours_s = time.perf_counter() - t
    assert found == 0 and baseline == 0
    return {
        "polarsGroupByDiffSeconds": round(base_s, 2),
        "alignedDiffSeconds": round(ours_s, 2),
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


def _run(n: int, *, diff: bool) -> dict[str, object]:
    with tempfile.TemporaryDirectory(prefix="relgate-bench-") as tmp:
        home = Path(tmp) / "home"
        t = time.perf_counter()
        _child("seed", str(home), str(n))
        run: dict[str, object] = {"members": n, "seedSeconds": round(time.perf_counter() - t, 1)}
        build = _child("build", str(home))
        run["build"] = build
        run["validate"] = _child("validate", str(home), str(build["digest"]))
        if diff:
            run["diff"] = _child("diff", str(home), str(build["digest"]))
        print(json.dumps(run), flush=True)
        return run


def main(members: int = 5_000_000, validate_members: int | None = None) -> dict[str, object]:
    run = _run(members, diff=True)
    build, validate, diff = (run[k] for k in ("build", "validate", "diff"))
    assert isinstance(build, dict) and isinstance(validate, dict) and isinstance(diff, dict)
    baseline = float(diff["polarsGroupByDiffSeconds"])
    result: dict[str, object] = {
        "workload": f"Iceberg source of {members:,} synthetic records (~110 B text, 3 langs), "
        "default policies, normalize transform; build then validate, each in a fresh process",
        "baseline": {
            "what": "plain polars group_by multiset diff of the membership vs a shuffled copy",
            "seconds": baseline,
        },
        "ratio": {
            "buildOverBaseline": round(float(build["seconds"]) / baseline, 2),
            "validateOverBaseline": round(float(validate["seconds"]) / baseline, 2),
        },
        "target": {"build": TARGET, "validate": TARGET},
        "peakRssMiB": {"build": build["peakRssMiB"], "validate": validate["peakRssMiB"]},
        "runs": [run],
    }
    if validate_members:
        large = _run(validate_members, diff=False)
        large_validate = large["validate"]
        assert isinstance(large_validate, dict)
        rss = float(large_validate["peakRssMiB"])
        result["large"] = {
            "members": validate_members,
            "validate": large_validate,
            "rssOverFirst": round(rss / float(validate["peakRssMiB"]), 2),
            "target": LARGE_TARGET,
        }
        result["runs"] = [run, large]
    return result


def comparisons(result: dict[str, Any]) -> list[Comparison]:
    """Build and validate against a plain polars group_by multiset diff of the membership;
    the large run's validation (no diff of its own) against the first run's, times the
    ratio of their sizes."""
    first = result["runs"][0]
    out = [
        compare(
            f"snapshot {phase}, {first['members']:,} members",
            "s",
            (phase, first[phase]["seconds"]),
            ("polars group_by diff", first["diff"]["polarsGroupByDiffSeconds"]),
        )
        for phase in ("build", "validate")
    ]
    for large in result["runs"][1:]:
        scale = large["members"] / first["members"]
        out.append(
            compare(
                f"snapshot validate, {large['members']:,} members",
                "s",
                ("validate", large["validate"]["seconds"]),
                (f"{first['members']:,}-member validate x {scale:g}",
                 round(first["validate"]["seconds"] * scale, 2)),
            )
        )  # fmt: skip
    return out


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
