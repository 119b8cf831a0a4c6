"""Enrollment by certificate signing request: bootstrap tokens, CSRs and their checks.

A host makes its own key (it never leaves the host) and a CSR with the same subject and SAN
URI as the fleet's host certificate profile (``pki.sign_leaf``); it sends the CSR with a
one-time bootstrap token an operator minted for that host id. The coordinator keeps only
the token's SHA-256, its expiry and whether it was used. Each refusal names its check.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from relgate_trust.fstree import write_file_atomic

from relgate_agent.errors import AgentError
from relgate_agent.pki import (
    ROLE_HOST,
    Identity,
    check_name,
    identity_from_uris,
    identity_uri,
    private_key_pem,
)

CHECK_BOOTSTRAP_TOKEN = "bootstrap-token"  # noqa: S105 - a check name, not a secret
CHECK_CSR_SUBJECT = "csr-subject"
CHECK_CSR_KEY = "csr-key"
CHECK_PENDING_REQUEST = "pending-request"

DEFAULT_TOKEN_TTL_S = 3600
MAX_TOKEN_TTL_S = 7 * 24 * 3600
MAX_CSR_BYTES = 16 * 1024
# the curves a host key may use (the fleet issues P-256 itself)
ALLOWED_CURVES = (ec.SECP256R1.name, ec.SECP384R1.name)


class EnrollRefused(AgentError):
    """An enrollment step refused, naming its check (exit 3 on the command line)."""

    def __init__(self, message: str, *, check: str) -> None:
        super().__init__(message)
        self.check = check


def new_token() -> str:
    return secrets.token_urlsafe(32)


def token_hash(token: str) -> str:
    """What the coordinator stores instead of the token."""
    return hashlib.sha256(token.encode("utf-8")).hexdigest()


def same_hash(a: str, b: str) -> bool:
    return hmac.compare_digest(a.encode(), b.encode())


def make_csr(host_id: str, rack: str, out_dir: Path) -> bytes:
    """A fresh P-256 key written to ``out_dir/<host-id>.key`` (0600) and the CSR (PEM) for
    it, naming the host as the fleet's host certificates do."""
    check_name("host id", host_id)
    check_name("rack", rack)
    key = ec.generate_private_key(ec.SECP256R1())
    attrs = [
        x509.NameAttribute(NameOID.ORGANIZATION_NAME, "relgate"),
        x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, ROLE_HOST),
        x509.NameAttribute(NameOID.COMMON_NAME, host_id),
        x509.NameAttribute(NameOID.LOCALITY_NAME, rack),
    ]
    san = x509.SubjectAlternativeName(
        [x509.UniformResourceIdentifier(identity_uri(ROLE_HOST, host_id, rack))]
    )
    csr = (
        x509.CertificateSigningRequestBuilder()
        .subject_name(x509.Name(attrs))
        .add_extension(san, critical=False)
        .sign(key, hashes.SHA256())
    )
    write_file_atomic(Path(out_dir) / f"{host_id}.key", private_key_pem(key), 0o600)
    return csr.public_bytes(serialization.Encoding.PEM)


def load_csr(csr_pem: bytes) -> x509.CertificateSigningRequest:
    if len(csr_pem) > MAX_CSR_BYTES:
        raise EnrollRefused("the CSR is too large", check=CHECK_CSR_SUBJECT)
    try:
        csr = x509.load_pem_x509_csr(csr_pem)
    except ValueError as exc:
        raise EnrollRefused(f"not a CSR: {exc}", check=CHECK_CSR_SUBJECT) from exc
    if not csr.is_signature_valid:
        raise EnrollRefused("the CSR's signature is invalid", check=CHECK_CSR_SUBJECT)
    return csr


def _one(csr: x509.CertificateSigningRequest, oid: x509.ObjectIdentifier) -> str:
    values = [str(a.value) for a in csr.subject.get_attributes_for_oid(oid)]
    return values[0] if len(values) == 1 else ""


def check_csr(csr_pem: bytes, host_id: str, rack: str) -> x509.CertificateSigningRequest:
    """The CSR, when it is signed by its key, names exactly ``host_id`` (and ``rack``) and
    carries an allowed key; else :class:`EnrollRefused` naming the check."""
    csr = load_csr(csr_pem)
    try:
        san = csr.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        uris = list(san.get_values_for_type(x509.UniformResourceIdentifier))
    except x509.ExtensionNotFound:
        uris = []
    ident = identity_from_uris(uris)
    want = Identity(ROLE_HOST, host_id, rack)
    cn = _one(csr, NameOID.COMMON_NAME)
    if ident != want or cn != host_id or _one(csr, NameOID.LOCALITY_NAME) != rack:
        raise EnrollRefused(
            f"the CSR names {cn!r} ({ident}), not host {host_id} in rack {rack}",
            check=CHECK_CSR_SUBJECT,
        )
    key = csr.public_key()
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name not in ALLOWED_CURVES:
        kind = getattr(getattr(key, "curve", None), "name", "") or type(key).__name__
        raise EnrollRefused(
            f"the CSR's key ({kind}) is not allowed: EC {', '.join(ALLOWED_CURVES)}",
            check=CHECK_CSR_KEY,
        )
    return csr


def cert_matches_csr(cert_pem: bytes, csr: x509.CertificateSigningRequest) -> bool:
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return False
    fmt = (serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    return cert.public_key().public_bytes(*fmt) == csr.public_key().public_bytes(*fmt)
