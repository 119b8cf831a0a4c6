"""RPC: shared gRPC settings and the failover stub (never imports the coordinator)."""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import grpc

from relgate_agent.pki import GRPC_TLS_OPTIONS, TlsFiles, grpc_channel_credentials

# Manifests of 800 GB checkpoints are a few MB; leave headroom.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]


class FailoverStub:
    """Calls a gRPC stub method on the current coordinator replica; on UNAVAILABLE (down, or
    not the lease holder) moves to the next address and retries once per replica.

    ``addresses`` is a comma-separated list (``"coord-a:7470,coord-b:7470"``). Channels are
    mutual TLS: this side presents ``tls``'s certificate and accepts only a coordinator
    certificate from the same fleet CA (checked against ``COORDINATOR_DNS``).
    """

    def __init__(self, addresses: str, stub_class: Any, tls: TlsFiles) -> None:
        self.addresses = [a.strip() for a in addresses.split(",") if a.strip()]
        if not self.addresses:
            raise ValueError("no coordinator address given")
        creds = grpc_channel_credentials(tls)
        self.channels = [
            grpc.secure_channel(a, creds, options=GRPC_OPTIONS + GRPC_TLS_OPTIONS)
            for a in self.addresses
        ]
        self.stubs = [stub_class(c) for c in self.channels]
        self.current = 0
        self._lock = threading.Lock()

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(request: Any, timeout: float | None = None) -> Any:
            n = len(self.stubs)
            for attempt in range(n):
                i = self.current
                try:
                    return getattr(self.stubs[i], name)(request, timeout=timeout)
                except grpc.RpcError as exc:
                    if exc.code() != grpc.StatusCode.UNAVAILABLE or attempt == n - 1:
                        raise
                    with self._lock:
                        if self.current == i:
                            self.current = (i + 1) % n
            raise AssertionError("unreachable")

        return call

    def close(self) -> None:
        for c in self.channels:
            c.close()
