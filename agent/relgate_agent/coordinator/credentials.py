"""The coordinator's TLS files, loaded again when they change (no restart, no dropped stream).

gRPC asks :meth:`ReloadingCredentials.fetch` before each new handshake; when ``ca.pem``, the
certificate or the key changed on disk (their stat), it answers the new server
configuration, so a CA rotation's bundle (docs/agent-ca-rotation.md) and a reissued
coordinator certificate take effect for the next connection while open ones go on. The
three files are read together and checked before use: a half-written or mismatched set
keeps the configuration in force (logged) and is looked at again on the next handshake.
"""

from __future__ import annotations

import logging
import os
import ssl
import threading
from collections.abc import Callable

import grpc

from relgate_agent.pki import PkiError, TlsFiles, data_server_context

log = logging.getLogger(__name__)

Stamp = tuple[tuple[int, int, int], ...]


def stamp_of(tls: TlsFiles) -> Stamp:
    out = []
    for path in (tls.ca, tls.cert, tls.key):
        st = os.stat(path)
        out.append((st.st_ino, st.st_size, st.st_mtime_ns))
    return tuple(out)


class ReloadingCredentials:
    """Dynamic gRPC server credentials over ``tls``; ``on_change(tls)`` runs after each
    reload (the coordinator re-reads its handoff signing identity there)."""

    def __init__(self, tls: TlsFiles, on_change: Callable[[TlsFiles], None] | None = None) -> None:
        self.tls = tls
        self.role = tls.identity().role  # a reloaded certificate must be for the same role
        self.on_change = on_change
        self.reloads = 0
        self._lock = threading.Lock()
        self._stamp = stamp_of(tls)
        self.credentials = grpc.dynamic_ssl_server_credentials(
            self._config(), self.fetch, require_client_authentication=True
        )

    def _config(self) -> object:
        ca, cert, key = self.tls.read()
        return grpc.ssl_server_certificate_configuration([(key, cert)], root_certificates=ca)

    def fetch(self) -> object | None:
        """The new configuration when the files changed, else None (keep the current one)."""
        with self._lock:
            try:
                now = stamp_of(self.tls)
                if now == self._stamp:
                    return None
                data_server_context(self.tls)  # parses all three and matches key to cert
                if self.tls.identity().role != self.role:
                    raise PkiError(f"{self.tls.cert} is not a {self.role} certificate")
                config = self._config()
            except (OSError, PkiError, ssl.SSLError) as exc:
                log.warning("TLS files not reloaded, keeping the current ones: %s", exc)
                return None
            self._stamp = now
            self.reloads += 1
        log.info("TLS files reloaded: %s", self.tls)
        if self.on_change is not None:
            try:
                self.on_change(self.tls)
            except Exception as exc:  # a hook must not break handshakes
                log.warning("after the TLS reload: %s", exc)
        return config


__all__ = ["ReloadingCredentials", "stamp_of"]
