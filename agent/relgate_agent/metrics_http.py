"""Metrics HTTP: serving a Prometheus registry on ``/metrics`` (prometheus_client's own
server), the one way the coordinator and the host agent expose their figures."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry, start_http_server

from relgate_agent.errors import AgentError

if TYPE_CHECKING:
    from wsgiref.simple_server import WSGIServer


class MetricsEndpoint:
    def __init__(self, registry: CollectorRegistry) -> None:
        self.registry = registry
        self._server: WSGIServer | None = None
        self._thread: threading.Thread | None = None
        self.address = ""

    def serve(self, listen: str) -> str:
        """Serve on ``listen`` ("host:port", port 0 = any free one); returns "host:port"."""
        host, _, port = listen.rpartition(":")
        host = host or "127.0.0.1"
        try:
            self._server, self._thread = start_http_server(int(port), host, registry=self.registry)
        except (OSError, ValueError) as exc:
            raise AgentError(f"cannot serve metrics on {listen!r}: {exc}") from exc
        self.address = f"{host}:{self._server.server_port}"
        return self.address

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._thread is not None:
            self._thread.join(timeout=5)
            self._thread = None
