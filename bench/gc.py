"""GC plan over 1M stored objects and 10k versions: wall time, peak memory, flatness.

Workload: a real workspace (SQLite catalog, real snapshot from the demo sources, real
Ed25519-signed release manifests) over an in-memory implementation of the versioned
``ObjectStore`` contract, so the benchmark measures the collector rather than a million
directory creations.  ``OBJECTS`` shard objects are stored; ``VERSIONS`` releases each
reference ``SHARDS_PER_VERSION`` of them (consecutive versions share half their shards);
every other release is INVALID (not retained), the rest are STAGED (retained), so both
mark and the candidate reasons read every manifest.

Measured at 25%, 50% and 100% of the versions with the object count fixed:

* ``planSeconds``: wall time of ``plan_gc`` (second plan: ``gc_seen`` already recorded);
* ``planPeakMiB``: tracemalloc peak of the plan's own allocations (a separate run);
* ``listSeconds``: the baseline measured in the same run: listing every stored version;
  ``planOverList`` is the ratio.

Memory is flat when ``planPeakMiB`` does not grow with the version count (it follows the
object count: the stored index and the required set).  Scale with RELGATE_BENCH_GC_OBJECTS
/ RELGATE_BENCH_GC_VERSIONS.
"""

from __future__ import annotations

import os
import resource
import tempfile
import time
import tracemalloc
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from relgate.errors import NotFoundError, ObjectExistsError
from relgate.objects.versioned import ObjectStore, ObjectVersion

OBJECTS = int(os.environ.get("RELGATE_BENCH_GC_OBJECTS", "1000000"))
VERSIONS = int(os.environ.get("RELGATE_BENCH_GC_VERSIONS", "10000"))
SHARDS_PER_VERSION = int(os.environ.get("RELGATE_BENCH_GC_SHARDS_PER_VERSION", "20"))
SHARD_SIZE = 256_000_000


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

    def get(self, key: str, version_id: str) -> bytes:
        data = self._keys.get(key, {}).get(version_id)
        if data is None:
            raise NotFoundError("no such version", object=f"{key}@{version_id}", check="exists")
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
    from relgate.snapshot.transforms import tag_transform
    from relgate.workspace import Workspace, default_config

    store = MemoryStore()
    ws = Workspace.init(home, default_config(home))
    ws.__dict__["store"] = store  # the cached component, replaced before first use
    for tag in ("registry.local/normalize:v1", "registry.local/identity:v1"):
        tag_transform(ws.db, tag)
    seed_demo(ws, tickets=40, forum_objects=2, per_object=10, chat_events=20)
    snap = build_snapshot(ws, BuildSpec.from_config(ws.config), actor="bench")
    return ws, store, {"snapshot": snap.digest, "members": snap.manifest.members_ref}


def _shard_pool(store: MemoryStore) -> list[tuple[str, str]]:
    pool = []
    for i in range(OBJECTS):
        hexd = f"{i:064x}"
        version = store.put(f"shards/sha256/{hexd}.parquet", b"", size=SHARD_SIZE)
        pool.append((hexd, version.version_id))
    return pool


def _add_versions(
    ws: Any, pool: list[tuple[str, str]], facts: dict[str, Any], start: int, stop: int
) -> None:
    from relgate.catalog.release_table import insert_release
    from relgate.catalog.states import transition
    from relgate.release import root as rm

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
                "recordSchema": "sha256:" + "0" * 64,
                "shards": shards,
                "totals": {"shards": len(shards), "records": 1000 * len(shards), "version": v},
                "orderedMemberTupleRoot": "sha256:" + "0" * 64,
                "writer": {"bench": True},
            }
            sealed = rm.seal(body)
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
                transition(conn, "release", sealed.digest, "INVALID", actor="bench", reason="bench")


def main() -> dict[str, Any]:
    from relgate.lifecycle.collector import plan_gc

    started = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        ws, store, facts = _world(Path(tmp) / "home")
        pool = _shard_pool(store)
        built = 0
        steps = []
        for fraction in (0.25, 0.5, 1.0):
            target = int(VERSIONS * fraction)
            _add_versions(ws, pool, facts, built, target)
            built = target
            t = time.perf_counter()
            listed = sum(1 for _ in store.list_versions(""))
            list_seconds = time.perf_counter() - t
            plan_gc(ws, grace_seconds=0)  # records gc_seen for new versions
            t = time.perf_counter()
            plan = plan_gc(ws, grace_seconds=0)
            plan_seconds = time.perf_counter() - t
            tracemalloc.start()
            plan_gc(ws, grace_seconds=0)
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            steps.append(
                {
                    "versions": built,
                    "storedObjects": plan.stored,
                    "listedVersions": listed,
                    "retainedVersions": len(plan.retained),
                    "requiredObjects": len(plan.required),
                    "candidates": len(plan.candidates),
                    "planSeconds": round(plan_seconds, 2),
                    "listSeconds": round(list_seconds, 2),
                    "planOverList": round(plan_seconds / list_seconds, 1),
                    "planPeakMiB": round(peak / 2**20, 1),
                }
            )
            print(steps[-1], flush=True)
        ws.close()
    peaks = [s["planPeakMiB"] for s in steps]
    return {
        "workload": {
            "objects": OBJECTS,
            "versions": VERSIONS,
            "shardsPerVersion": SHARDS_PER_VERSION,
            "retained": "every other release (STAGED); the rest INVALID",
            "store": "in-memory ObjectStore contract; catalog SQLite; manifests Ed25519-signed",
        },
        "steps": steps,
        "peakGrowthRatio": round(peaks[-1] / peaks[0], 2) if peaks[0] else None,
        "processMaxRssMiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
        "totalSeconds": round(time.perf_counter() - started, 1),
    }


if __name__ == "__main__":
    import json

    print(json.dumps(main(), indent=2))
