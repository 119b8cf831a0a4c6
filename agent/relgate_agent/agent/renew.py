"""Certificate renewal, the agent's part (docs/agent-renewal.md).

When less than ``renew_before_s`` of its certificate is left, the agent makes a new key and
a CSR for its own host id and rack (``identity.enroll.make_csr``), sends the CSR over its
mTLS channel (``AgentService.RenewCert``, authenticated by the current certificate), checks
the answer (issued by the fleet CA, for this host and rack, for the new key), installs key
and certificate in place (each written to a temporary file, fsync'ed and renamed; the key
0600) and hands them to the running agent, which loads them without a restart: new gRPC
channels and data-plane handshakes present the new certificate, open streams are not cut.

The same thread keeps the host's CA bundle in step with the coordinator's during a CA
rotation (docs/agent-ca-rotation.md): every ``trust_poll_s`` it asks ``TrustBundle``; a
changed bundle is checked (``identity.cabundle``: parses, shares a CA with the bundle
trusted now, still has a CA for this host's certificate), installed atomically over
``ca.pem`` and loaded like a renewed certificate. When the bundle's signing CA is not the
one that issued this host's certificate, the host renews at once (the rotation's promote
step).
"""

from __future__ import annotations

import datetime as dt
import logging
import shutil
import threading
from collections.abc import Callable
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from relgate_trust.fstree import write_file_atomic

from relgate_agent.identity import cabundle, certpair
from relgate_agent.identity.cabundle import BundleRefused, CaBundle
from relgate_agent.identity.enroll import cert_matches_csr, load_csr, make_csr
from relgate_agent.pki import Identity, PkiError, TlsFiles, identity_from_pem
from relgate_agent.proto import distribution_pb2 as pb

log = logging.getLogger(__name__)

RENEW_MIN_S = 5.0  # at most one renewal this often (a window longer than a renewed life)
RETRY_S = 30.0  # after a refused or failed renewal
MAX_SLEEP_S = 600.0  # the certificate's life is looked at again at least this often
RPC_TIMEOUT_S = 30.0
CHECK_RENEWED_CERT = "renewed-cert"


def seconds_left(cert_pem: bytes) -> float:
    cert = x509.load_pem_x509_certificate(cert_pem)
    return (cert.not_valid_after_utc - dt.datetime.now(dt.UTC)).total_seconds()


def serial_of(cert_pem: bytes) -> str:
    return format(x509.load_pem_x509_certificate(cert_pem).serial_number, "x")


def check_renewed(cert_pem: bytes, ca_pem: bytes, want: Identity, csr_pem: bytes) -> None:
    """The renewed certificate is from the fleet CA, for ``want``, for the CSR's key."""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
        cas = x509.load_pem_x509_certificates(ca_pem)
    except ValueError as exc:
        raise PkiError(f"renewed certificate unreadable: {exc}", check=CHECK_RENEWED_CERT) from exc
    issued = False
    for ca in cas:
        try:
            cert.verify_directly_issued_by(ca)
            issued = True
        except (ValueError, TypeError, InvalidSignature):
            continue
    ok = identity_from_pem(cert_pem) == want and cert_matches_csr(cert_pem, load_csr(csr_pem))
    if not (issued and ok):
        raise PkiError(
            f"the renewed certificate is not the fleet CA's for {want} and the new key",
            check=CHECK_RENEWED_CERT,
        )


class CertRenewer:
    """Renews ``tls``'s host certificate before it expires, on its own thread."""

    def __init__(
        self,
        tls: TlsFiles,
        ident: Identity,
        renew_before_s: float,
        stub: Any,  # FailoverStub of AgentService
        apply: Callable[[TlsFiles], None],
        stop: threading.Event,
        *,
        trust_poll_s: float = 0.0,
    ) -> None:
        self.tls, self.ident, self.renew_before_s = tls, ident, renew_before_s
        self.stub, self.apply, self.stop = stub, apply, stop
        self.trust_poll_s = trust_poll_s
        self.renewals = 0
        self.failures = 0
        self.bundles = 0  # CA bundles installed (a rotation's steps)
        self._thread = threading.Thread(target=self._run, name="cert-renew", daemon=True)

    def start(self) -> CertRenewer:
        if self.renew_before_s > 0 or self.trust_poll_s > 0:
            self._thread.start()
        return self

    def due_in(self) -> float:
        """Seconds until renewal is due (<= 0: now): never without ``renew_before_s``,
        at once when the bundle's signing CA did not issue this host's certificate."""
        ca_pem, cert_pem, _ = self.tls.read()
        if self.renew_before_s <= 0:
            return MAX_SLEEP_S
        signer = CaBundle.parse(ca_pem).signer
        if CaBundle((signer,)).issuer_of(x509.load_pem_x509_certificate(cert_pem)) is None:
            return 0.0  # a CA rotation promoted a new signer: move onto it
        return seconds_left(cert_pem) - self.renew_before_s

    def sync_bundle(self) -> bool:
        """Install the coordinator's CA bundle when it differs from ours; True if it did."""
        ca_pem, cert_pem, _ = self.tls.read()
        req = pb.TrustBundleRequest(
            host_id=self.ident.name, rack=self.ident.rack, have_sha256=cabundle.digest(ca_pem)
        )
        resp = self.stub.TrustBundle(req, timeout=RPC_TIMEOUT_S)
        if not resp.ca_pem:
            return False  # the same bundle
        served_pem = resp.ca_pem.encode("ascii")
        if cabundle.digest(served_pem) != resp.sha256:
            raise BundleRefused("the served trust bundle does not match its digest")
        served = CaBundle.parse(served_pem)
        cabundle.continues(CaBundle.parse(ca_pem), served, x509.load_pem_x509_certificate(cert_pem))
        write_file_atomic(self.tls.ca, served_pem, 0o644)
        self.apply(self.tls)
        self.bundles += 1
        log.info(
            "trust bundle installed: %d CAs, signer %s, sha256 %s",
            len(served.cas),
            cabundle.fingerprint(served.signer)[:16],
            resp.sha256,
        )
        return True

    def renew_once(self) -> str:
        """Renew now; the new certificate's serial."""
        staging = self.tls.key.parent / f".renew-{self.ident.name}"
        try:
            csr_pem = make_csr(self.ident.name, self.ident.rack, staging)
            req = pb.RenewCertRequest(
                host_id=self.ident.name, rack=self.ident.rack, csr_pem=csr_pem.decode("ascii")
            )
            resp = self.stub.RenewCert(req, timeout=RPC_TIMEOUT_S)
            cert_pem = resp.cert_pem.encode("ascii")
            check_renewed(cert_pem, self.tls.read()[0], self.ident, csr_pem)
            key_pem = (staging / f"{self.ident.name}.key").read_bytes()
            # both staged beside the live ones, then renamed: a crash in between is
            # finished when the agent starts (identity/certpair.py)
            certpair.install(self.tls, key_pem, cert_pem)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        self.apply(self.tls)
        self.renewals += 1
        return serial_of(cert_pem)

    def _run(self) -> None:
        wait = 0.0
        while not self.stop.wait(wait):
            self._sync_quietly()
            wait = self._renew_quietly()
            if self.trust_poll_s > 0:
                wait = min(wait, self.trust_poll_s)

    def _sync_quietly(self) -> None:
        if self.trust_poll_s <= 0:
            return
        try:
            self.sync_bundle()
        except Exception as exc:  # the thread must outlive any one failure
            self.failures += 1
            check = getattr(exc, "check", "") or type(exc).__name__
            log.warning("trust bundle not installed (check=%s): %s", check, exc)

    def _renew_quietly(self) -> float:
        """Renew if due; the seconds until the next look."""
        try:
            due = self.due_in()
            if due > 0:
                return min(due, MAX_SLEEP_S)
            serial = self.renew_once()
            log.info("certificate renewed: serial %s (%s)", serial, self.tls.cert)
            return RENEW_MIN_S
        except Exception as exc:  # the renewer must outlive any one failure
            self.failures += 1
            check = getattr(exc, "check", "") or type(exc).__name__
            log.warning("certificate renewal failed (check=%s): %s", check, exc)
            return RETRY_S


__all__ = ["CertRenewer", "check_renewed", "seconds_left", "serial_of"]
