"""Metrics per release digest (Prometheus text format) and the worker's ready probe.

The probe answers 200 only after the process has pinned its root and verified its shards;
object-store connectivity is not readiness.  Metric labels carry digests and error codes,
never sample text.

Every value is set where it is known, from what was measured (seed 000's list):

==========================  ===========================================================
metric                      set by / value
==========================  ===========================================================
verified_shards_ratio       verifier (``release verify``: shards that passed over the
                            root's descriptors) and run workers (passed over assigned)
member_diff{cls}            verifier: missing, extra, duplicate, contentSubstitution,
                            sourceVersionSubstitution, splitConflict counts
digest_failures             verifier and workers: shards whose size, storage, logical
                            or member-set digest failed
cache_corruption            :func:`relgate.release.verify.verifier.fetch_shard`: a cached copy
                            whose size or SHA-256 did not match, discarded
barrier_wait_seconds        run worker: time at the step-0 barrier, updated while waiting
root_mismatches             barrier: ranks of the current epoch that reported another root
read_bytes_per_second       stored bytes read over the seconds spent reading them
decompression_ratio         decoded record bytes (Arrow buffers) over stored bytes
==========================  ===========================================================

Library code records through :func:`current`, the process's active metrics object (the
last one constructed; a private default otherwise), so no handle has to be threaded
through the reader, verifier and barrier.
"""

from __future__ import annotations

import threading
from collections import defaultdict
from collections.abc import Iterable, Mapping
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest, make_wsgi_app
from prometheus_client.exposition import ThreadingWSGIServer

from relgate.release.verify.checks import Check
from relgate.release.verify.worker import ShardResult

#: Verification counts -> ``member_diff`` classes (the rule, written once).
MEMBER_CLASSES = {
    "missingMembers": "missing",
    "extraMembers": "extra",
    "duplicateMembers": "duplicate",
    "contentSubstitutions": "contentSubstitution",
    "sourceVersionSubstitutions": "sourceVersionSubstitution",
    "splitConflicts": "splitConflict",
}
#: Per-shard checks that are digest failures.
# a stored object whose size differs from its descriptor is refused before it is hashed
# (read no more than size + 1 bytes): it is the same failure, the stored bytes are not the
# signed ones, seen earlier
DIGEST_CHECKS = frozenset(
    {
        Check.SIZE_MISMATCH,
        Check.STORAGE_DIGEST_MISMATCH,
        Check.LOGICAL_DIGEST_MISMATCH,
        Check.MEMBER_SET_DIGEST_MISMATCH,
    }
)


class _Totals:
    __slots__ = ("assigned", "checked", "decoded", "ok", "seconds", "stored")

    def __init__(self) -> None:
        self.assigned = 0
        self.checked = self.ok = self.stored = self.decoded = 0
        self.seconds = 0.0


class ReleaseMetrics:
    def __init__(self, *, activate: bool = True) -> None:
        global _current  # noqa: PLW0603 - the process-wide active metrics, set once per process
        if activate:
            _current = self
        self._totals: dict[str, _Totals] = defaultdict(_Totals)
        self.registry = CollectorRegistry()
        labels = ["root"]
        self.verified_shard_ratio = Gauge(
            "relgate_verified_shards_ratio",
            "Verified shards over assigned shards",
            labels,
            registry=self.registry,
        )
        self.members = Gauge(
            "relgate_member_diff",
            "Members by verification class (missing, extra, duplicate, ...)",
            [*labels, "cls"],
            registry=self.registry,
        )
        self.digest_failures = Counter(
            "relgate_digest_failures",
            "Shards whose storage or logical digest failed",
            labels,
            registry=self.registry,
        )
        self.cache_corruption = Counter(
            "relgate_cache_corruption",
            "Cached shard copies found corrupt",
            labels,
            registry=self.registry,
        )
        self.barrier_wait = Gauge(
            "relgate_barrier_wait_seconds",
            "Time a rank waited at the step-0 barrier",
            [*labels, "rank"],
            registry=self.registry,
        )
        self.root_mismatches = Gauge(
            "relgate_root_mismatches",
            "Ranks of the current epoch that reported a different root",
            labels,
            registry=self.registry,
        )
        self.read_bytes_per_s = Gauge(
            "relgate_read_bytes_per_second", "Shard read throughput", labels, registry=self.registry
        )
        self.decompression_ratio = Gauge(
            "relgate_decompression_ratio",
            "Decoded record bytes over stored bytes",
            labels,
            registry=self.registry,
        )
        self.ready = Gauge(
            "relgate_ready",
            "1 once the root is pinned and verified",
            labels,
            registry=self.registry,
        )

    def text(self) -> bytes:
        return generate_latest(self.registry)

    # -- recorders (called where the value is known) ------------------------------------

    def assigned(self, root: str, shards: int) -> None:
        """A worker was assigned ``shards`` shards of ``root`` (the ratio's denominator)."""
        self._totals[root].assigned += shards
        self._ratio(root)

    def observe_shard(self, root: str, shard: ShardResult) -> None:
        """One shard's verification: ratio, digests, I/O."""
        t = self._totals[root]
        t.checked += 1
        t.ok += 1 if shard.ok else 0
        if shard.failed_checks & DIGEST_CHECKS:
            self.digest_failures.labels(root).inc()
        t.stored += shard.bytes
        t.decoded += shard.decoded_bytes
        t.seconds += shard.read_micros / 1_000_000
        if t.seconds > 0:
            self.read_bytes_per_s.labels(root).set(t.stored / t.seconds)
        if t.stored > 0:
            self.decompression_ratio.labels(root).set(t.decoded / t.stored)
        self._ratio(root)

    def observe_verification(
        self, root: str, counts: Mapping[str, int], shards: Iterable[ShardResult], total: int
    ) -> None:
        """A whole ``release verify``: every shard, the member diff, ratio over ``total``."""
        self._totals.pop(root, None)
        self._totals[root].assigned = total
        for shard in shards:
            self.observe_shard(root, shard)
        for name, cls in MEMBER_CLASSES.items():
            self.members.labels(root, cls).set(int(counts.get(name, 0)))
        self._ratio(root)

    def cache_corrupted(self, root: str) -> None:
        self.cache_corruption.labels(root).inc()

    def barrier_waited(self, root: str, rank: int, seconds: float) -> None:
        self.barrier_wait.labels(root, str(rank)).set(seconds)

    def root_mismatch(self, root: str, reported: Iterable[str]) -> None:
        self.root_mismatches.labels(root).set(sum(1 for r in reported if r != root))

    def _ratio(self, root: str) -> None:
        t = self._totals[root]
        denominator = t.assigned or t.checked
        if denominator:
            self.verified_shard_ratio.labels(root).set(t.ok / denominator)


_current: ReleaseMetrics | None = None


def current() -> ReleaseMetrics:
    """The process's active metrics (a private, unexported default if none was made)."""
    global _current  # noqa: PLW0603 - the process-wide active metrics, set once per process
    if _current is None:
        _current = ReleaseMetrics()
    return _current


class _QuietHandler(WSGIRequestHandler):
    def log_message(self, format: str, *args: Any) -> None:
        """No access log on stderr (a scrape every few seconds is not news)."""


class Probe:
    """``/ready`` and ``/metrics`` on a loopback port, served from a daemon thread.

    ``/metrics`` is prometheus_client's own WSGI exposition app (content negotiation,
    ``?name[]=`` filters, gzip); ``/ready`` is the one route added in front of it. The
    server is prometheus_client's threading WSGI server, as ``start_wsgi_server`` builds it."""

    def __init__(self, metrics: ReleaseMetrics, host: str = "127.0.0.1", port: int = 0) -> None:
        self.metrics = metrics
        self.is_ready = False
        exposition = make_wsgi_app(metrics.registry)

        def app(environ: dict[str, Any], start_response: Any) -> Iterable[bytes]:
            path = environ.get("PATH_INFO", "")
            if path == "/metrics":
                return exposition(environ, start_response)  # type: ignore[no-any-return]
            if path == "/ready":
                status, body = (
                    ("200 OK", b"ready\n")
                    if self.is_ready
                    else ("503 Service Unavailable", b"not ready: root not pinned and verified\n")
                )
            else:
                status, body = "404 Not Found", b"not found\n"
            start_response(status, [("Content-Length", str(len(body)))])
            return [body]

        self.server = make_server(host, port, app, ThreadingWSGIServer, handler_class=_QuietHandler)
        self.port = self.server.server_port
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
