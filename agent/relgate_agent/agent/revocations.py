"""The agent's copy of the coordinator's certificate revocation list (coordinator/crl.py).

Polled every ``POLL_S`` over the authenticated control channel (``ListRevokedCerts``, as this
host) and put into the process's list for the fleet CA (``RevokedCerts.beside``, the object
every data-plane TLS context checks): a revoked peer is refused at its next handshake, and an
open stream to or from it is cut at its next frame (``transport.PeerCertRefused``). A poll
that fails keeps the last list (the coordinator refusing this host's own revoked certificate
included); the file beside the CA bundle still counts on its own.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import grpc

from relgate_agent.identity.certlife import RevokedCerts
from relgate_agent.identity.crlwire import RevocationStub
from relgate_agent.pki import TlsFiles
from relgate_agent.rpc import FailoverStub

log = logging.getLogger(__name__)

POLL_S = 2.0


class RevocationPoller:
    def __init__(
        self, coordinator: str, tls: TlsFiles, host_id: str, stop: threading.Event
    ) -> None:
        self.stub: Any = FailoverStub(coordinator, RevocationStub, tls)
        self.revoked = RevokedCerts.beside(tls.ca)
        self.host_id = host_id
        self.stop_event = stop
        self._failing = ""
        self._thread = threading.Thread(target=self._loop, name="crl-poll", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def close(self) -> None:
        self.stub.close()

    def poll_once(self) -> bool:
        """Fetch the list once; False (the last list kept) when the call failed."""
        try:
            doc = self.stub.ListRevokedCerts({"host_id": self.host_id}, timeout=5.0)
            serials = frozenset(int(str(e["serial"]), 16) for e in doc.get("serials", []))
        except (grpc.RpcError, KeyError, TypeError, ValueError) as exc:
            why = str(exc.details() if isinstance(exc, grpc.RpcError) else exc)
            if why != self._failing:
                log.warning("revocation list not fetched (%s): keeping the last", why)
            self._failing = why
            return False
        self._failing = ""
        added = serials - self.revoked.pushed
        if added:
            log.warning("certificates revoked by the coordinator: %s", sorted(map(hex, added)))
        self.revoked.pushed = serials
        return True

    def _loop(self) -> None:
        while not self.stop_event.is_set():
            self.poll_once()
            self.stop_event.wait(POLL_S)


__all__ = ["POLL_S", "RevocationPoller"]
