"""The fleet's trust bundle: the CA certificates a process accepts peers from (``ca.pem``).

Normally one CA. During a CA rotation (docs/agent-ca-rotation.md) two: the signing CA first,
the other one trusted until it is retired. A bundle is read from a file or from the
coordinator (``AgentService.TrustBundle``) and is hostile until parsed here: PEM blocks of
X.509 CA certificates (basic constraints CA, may sign certificates), each inside its
validity, no duplicates, at most :data:`MAX_CAS`.

A host installs a bundle the coordinator serves only if it shares a CA with the bundle the
host trusts now (:func:`continues`): the channel it came over was authenticated by the
current bundle, and a bundle with no CA in common is a different fleet, not a rotation.
"""

from __future__ import annotations

import datetime as dt
import hashlib
import logging
import os
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization

from relgate_agent.errors import AgentError

log = logging.getLogger(__name__)

MAX_CAS = 4  # a rotation needs two; more is a mistake or an attack
MAX_BUNDLE_BYTES = 64 * 1024
CHECK_TRUST_BUNDLE = "trust-bundle"
CHECK_TRUST_CONTINUITY = "trust-bundle-continuity"
CHECK_TRUST_ORPHAN = "trust-bundle-orphan"
RECHECK_S = 1.0  # TrustFile looks at ca.pem's stat at most this often


class BundleRefused(AgentError):
    """A bundle that is not a usable set of fleet CAs; ``check`` names the rule."""

    def __init__(self, message: str, *, check: str = CHECK_TRUST_BUNDLE) -> None:
        super().__init__(message)
        self.check = check


def digest(pem: bytes) -> str:
    """The bundle's identity as exchanged with the coordinator: SHA-256 of its bytes."""
    return hashlib.sha256(pem).hexdigest()


@dataclass(frozen=True)
class CaBundle:
    """Parsed CA certificates, the signing CA first (the order of the file)."""

    cas: tuple[x509.Certificate, ...]

    @classmethod
    def parse(cls, pem: bytes, now: dt.datetime | None = None) -> CaBundle:
        if not isinstance(pem, bytes) or not 0 < len(pem) <= MAX_BUNDLE_BYTES:
            raise BundleRefused(f"a trust bundle is 1..{MAX_BUNDLE_BYTES} bytes of PEM")
        try:
            cas = tuple(x509.load_pem_x509_certificates(pem))
        except ValueError as exc:
            raise BundleRefused(f"trust bundle unreadable: {exc}") from exc
        if not 0 < len(cas) <= MAX_CAS:
            raise BundleRefused(f"a trust bundle holds 1..{MAX_CAS} CAs, not {len(cas)}")
        when = now or dt.datetime.now(dt.UTC)
        for ca in cas:
            _check_ca(ca, when)
        prints = [fingerprint(ca) for ca in cas]
        if len(set(prints)) != len(prints):
            raise BundleRefused("the trust bundle lists a CA twice")
        return cls(cas)

    @property
    def signer(self) -> x509.Certificate:
        return self.cas[0]

    def fingerprints(self) -> frozenset[str]:
        return frozenset(fingerprint(ca) for ca in self.cas)

    def issuer_of(self, cert: x509.Certificate) -> x509.Certificate | None:
        """The CA of this bundle that signed ``cert``, if any."""
        for ca in self.cas:
            try:
                cert.verify_directly_issued_by(ca)
            except (ValueError, TypeError, InvalidSignature):
                continue
            return ca
        return None

    def pem(self) -> bytes:
        return b"".join(ca.public_bytes(serialization.Encoding.PEM) for ca in self.cas)


class TrustFile:
    """``ca.pem`` as it is now (looked at every ``recheck_s``): parsed again when the file
    changes (its stat), so a CA
    rotation reaches every check that reads it without a restart. A changed file that does
    not parse keeps the last good bundle (logged); a file never read refuses."""

    def __init__(self, path: Path, recheck_s: float = RECHECK_S) -> None:
        self.path = Path(path)
        self.recheck_s = recheck_s
        self._checked = -float("inf")  # monotonic time of the last stat
        self._lock = threading.Lock()
        self._stamp: tuple[int, int, int] | None = None
        self._bundle: CaBundle | None = None
        self._raw = b""

    def bundle(self) -> CaBundle:
        return self._load()[0]

    def pem(self) -> bytes:
        """The file's bytes that parsed into :meth:`bundle` (what is served to hosts)."""
        return self._load()[1]

    def _load(self) -> tuple[CaBundle, bytes]:
        with self._lock:
            now = time.monotonic()
            if self._bundle is not None and now - self._checked < self.recheck_s:
                return self._bundle, self._raw  # the per-call check: no stat per report
            self._checked = now
            try:
                st = os.stat(self.path)
                stamp = (st.st_ino, st.st_size, st.st_mtime_ns)
                if stamp != self._stamp:
                    raw = self.path.read_bytes()
                    self._bundle, self._raw, self._stamp = CaBundle.parse(raw), raw, stamp
            except (OSError, BundleRefused) as exc:
                if self._bundle is None:
                    raise BundleRefused(f"{self.path}: {exc}") from exc
                log.warning("%s not reloaded, keeping the previous bundle: %s", self.path, exc)
                self._stamp = None  # look again next time
            if self._bundle is None:  # unreachable: the first failed read raised
                raise BundleRefused(f"{self.path}: never read")
            return self._bundle, self._raw


CHECK_CERT_ISSUER = "cert-issuer"


@lru_cache(maxsize=65536)
def issued_by(cert_pem: bytes, bundle: CaBundle) -> bool:
    """Did a CA of ``bundle`` sign this certificate? (Cached: a caller presents the same
    certificate on every call; a new bundle is a new key.)"""
    try:
        cert = x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return False
    return bundle.issuer_of(cert) is not None


def fingerprint(cert: x509.Certificate) -> str:
    return cert.fingerprint(hashes.SHA256()).hex()


def _check_ca(ca: x509.Certificate, now: dt.datetime) -> None:
    try:
        basic = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
        usage = ca.extensions.get_extension_for_class(x509.KeyUsage).value
    except (x509.ExtensionNotFound, ValueError) as exc:
        raise BundleRefused(f"{ca.subject.rfc4514_string()} is not a CA certificate") from exc
    if not (basic.ca and usage.key_cert_sign):
        raise BundleRefused(f"{ca.subject.rfc4514_string()} may not sign certificates")
    if not ca.not_valid_before_utc <= now <= ca.not_valid_after_utc:
        raise BundleRefused(
            f"CA {fingerprint(ca)[:16]} is outside its validity "
            f"({ca.not_valid_before_utc.isoformat()} .. {ca.not_valid_after_utc.isoformat()})"
        )


def continues(current: CaBundle, served: CaBundle, own_cert: x509.Certificate) -> None:
    """May a host trusting ``current`` and holding ``own_cert`` switch to ``served``?

    The two share a CA (a rotation, not another fleet), and ``own_cert`` chains to a CA
    in ``served`` (installing it must not cut this host off: renew first)."""
    if not current.fingerprints() & served.fingerprints():
        raise BundleRefused(
            f"the served trust bundle {sorted(served.fingerprints())} shares no CA with"
            f" the one trusted now {sorted(current.fingerprints())}",
            check=CHECK_TRUST_CONTINUITY,
        )
    if served.issuer_of(own_cert) is None:
        raise BundleRefused(
            "the served trust bundle has no CA for this host's own certificate (renew first)",
            check=CHECK_TRUST_ORPHAN,
        )


__all__ = [
    "CHECK_CERT_ISSUER",
    "CHECK_TRUST_BUNDLE",
    "CHECK_TRUST_CONTINUITY",
    "CHECK_TRUST_ORPHAN",
    "MAX_CAS",
    "BundleRefused",
    "CaBundle",
    "TrustFile",
    "continues",
    "digest",
    "fingerprint",
    "issued_by",
]
