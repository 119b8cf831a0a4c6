"""A handoff the deployer can verify: placement attestations and signed deployer events.

When a host renames a verified checkpoint into place it signs a **placement attestation**
with its host key (the ECDSA P-256 key of its fleet certificate): the manifest digest, the
host id, the placed path and when it was placed. The coordinator collects them with READY
and puts them in every deployer event, which it signs with its own certificate's key. The
deployer (``relgate-agent verify-handoff EVENT --ca CA.pem``, or a webhook receiver through
:func:`verify_event`) checks both against the fleet CA: each certificate was issued by the
CA, names the right role (``host`` with the attested host id; ``coordinator``) and was
valid when it signed; each signature verifies; every READY host named by the event has an
attestation for the event's manifest digest.

Signatures are ECDSA-SHA256 over the DSSE pre-authentication encoding
(:func:`relgate_trust.dsse.pae`) of the RFC 8785 canonical JSON of the signed document:

    attestation = {"payloadType": PLACEMENT_TYPE, "payload": <base64 canonical JSON>,
                   "sig": <base64>, "certificate": <host certificate PEM>}
    event       = {<event fields>, "signature": {"payloadType": EVENT_TYPE, "sig": <base64>,
                   "certificate": <coordinator certificate PEM>}}

(the event's signature covers every field of the event but ``signature`` itself).
"""

from __future__ import annotations

import base64
import binascii
import datetime as dt
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from relgate_trust import jcs
from relgate_trust.dsse import pae

from relgate_agent.contracts import RemovedHost
from relgate_agent.errors import AgentError
from relgate_agent.identity.cabundle import BundleRefused, CaBundle
from relgate_agent.pki import ROLE_COORDINATOR, ROLE_HOST, TlsFiles, identity_from_pem

PLACEMENT_TYPE = "application/vnd.relgate.placement-attestation.v1+json"
EVENT_TYPE = "application/vnd.relgate.deployer-event.v1+json"
SIGNATURE_FIELD = "signature"
MAX_EVENT_BYTES = 64 << 20  # an event names at most every host of a fleet, each attested

# the checks a handoff or an attestation is refused by (verify-handoff exits 3 naming one)
CHECK_HANDOFF_MALFORMED = "handoff-malformed"
CHECK_HANDOFF_UNSIGNED = "handoff-unsigned"
CHECK_HANDOFF_SIGNER = "handoff-signer"
CHECK_HANDOFF_SIGNATURE = "handoff-signature"
CHECK_ATTESTATION_MISSING = "attestation-missing"
CHECK_ATTESTATION_MALFORMED = "attestation-malformed"
CHECK_ATTESTATION_SIGNER = "attestation-signer"
CHECK_ATTESTATION_SIGNATURE = "attestation-signature"
CHECK_ATTESTATION_HOST = "attestation-host"
CHECK_ATTESTATION_DIGEST = "attestation-digest"


class HandoffError(AgentError):
    """A deployer event or a placement attestation failed verification (``check``)."""

    def __init__(self, message: str, *, check: str, host: str = "", digest: str = "") -> None:
        super().__init__(message)
        self.check, self.host, self.digest = check, host, digest

    def to_json(self) -> dict[str, str]:
        out = {"error": "rejected", "check": self.check, "message": str(self)}
        if self.host:
            out["host"] = self.host
        if self.digest:
            out["digest"] = self.digest
        return out


@dataclass(frozen=True)
class CertSigner:
    """A fleet identity's certificate and private key, signing for that identity."""

    cert_pem: bytes
    key: ec.EllipticCurvePrivateKey

    @classmethod
    def from_tls(cls, tls: TlsFiles) -> CertSigner:
        _, cert, key = tls.read()
        private = serialization.load_pem_private_key(key, password=None)
        if not isinstance(private, ec.EllipticCurvePrivateKey):
            raise HandoffError(f"{tls.key} is not an EC key", check=CHECK_HANDOFF_SIGNER)
        return cls(cert, private)

    def sign(self, payload_type: str, payload: bytes) -> str:
        sig = self.key.sign(pae(payload_type, payload), ec.ECDSA(hashes.SHA256()))
        return base64.standard_b64encode(sig).decode("ascii")


# ------------------------------------------------------------------------------ signing


def sign_placement(
    signer: CertSigner,
    *,
    host_id: str,
    model: str,
    version: str,
    manifest_digest: str,
    path: str,
    placed_at_ms: int,
) -> dict[str, str]:
    """The host's signed statement that it placed ``manifest_digest`` at ``path``."""
    doc = {
        "hostId": host_id,
        "manifestDigest": manifest_digest,
        "model": model,
        "path": path,
        "placedAtMs": placed_at_ms,
        "version": version,
    }
    payload = jcs.dumps(doc)
    return {
        "payloadType": PLACEMENT_TYPE,
        "payload": base64.standard_b64encode(payload).decode("ascii"),
        "sig": signer.sign(PLACEMENT_TYPE, payload),
        "certificate": signer.cert_pem.decode("ascii"),
    }


def sign_event(signer: CertSigner, event: Mapping[str, Any], signed_at_ms: int) -> dict[str, Any]:
    """``event`` with the coordinator's signature over all its other fields (and the time
    it was signed, ``signedAtMs``: the signer's certificate must be valid then)."""
    body = {k: v for k, v in event.items() if k != SIGNATURE_FIELD}
    body["signedAtMs"] = signed_at_ms
    signature = {
        "payloadType": EVENT_TYPE,
        "sig": signer.sign(EVENT_TYPE, jcs.dumps(body)),
        "certificate": signer.cert_pem.decode("ascii"),
    }
    return {**body, SIGNATURE_FIELD: signature}


# ------------------------------------------------------------------------------ checking


def load_ca(path: str | Path) -> CaBundle:
    """The fleet's CA bundle (one CA, two during a rotation) from a PEM file."""
    try:
        return CaBundle.parse(Path(path).read_bytes())
    except (OSError, BundleRefused) as exc:
        raise HandoffError(f"CA {path}: {exc}", check=CHECK_HANDOFF_SIGNER) from exc


def _b64(value: object, what: str, check: str, host: str = "") -> bytes:
    if not isinstance(value, str):
        raise HandoffError(f"{what} is not a base64 string", check=check, host=host)
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise HandoffError(f"{what} is not base64: {exc}", check=check, host=host) from exc


def _signed_by(
    cert_pem: object,
    ca: CaBundle,
    role: str,
    name: str | None,
    at: dt.datetime,
    check: str,
    host: str = "",
) -> x509.Certificate:
    """The certificate, if the fleet CA issued it to ``role`` (and ``name``) and it was
    valid at ``at``."""
    if not isinstance(cert_pem, str):
        raise HandoffError("no signer certificate", check=check, host=host)
    try:
        cert = x509.load_pem_x509_certificate(cert_pem.encode("ascii"))
        if ca.issuer_of(cert) is None:
            raise InvalidSignature("no CA of the fleet's bundle signed it")
    except (ValueError, TypeError, InvalidSignature, UnicodeEncodeError) as exc:
        raise HandoffError(
            f"signer certificate not issued by the fleet CA: {exc or type(exc).__name__}",
            check=check,
            host=host,
        ) from exc
    ident = identity_from_pem(cert.public_bytes(serialization.Encoding.PEM))
    if ident is None or ident.role != role or (name is not None and ident.name != name):
        raise HandoffError(
            f"signer certificate is for {ident}, not a {role}" + (f" {name}" if name else ""),
            check=check,
            host=host,
        )
    if not cert.not_valid_before_utc <= at <= cert.not_valid_after_utc:
        raise HandoffError(
            f"signer certificate of {ident} was not valid at {at.isoformat()}",
            check=check,
            host=host,
        )
    return cert


def _verify_sig(
    cert: x509.Certificate,
    payload_type: str,
    payload: bytes,
    sig: bytes,
    check: str,
    host: str = "",
) -> None:
    key = cert.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey):
        raise HandoffError("signer key is not an EC key", check=check, host=host)
    try:
        key.verify(sig, pae(payload_type, payload), ec.ECDSA(hashes.SHA256()))
    except InvalidSignature as exc:
        raise HandoffError(
            "signature does not verify with the signer's certificate", check=check, host=host
        ) from exc


def _at_ms(ms: object, check: str, host: str = "") -> dt.datetime:
    if not isinstance(ms, int) or isinstance(ms, bool) or ms < 0:
        raise HandoffError("time is not a non-negative integer (ms)", check=check, host=host)
    try:
        return dt.datetime.fromtimestamp(ms / 1000, tz=dt.UTC)
    except (OverflowError, OSError, ValueError) as exc:
        raise HandoffError(f"time {ms} is out of range", check=check, host=host) from exc


def verify_placement(
    att: object, ca: CaBundle, *, host_id: str, manifest_digest: str
) -> dict[str, Any]:
    """The attested placement, if ``att`` is ``host_id``'s signed attestation of
    ``manifest_digest``; :class:`HandoffError` naming the check otherwise."""
    bad = CHECK_ATTESTATION_MALFORMED
    if not isinstance(att, Mapping) or att.get("payloadType") != PLACEMENT_TYPE:
        raise HandoffError(f"attestation of {host_id} is malformed", check=bad, host=host_id)
    payload = _b64(att.get("payload"), "attestation payload", bad, host_id)
    try:
        doc = json.loads(payload)
    except ValueError as exc:
        raise HandoffError(f"attestation payload: {exc}", check=bad, host=host_id) from exc
    if not isinstance(doc, dict) or jcs.dumps(doc) != payload:
        raise HandoffError("attestation payload is not canonical JSON", check=bad, host=host_id)
    at = _at_ms(doc.get("placedAtMs"), bad, host_id)
    cert = _signed_by(
        att.get("certificate"), ca, ROLE_HOST, host_id, at, CHECK_ATTESTATION_SIGNER, host_id
    )
    sig = _b64(att.get("sig"), "attestation signature", CHECK_ATTESTATION_SIGNATURE, host_id)
    _verify_sig(cert, PLACEMENT_TYPE, payload, sig, CHECK_ATTESTATION_SIGNATURE, host_id)
    if doc.get("hostId") != host_id:
        raise HandoffError(
            f"attestation names host {doc.get('hostId')!r}, not {host_id}",
            check=CHECK_ATTESTATION_HOST,
            host=host_id,
        )
    if doc.get("manifestDigest") != manifest_digest:
        raise HandoffError(
            f"{host_id} attests {doc.get('manifestDigest')!r}, not {manifest_digest}",
            check=CHECK_ATTESTATION_DIGEST,
            host=host_id,
            digest=manifest_digest,
        )
    return doc


def verify_event(doc: object, ca: CaBundle) -> dict[str, Any]:
    """A deployer event the coordinator signed, every READY host it names attested for its
    manifest digest: the event (without its signature); :class:`HandoffError` otherwise."""
    if not isinstance(doc, Mapping):
        raise HandoffError("event is not a JSON object", check=CHECK_HANDOFF_MALFORMED)
    signature = doc.get(SIGNATURE_FIELD)
    if not isinstance(signature, Mapping) or not signature.get("sig"):
        raise HandoffError("event is not signed", check=CHECK_HANDOFF_UNSIGNED)
    if signature.get("payloadType") != EVENT_TYPE:
        raise HandoffError("event signature has another type", check=CHECK_HANDOFF_MALFORMED)
    body = {k: v for k, v in doc.items() if k != SIGNATURE_FIELD}
    digest = body.get("manifestDigest")
    signed_at = _at_ms(body.get("signedAtMs"), CHECK_HANDOFF_MALFORMED)
    cert = _signed_by(
        signature.get("certificate"), ca, ROLE_COORDINATOR, None, signed_at, CHECK_HANDOFF_SIGNER
    )
    sig = _b64(signature.get("sig"), "event signature", CHECK_HANDOFF_SIGNATURE)
    try:
        payload = jcs.dumps(body)
    except (TypeError, ValueError) as exc:
        raise HandoffError(f"event is not JSON: {exc}", check=CHECK_HANDOFF_MALFORMED) from exc
    _verify_sig(cert, EVENT_TYPE, payload, sig, CHECK_HANDOFF_SIGNATURE)
    ready, attestations = body.get("readyHosts"), body.get("attestations")
    if not isinstance(digest, str) or not isinstance(ready, list):
        raise HandoffError("event names no digest or hosts", check=CHECK_HANDOFF_MALFORMED)
    removed = removed_hosts(body)
    both = sorted({r.host_id for r in removed} & {h for h in ready if isinstance(h, str)})
    if both:
        raise HandoffError(
            f"host {both[0]} is named READY and removed",
            check=CHECK_HANDOFF_MALFORMED,
            host=both[0],
        )
    if not isinstance(attestations, Mapping):
        attestations = {}
    for host in ready:
        if not isinstance(host, str) or host not in attestations:
            raise HandoffError(
                f"READY host {host} has no placement attestation",
                check=CHECK_ATTESTATION_MISSING,
                host=str(host),
                digest=digest,
            )
        verify_placement(attestations[host], ca, host_id=host, manifest_digest=digest)
    return body


def removed_hosts(body: Mapping[str, Any]) -> tuple[RemovedHost, ...]:
    """The event's ``removedHosts`` (targets the job no longer waits for, with why and when;
    an event from before they were reported names none); a malformed entry is refused."""
    raw = body.get("removedHosts", [])
    if not isinstance(raw, list):
        raise HandoffError("removedHosts is not a list", check=CHECK_HANDOFF_MALFORMED)
    out = []
    for entry in raw:
        host = entry.get("hostId") if isinstance(entry, Mapping) else None
        reason = entry.get("reason") if isinstance(entry, Mapping) else None
        at = entry.get("removedAt") if isinstance(entry, Mapping) else None
        if not isinstance(host, str) or not host or not isinstance(reason, str):
            raise HandoffError(
                f"removed host {entry!r:.80} is malformed", check=CHECK_HANDOFF_MALFORMED
            )
        if not isinstance(at, int) or isinstance(at, bool) or at < 0:
            raise HandoffError(
                f"removed host {host} has no time", check=CHECK_HANDOFF_MALFORMED, host=host
            )
        out.append(RemovedHost(host, reason, at))
    return tuple(out)


def verify_event_bytes(raw: bytes, ca: CaBundle) -> dict[str, Any]:
    """:func:`verify_event` of a webhook body (bounded)."""
    if len(raw) > MAX_EVENT_BYTES:
        raise HandoffError("event is too large", check=CHECK_HANDOFF_MALFORMED)
    try:
        doc = json.loads(raw)
    except ValueError as exc:
        raise HandoffError(f"event is not JSON: {exc}", check=CHECK_HANDOFF_MALFORMED) from exc
    return verify_event(doc, ca)


__all__ = [
    "CHECK_ATTESTATION_DIGEST",
    "CHECK_ATTESTATION_HOST",
    "CHECK_ATTESTATION_MALFORMED",
    "CHECK_ATTESTATION_MISSING",
    "CHECK_ATTESTATION_SIGNATURE",
    "CHECK_ATTESTATION_SIGNER",
    "CHECK_HANDOFF_MALFORMED",
    "CHECK_HANDOFF_SIGNATURE",
    "CHECK_HANDOFF_SIGNER",
    "CHECK_HANDOFF_UNSIGNED",
    "EVENT_TYPE",
    "MAX_EVENT_BYTES",
    "PLACEMENT_TYPE",
    "CertSigner",
    "HandoffError",
    "load_ca",
    "removed_hosts",
    "sign_event",
    "sign_placement",
    "verify_event",
    "verify_event_bytes",
    "verify_placement",
]
