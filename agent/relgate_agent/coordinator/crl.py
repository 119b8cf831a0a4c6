"""The coordinator's certificate revocation list: operators revoke, agents receive it.

``RevokeCert`` (operator) adds a serial (given, or the one the coordinator last saw a host
present) to ``dist_revoked_certs`` in the store, with reason and time; the serial joins the
list every call is checked against (``certlife.refusal``: ``cert-revoked``), the host is cut
off from its jobs (``certs.cut_off``: REMOVED, spliced out) and its open watch ends at its
next check. ``ListRevokedCerts`` (agent) returns the list over the authenticated channel;
agents add it to the list their data plane checks at every handshake and frame
(``agent/revocations.py``). The wire: ``identity/crlwire.py``.
"""

from __future__ import annotations

import logging
import threading
from typing import Any

import grpc

from relgate_agent.coordinator.certs import cut_off
from relgate_agent.coordinator.jobstate import NotFound, Rejected
from relgate_agent.identity.certlife import CHECK_CERT_REVOKED, RevokedCerts, serial_hex
from relgate_agent.identity.crlwire import SERVICE, decode, encode

log = logging.getLogger(__name__)


class CertRevocations:
    """The store's list, mirrored into ``revoked.pushed``, and each host's last-seen serial."""

    def __init__(self, coord: Any, revoked: RevokedCerts) -> None:
        self.coord = coord
        self.revoked = revoked
        self.seen: dict[str, int] = {}  # host id -> serial of the certificate it last called with
        self._lock = threading.Lock()

    def refresh(self) -> list[tuple[str, str, str, int]]:
        rows: list[tuple[str, str, str, int]] = self.coord.store.revoked_certs()
        self.revoked.pushed = frozenset(int(r[0], 16) for r in rows)
        return rows

    def revoke(self, req: dict[str, Any], by: str) -> dict[str, Any]:
        host = str(req.get("host_id") or "")
        reason = str(req.get("reason") or "revoked by an operator")
        with self._lock:
            if req.get("serial"):
                try:
                    serial = int(str(req["serial"]), 16)
                except ValueError:
                    raise Rejected(f"not a hex serial number: {req['serial']!r}") from None
                host = host or next((h for h, s in self.seen.items() if s == serial), "")
            elif host in self.seen:
                serial = self.seen[host]
            else:
                raise NotFound(f"no certificate seen from host {host!r}: revoke by --serial")
        hexs = serial_hex(serial)
        added = self.coord.store.revoke_cert(hexs, host, f"{reason} (by {by})")
        self.refresh()
        why = f"certificate serial {hexs} revoked: {reason}"
        left = cut_off(self.coord, host, CHECK_CERT_REVOKED, why) if host else []
        log.warning("%s (host %s, by %s); left jobs %s", why, host or "?", by, left)
        return {"serial": hexs, "host_id": host, "added": added, "left_jobs": left}

    def listing(self) -> dict[str, Any]:
        rows = self.refresh()
        return {
            "serials": [
                {"serial": s, "host_id": h, "reason": r, "revoked_at": t} for s, h, r, t in rows
            ]
        }


def handlers(calls: Any, crl: CertRevocations) -> grpc.GenericRpcHandler:
    """The RevocationService's two unary methods (authorized like every other call)."""

    async def revoke(req: dict[str, Any], context: grpc.aio.ServicerContext) -> dict[str, Any]:
        ident = await calls.authorize(context, "RevokeCert")
        result: dict[str, Any] = await calls.run(context, lambda: crl.revoke(req, str(ident)))
        return result

    async def listing(req: dict[str, Any], context: grpc.aio.ServicerContext) -> dict[str, Any]:
        await calls.authorize(context, "ListRevokedCerts", str(req.get("host_id") or ""))
        result: dict[str, Any] = await calls.run(context, crl.listing)
        return result

    kinds = {"RevokeCert": revoke, "ListRevokedCerts": listing}
    return grpc.method_handlers_generic_handler(
        SERVICE,
        {
            name: grpc.unary_unary_rpc_method_handler(
                fn, request_deserializer=decode, response_serializer=encode
            )
            for name, fn in kinds.items()
        },
    )


__all__ = ["CertRevocations", "handlers"]
