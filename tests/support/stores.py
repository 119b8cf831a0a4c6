"""Build object stores from picklable specs, so other processes can open the same store.

A spawned process cannot receive a store (boto3 clients and open handles do not pickle);
it receives ``StoreSpec`` and constructs its own store, exactly as a second relgate
process on another host would.
"""

from __future__ import annotations

import multiprocessing.synchronize
import queue
import threading
from dataclasses import dataclass
from pathlib import Path

from relgate.errors import ObjectExistsError
from relgate.objects.local import LocalObjectStore
from relgate.objects.s3 import S3ObjectStore
from relgate.objects.versioned import ObjectStore


@dataclass(frozen=True)
class StoreSpec:
    kind: str  # "local" or "s3"
    root: str | None = None
    bucket: str | None = None
    prefix: str = ""
    endpoint_url: str | None = None
    region: str | None = None


def spec_of(store: ObjectStore) -> StoreSpec:
    if isinstance(store, LocalObjectStore):
        return StoreSpec(kind="local", root=str(store.root))
    if isinstance(store, S3ObjectStore):
        return StoreSpec(
            kind="s3",
            bucket=store.bucket,
            prefix=store.prefix,
            endpoint_url=store.endpoint_url,
            region=store.region,
        )
    raise TypeError(f"no spec for {type(store).__name__}")


def open_store(spec: StoreSpec) -> ObjectStore:
    if spec.kind == "local":
        assert spec.root is not None
        return LocalObjectStore(Path(spec.root))
    if spec.kind == "s3":
        assert spec.bucket is not None
        return S3ObjectStore(
            spec.bucket, prefix=spec.prefix, endpoint_url=spec.endpoint_url, region=spec.region
        )
    raise ValueError(f"unknown store kind {spec.kind!r}")


def race_creates(
    spec: StoreSpec,
    worker: str,
    keys: list[str],
    barrier: threading.Barrier | multiprocessing.synchronize.Barrier,
    results: queue.Queue[tuple[str, dict[str, str], str | None]],
) -> None:
    """Process target: ``create`` every key in step with the other racers.

    The barrier before each key lines the racers up so each create really contends.
    Reports ``(worker, {key: version_id won}, error or None)`` on ``results``.
    """
    won: dict[str, str] = {}
    try:
        store = open_store(spec)
        for key in keys:
            barrier.wait(timeout=30)
            try:
                version = store.create(key, f"{worker}:{key}".encode())
            except ObjectExistsError:
                continue
            won[key] = version.version_id
        results.put((worker, won, None))
    except BaseException as exc:  # reported to the parent, which fails the test
        results.put((worker, won, f"{type(exc).__name__}: {exc}"))
