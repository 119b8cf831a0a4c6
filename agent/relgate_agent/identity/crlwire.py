"""The wire of the coordinator's certificate revocation list (coordinator/crl.py): a small
JSON-over-gRPC service beside the proto's, on the same mutual-TLS channel, so the proto is
unchanged. ``RevokeCert`` (operator): ``{"serial": hex} | {"host_id": h}``, ``"reason"``;
``ListRevokedCerts`` (agent, as its host): ``{"host_id": h}`` -> ``{"serials": [{"serial",
"host_id", "reason", "revoked_at"}]}``.
"""

from __future__ import annotations

import json
from typing import Any

import grpc

SERVICE = "relgate.distribution.v1.RevocationService"
OPERATOR_RPCS = frozenset({"RevokeCert"})  # authorized as identity/authz.py's operator RPCs
AGENT_RPCS = frozenset({"ListRevokedCerts"})  # and as its agent RPCs (as the host named)


def encode(obj: Any) -> bytes:
    return json.dumps(obj, sort_keys=True).encode()


def decode(data: bytes) -> dict[str, Any]:
    doc = json.loads(data or b"{}")
    if not isinstance(doc, dict):
        raise ValueError("a revocation message is a JSON object")
    return doc


class RevocationStub:
    """A client stub (what ``rpc.FailoverStub`` wraps) for the two methods."""

    def __init__(self, channel: grpc.Channel) -> None:
        for name in OPERATOR_RPCS | AGENT_RPCS:
            setattr(
                self,
                name,
                channel.unary_unary(
                    f"/{SERVICE}/{name}", request_serializer=encode, response_deserializer=decode
                ),
            )


__all__ = ["AGENT_RPCS", "OPERATOR_RPCS", "SERVICE", "RevocationStub", "decode", "encode"]
