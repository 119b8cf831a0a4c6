"""Metrics per release digest (Prometheus text format) and the worker's ready probe.

The probe answers 200 only after the process has pinned its root and verified its shards;
object-store connectivity is not readiness.  Metric labels carry digests and error codes,
never sample text.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, generate_latest


class ReleaseMetrics:
    def __init__(self) -> None:
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
        self.root_mismatches = Counter(
            "relgate_root_mismatches",
            "Ranks that reported a different root",
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

    def from_report(self, root: str, report: dict[str, Any]) -> None:
        for cls, count in report.get("counts", {}).items():
            self.members.labels(root, cls).set(int(count))


class Probe:
    """``/ready`` and ``/metrics`` on a loopback port, served from a daemon thread."""

    def __init__(self, metrics: ReleaseMetrics, host: str = "127.0.0.1", port: int = 0) -> None:
        self.metrics = metrics
        self.is_ready = False
        probe = self

        class Handler(BaseHTTPRequestHandler):
            def do_GET(self) -> None:
                if self.path == "/ready":
                    status, body = (
                        (200, b"ready\n")
                        if probe.is_ready
                        else (503, b"not ready: root not pinned and verified\n")
                    )
                elif self.path == "/metrics":
                    status, body = 200, probe.metrics.text()
                else:
                    status, body = 404, b"not found\n"
                self.send_response(status)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, *args: Any) -> None:
                pass

        self.server = ThreadingHTTPServer((host, port), Handler)
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()
