"""Enrollment by CSR, the coordinator's part: bootstrap tokens, pending CSRs, approvals.

Tokens are minted by an operator and stored as SHA-256 with an expiry; one CSR uses one.
The coordinator never holds the fleet CA key: ``hosts approve`` signs the pending CSR where
the CA is (``pki.issue_for_csr``) and hands the certificate back here, where it is checked
(issued by the fleet CA, for this CSR's key, naming this host and rack) before the host may
fetch it with its token.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from cryptography import x509
from cryptography.exceptions import InvalidSignature

from relgate_agent.coordinator.store import JobStore
from relgate_agent.identity.cabundle import BundleRefused, TrustFile
from relgate_agent.identity.enroll import (
    CHECK_BOOTSTRAP_TOKEN,
    CHECK_CSR_SUBJECT,
    CHECK_PENDING_REQUEST,
    DEFAULT_TOKEN_TTL_S,
    MAX_TOKEN_TTL_S,
    EnrollRefused,
    cert_matches_csr,
    check_csr,
    load_csr,
    new_token,
    same_hash,
    token_hash,
)
from relgate_agent.pki import ROLE_HOST, Identity, check_name, identity_from_pem


@dataclass(frozen=True)
class PendingRequest:
    host_id: str
    rack: str
    csr_pem: str
    requested_at: int


class Enrollments:
    def __init__(self, store: JobStore, ca: TrustFile) -> None:
        self.store = store
        self.ca = ca

    def create_token(self, host_id: str, rack: str, ttl_s: int) -> tuple[str, int]:
        """A new token for ``host_id`` in ``rack``: (the token, its expiry)."""
        check_name("host id", host_id)
        check_name("rack", rack)
        ttl = ttl_s or DEFAULT_TOKEN_TTL_S
        if not 0 < ttl <= MAX_TOKEN_TTL_S:
            raise EnrollRefused(f"ttl {ttl} s is out of range", check=CHECK_BOOTSTRAP_TOKEN)
        token = new_token()
        expires_at = int(time.time()) + ttl
        self.store.add_enroll_token(token_hash(token), host_id, rack, expires_at)
        return token, expires_at

    def _token(self, token: str, *, unused: bool) -> tuple[str, str, str]:
        """(hash, host id, rack) of a known token (``unused``: and live); else bootstrap-token."""
        digest = token_hash(token)
        row = self.store.enroll_token(digest) if token else None
        now = int(time.time())
        if row is None:
            raise EnrollRefused("unknown bootstrap token", check=CHECK_BOOTSTRAP_TOKEN)
        host_id, rack, expires_at, used_at = row
        if unused and expires_at <= now:
            raise EnrollRefused("the bootstrap token expired", check=CHECK_BOOTSTRAP_TOKEN)
        if unused and used_at:
            raise EnrollRefused("the bootstrap token was used", check=CHECK_BOOTSTRAP_TOKEN)
        return digest, host_id, rack

    def submit(self, token: str, host_id: str, csr_pem: str) -> str:
        """Record the host's CSR, using its token; returns the token's rack."""
        digest, token_host, rack = self._token(token, unused=True)
        if host_id != token_host:
            raise EnrollRefused(
                f"the token is for host {token_host}, not {host_id}", check=CHECK_CSR_SUBJECT
            )
        check_csr(csr_pem.encode("utf-8"), token_host, rack)
        if not self.store.use_enroll_token(digest, host_id, rack, csr_pem, int(time.time())):
            raise EnrollRefused("the bootstrap token was used", check=CHECK_BOOTSTRAP_TOKEN)
        return rack

    def fetch(self, token: str, host_id: str) -> str:
        """The host's certificate once approved ("" while pending); the token that sent
        the CSR is the only key to it."""
        digest, token_host, _ = self._token(token, unused=False)
        if token_host != host_id:
            raise EnrollRefused("unknown bootstrap token", check=CHECK_BOOTSTRAP_TOKEN)
        for h, _, _, d, _, cert in self.store.enroll_requests():
            if h == host_id and same_hash(d, digest):
                return cert
        raise EnrollRefused(f"no request for host {host_id}", check=CHECK_PENDING_REQUEST)

    def pending(self) -> list[PendingRequest]:
        return [
            PendingRequest(h, r, c, t)
            for h, r, c, _, t, cert in self.store.enroll_requests()
            if not cert
        ]

    def approve(self, host_id: str, cert_pem: str) -> str:
        """Store the certificate an operator signed for ``host_id``'s pending CSR; its serial."""
        found = [p for p in self.pending() if p.host_id == host_id]
        if not found:
            raise EnrollRefused(
                f"host {host_id} has no pending request", check=CHECK_PENDING_REQUEST
            )
        req = found[0]
        csr = load_csr(req.csr_pem.encode("utf-8"))
        pem = cert_pem.encode("utf-8")
        try:
            cert = x509.load_pem_x509_certificate(pem)
            if self.ca.bundle().issuer_of(cert) is None:
                raise InvalidSignature("no CA of the fleet's bundle signed it")
        except (ValueError, TypeError, InvalidSignature, BundleRefused) as exc:
            raise EnrollRefused(
                f"the certificate is not from the fleet CA: {exc}", check=CHECK_CSR_SUBJECT
            ) from exc
        if identity_from_pem(pem) != Identity(ROLE_HOST, host_id, req.rack) or not (
            cert_matches_csr(pem, csr)
        ):
            raise EnrollRefused(
                f"the certificate is not for host {host_id}'s CSR", check=CHECK_CSR_SUBJECT
            )
        if not self.store.set_enroll_cert(host_id, cert_pem):
            raise EnrollRefused(
                f"host {host_id} has no pending request", check=CHECK_PENDING_REQUEST
            )
        return format(cert.serial_number, "x")
