"""GC plan over 1M stored objects and 10k versions: wall time, peak memory, flatness.

Workload: a real workspace (SQLite catalog, real snapshot from the demo sources, real
Ed25519-signed release manifests) over an in-memory implementation of the versioned
``ObjectStore`` contract, so the benchmark measures the collector rather than a million
directory creations.  ``objects`` shard objects are stored; ``versions`` releases each
reference ``SHARDS_PER_VERSION`` of them (consecutive versions share half their shards);
every other release is INVALID (not retained), the rest are STAGED (retained), so both
mark and the candidate reasons open every manifest.

Each step runs in a fresh (spawned) process, at half the versions and at all of them with
the object count fixed, so ``peakRssMiB`` of the two steps shows whether memory grows
with the version count:

* ``planSeconds``: wall time of ``plan_gc`` (second plan: ``gc_seen`` already recorded);
* ``baselineSeconds``: a plain polars anti-join of the stored (key, versionId) columns
  against the required pairs, in the same process (what the planner's joins cost at
  least); ``listSeconds``: listing every stored version;
* ``planPythonPeakMiB``: tracemalloc peak of a third plan (Python allocations only);
  ``peakRssMiB``: the step process's maximum RSS (world included).
"""

from __future__ import annotations

import multiprocessing as mp
import resource
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

from bench.record import Comparison, compare
from relgate.errors import NotFoundError, ObjectExistsError
from relgate.objects.versioned import ObjectStore, ObjectVersion, size_refusal

SHARDS_PER_VERSION = 20
SHARD_SIZE = 256_000_000
QUICK: dict[str, int] = {"objects": 100_000, "versions": 100}
TARGET = "plan <= 10 s at 1M objects / 10k versions; peak RSS flat as versions grow"


class MemoryStore(ObjectStore):
    """The versioned-store contract in memory (benchmark only; tests use the real stores)."""

    kind = "memory"

    def __init__(self) -> None:
        self._keys: dict[str, dict[str, bytes | None]] = {}
        self._sizes: dict[tuple[str, str], int] = {}
        self._seq = 0

    def _next(self) -> str:
        self._seq += 1
        return f"{self._seq:012d}"

    def _latest(self, key: str) -> tuple[str, bytes | None] | None:
        versions = self._keys.get(key)
        if not versions:
            return None
        vid = next(reversed(versions))
        return vid, versions[vid]

    def put(self, key: str, data: bytes, size: int | None = None) -> ObjectVersion:
        vid = self._next()
        self._keys.setdefault(key, {})[vid] = data
        self._sizes[(key, vid)] = len(data) if size is None else size
        return ObjectVersion(key, vid, self._sizes[(key, vid)])

    def create(self, key: str, data: bytes) -> ObjectVersion:
        latest = self._latest(key)
        if latest is not None and latest[1] is not None:
            raise ObjectExistsError("exists", object=key, check="conditional-create")
        return self.put(key, data)

    def get(self, key: str, version_id: str, *, max_size: int | None = None) -> bytes:
        data = self._keys.get(key, {}).get(version_id)
        if data is None:
            raise NotFoundError("no such version", object=f"{key}@{version_id}", check="exists")
        if max_size is not None and len(data) > max_size:  # the store contract's bound
            raise size_refusal(key, version_id, max_size, len(data))
        return data

    def get_range(self, key: str, version_id: str, start: int, length: int) -> bytes:
        return self.get(key, version_id)[start : start + length]

    def head(self, key: str, version_id: str | None = None) -> ObjectVersion:
        latest = self._latest(key)
        if version_id is None:
            if latest is None or latest[1] is None:
                raise NotFoundError("no current version", object=key, check="exists")
            version_id = latest[0]
        self.get(key, version_id)
        return ObjectVersion(key, version_id, self._sizes[(key, version_id)])

    def list(self, prefix: str = "") -> Iterator[ObjectVersion]:
        for key in sorted(k for k in self._keys if k.startswith(prefix)):
            latest = self._latest(key)
            if latest is not None and latest[1] is not None:
                yield ObjectVersion(key, latest[0], self._sizes[(key, latest[0])])

    def list_versions(self, prefix: str = "") -> Iterator[ObjectVersion]:
        for key in sorted(k for k in self._keys if k.startswith(prefix)):
            for vid, data in self._keys[key].items():
                if data is not None:
                    yield ObjectVersion(key, vid, self._sizes[(key, vid)])

    def delete(self, key: str) -> None:
        self._keys.setdefault(key, {})[self._next()] = None

    def delete_version(self, key: str, version_id: str) -> None:
        self.get(key, version_id)
        del self._keys[key][version_id]


def _world(home: Path) -> tuple[Any, MemoryStore, dict[str, Any]]:
    from relgate.demo.corpus import seed_demo
    from relgate.snapshot.build import BuildSpec, build_snapshot
    from relgate.snapshot.transform_tags import tag_transform
    from relgate.workspace import Workspace, default_config

    store = MemoryStore()
    ws = Workspace.init(home, default_config(home))
    ws.__dict__["store"] = store  # the cached component, replaced before first use
    for tag in ("registry.local/normalize:v1", "registry.local/identity:v1"):
        tag_transform(ws.db, tag)
    seed_demo(ws, tickets=40, forum_objects=2, per_object=10, chat_events=20)
    snap = build_snapshot(ws, BuildSpec.from_config(ws.config), actor="bench")
    return ws, store, {"snapshot": snap.digest, "members": snap.manifest.members_ref}


def _shard_pool(store: MemoryStore, objects: int) -> list[tuple[str, str]]:
    pool = []
    for i in range(objects):
        hexd = f"{i:064x}"
        version = store.put(f"shards/sha256/{hexd}.parquet", b"", size=SHARD_SIZE)
        pool.append((hexd, version.version_id))
    return pool


def _add_versions(
    ws: Any, pool: list[tuple[str, str]], facts: dict[str, Any], start: int, stop: int
) -> None:
    from relgate.catalog.release_table import insert_release
    from relgate.catalog.states import transition
    from relgate.documents import release_root as rm
    from relgate.documents.shard_format import ShardFormat
    from relgate.records.record_schema import TEXT_SCHEMA

    fmt = ShardFormat(TEXT_SCHEMA)
    step = max(1, SHARDS_PER_VERSION // 2)
    with ws.db.tx() as conn:
        for v in range(start, stop):
            first = (v * step) % max(1, len(pool) - SHARDS_PER_VERSION)
            shards = [
                {
                    "id": f"shard-{i:05d}-of-{SHARDS_PER_VERSION:05d}",
                    "mediaType": rm.SHARD_MEDIA_TYPE,
                    "digest": "sha256:" + pool[first + i][0],
                    "size": SHARD_SIZE,
                    "objectVersion": pool[first + i][1],
                    "logicalDigest": "sha256:" + pool[first + i][0],
                    "records": 1000,
                    "tokens": 64_000_000,
                    "memberSetDigest": "sha256:" + pool[first + i][0],
                }
                for i in range(SHARDS_PER_VERSION)
            ]
            body = {
                "schema": rm.SCHEMA,
                "datasetSnapshot": facts["snapshot"],
                "tombstoneWatermark": 0,
                "benchmarkFence": 0,
                "recordSchema": fmt.digest,
                "recordSchemaDocument": fmt.document.to_json(),
                "shards": shards,
                "totals": {"shards": len(shards), "records": 1000 * len(shards), "version": v},
                "orderedMemberTupleRoot": "sha256:" + "0" * 64,
                "writer": {"bench": True},
            }
            sealed = rm.seal_document(body)
            version = rm.store_envelope(ws.store, sealed, rm.sign(sealed, ws.signing_key))
            insert_release(
                conn,
                sealed,
                members_digest=facts["members"].digest,
                members_version=facts["members"].version_id,
                envelope_version=version,
                actor="bench",
            )
            if v % 2:
                transition(
                    conn, "release", str(sealed["rootId"]), "INVALID", actor="bench", reason="bench"
                )


def _baseline(store: MemoryStore, required: Any) -> tuple[float, float, int]:
    """(listing seconds, plain polars anti-join seconds, rows it kept)."""
    import polars as pl

    t = time.perf_counter()
    listed = list(store.list_versions(""))
    list_seconds = time.perf_counter() - t
    stored = pl.DataFrame(
        {"key": [v.key for v in listed], "version_id": [v.version_id for v in listed]}
    )
    pairs = pl.from_arrow(required.rename_columns(["key", "version_id"]))
    assert isinstance(pairs, pl.DataFrame)
    t = time.perf_counter()
    kept = stored.join(pairs, on=["key", "version_id"], how="anti").height
    return list_seconds, time.perf_counter() - t, kept


def _step(objects: int, versions: int) -> dict[str, Any]:
    """One fresh process: build the world, plan three times, measure."""
    from relgate.lifecycle.collector import plan_gc

    with tempfile.TemporaryDirectory() as tmp:
        t = time.perf_counter()
        ws, store, facts = _world(Path(tmp) / "home")
        pool = _shard_pool(store, objects)
        _add_versions(ws, pool, facts, 0, versions)
        world_seconds = time.perf_counter() - t
        plan_gc(ws, grace_seconds=0)  # records gc_seen
        t = time.perf_counter()
        plan = plan_gc(ws, grace_seconds=0)
        plan_seconds = time.perf_counter() - t
        list_seconds, baseline_seconds, kept = _baseline(store, plan.required_table)
        tracemalloc.start()
        plan_gc(ws, grace_seconds=0)
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        ws.close()
    return {
        "versions": versions,
        "storedObjects": plan.stored,
        "retainedVersions": len(plan.retained),
        "requiredObjects": plan.required_table.num_rows,
        "candidates": plan.candidate_count,
        "baselineKept": kept,
        "worldSeconds": round(world_seconds, 1),
        "planSeconds": round(plan_seconds, 2),
        "listSeconds": round(list_seconds, 2),
        "baselineSeconds": round(baseline_seconds, 3),
        "planPythonPeakMiB": round(peak / 2**20, 1),
        "peakRssMiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def main(objects: int = 1_000_000, versions: int = 10_000) -> dict[str, Any]:
    started = time.perf_counter()
    steps = []
    for count in (max(2, versions // 2), versions):
        with ProcessPoolExecutor(1, mp_context=mp.get_context("spawn")) as pool:
            steps.append(pool.submit(_step, objects, count).result())
        print(steps[-1], flush=True)
    full = steps[-1]
    return {
        "workload": (
            f"plan_gc over {objects} stored shard objects and {versions} signed releases"
            f" ({SHARDS_PER_VERSION} shards each, every other one retained); in-memory"
            " versioned store, SQLite catalog; steps at half and all of the versions,"
            " each in a fresh process"
        ),
        "baseline": {
            "what": "plain polars anti-join of stored (key, versionId) against the required pairs",
            "seconds": full["baselineSeconds"],
        },
        "ratio": round(full["planSeconds"] / max(full["baselineSeconds"], 1e-9), 1),
        "target": TARGET,
        "planSeconds": full["planSeconds"],
        "peakRssMiB": full["peakRssMiB"],
        "rssGrowthRatio": round(full["peakRssMiB"] / steps[0]["peakRssMiB"], 2),
        "steps": steps,
        "totalSeconds": round(time.perf_counter() - started, 1),
    }


def comparisons(result: dict[str, Any]) -> list[Comparison]:
    """The GC plan at each step against a plain polars anti-join of the same pairs."""
    return [
        compare(
            f"GC plan, {step['storedObjects']:,} objects, {step['versions']:,} versions",
            "s",
            ("plan_gc", step["planSeconds"]),
            ("polars anti-join", step["baselineSeconds"]),
        )
        for step in result["steps"]
    ]


if __name__ == "__main__":
    import json

    print(json.dumps(main(**QUICK), indent=2))
