"""Certificates checked for their whole life, not only at the handshake.

TLS checks a certificate's expiry once, when a connection opens; a gRPC channel or a data
stream then lives for hours. A host whose certificate expired stayed live on its open
control connection, became a target, failed every data-plane handshake and demoted every
other host with its complaints. So the coordinator checks the caller's certificate on
every control-plane call, and an agent checks its peer's at every data-plane handshake and
before every block it streams: expired (``cert-expired``) or revoked (``cert-revoked``)
ends the call or the connection.

Revocation: ``revoked-certs.json`` next to the fleet CA bundle (``{"schema":
"relgate.revoked-certs.v1", "serials": ["<hex serial>", ...]}``), written by ``relgate-agent
ca revoke`` and distributed with the CA bundle. It is re-read when it changes (checked at
most every ``RELOAD_S``); a list that cannot be read or parsed keeps the last good one and
says so in the log (a missing file: nothing revoked).
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

from cryptography import x509
from relgate_trust.fstree import write_file_atomic

log = logging.getLogger(__name__)

CHECK_CERT_EXPIRED = "cert-expired"
CHECK_CERT_REVOKED = "cert-revoked"
REVOKED_CERTS_SCHEMA = "relgate.revoked-certs.v1"
REVOKED_CERTS_FILE = "revoked-certs.json"
RELOAD_S = 1.0  # the revocation list's file is looked at no more often than this
_SHARED_LOCK = threading.Lock()


@dataclass(frozen=True)
class CertLife:
    serial: int
    not_after: float  # epoch seconds
    subject: str


@lru_cache(maxsize=65536)
def life_of_pem(pem: bytes) -> CertLife:
    return _life(x509.load_pem_x509_certificate(pem))


@lru_cache(maxsize=65536)
def life_of_der(der: bytes) -> CertLife:
    return _life(x509.load_der_x509_certificate(der))


def _life(cert: x509.Certificate) -> CertLife:
    return CertLife(
        cert.serial_number, cert.not_valid_after_utc.timestamp(), cert.subject.rfc4514_string()
    )


def serial_hex(serial: int) -> str:
    return format(serial, "x")


class RevokedCerts:
    """The revoked serial numbers in ``path`` (re-read when the file changes)."""

    _shared: dict[Path, RevokedCerts] = {}

    def __init__(self, path: Path | None) -> None:
        self.path = path
        # serials the coordinator's list adds (pushed: coordinator/crl.py), on top of the file
        self.pushed: frozenset[int] = frozenset()
        self._serials: frozenset[int] = frozenset()
        self._stamp: tuple[int, int] | None = None
        self._checked = 0.0
        self._lock = threading.Lock()

    @classmethod
    def beside(cls, ca_file: Path) -> RevokedCerts:
        """The list distributed next to the fleet CA bundle ``ca_file`` (one object per
        path in a process, so the coordinator's list, once received, reaches every context)."""
        path = Path(ca_file).parent / REVOKED_CERTS_FILE
        with _SHARED_LOCK:
            have = cls._shared.get(path)
            if have is None:
                have = cls._shared[path] = cls(path)
            return have

    def serials(self) -> frozenset[int]:
        return self._file_serials() | self.pushed

    def __contains__(self, serial: int) -> bool:
        """Is ``serial`` revoked (the per-call check: two lookups, no union of the lists)?"""
        return serial in self.pushed or serial in self._file_serials()

    def _file_serials(self) -> frozenset[int]:
        if self.path is None:
            return frozenset()
        with self._lock:
            now = time.monotonic()
            if now - self._checked < RELOAD_S and self._stamp is not None:
                return self._serials
            self._checked = now
            try:
                st = os.stat(self.path)
            except FileNotFoundError:
                self._serials, self._stamp = frozenset(), (0, 0)
                return self._serials
            except OSError as exc:
                log.warning("revocation list %s unreadable (%s): keeping the last", self.path, exc)
                return self._serials
            stamp = (st.st_mtime_ns, st.st_size)
            if stamp != self._stamp:
                try:
                    self._serials = load_revoked_serials(self.path)
                    self._stamp = stamp
                except (OSError, ValueError) as exc:
                    log.warning("revocation list %s refused (%s): keeping the last", self.path, exc)
            return self._serials


def load_revoked_serials(path: Path) -> frozenset[int]:
    doc = json.loads(Path(path).read_bytes()[: 16 << 20])
    if not isinstance(doc, dict) or doc.get("schema") != REVOKED_CERTS_SCHEMA:
        raise ValueError(f"not a {REVOKED_CERTS_SCHEMA} document")
    serials = doc.get("serials")
    if not isinstance(serials, list) or not all(isinstance(s, str) for s in serials):
        raise ValueError("serials must be a list of hex strings")
    return frozenset(int(s, 16) for s in serials)


def revoke(ca_dir: Path, serial: int) -> Path:
    """Add ``serial`` to the revocation list in the CA directory ``ca_dir``."""
    path = Path(ca_dir) / REVOKED_CERTS_FILE
    have = load_revoked_serials(path) if path.exists() else frozenset()
    doc = {"schema": REVOKED_CERTS_SCHEMA, "serials": sorted(map(serial_hex, have | {serial}))}
    write_file_atomic(path, json.dumps(doc, indent=1).encode() + b"\n", 0o644)
    return path


def refusal(life: CertLife, revoked: RevokedCerts | None, now: float) -> tuple[str, str] | None:
    """(check, why) when the certificate must not be honoured now; None when it may."""
    if now >= life.not_after:
        when = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(life.not_after))
        return CHECK_CERT_EXPIRED, f"certificate {life.subject} expired at {when}"
    if revoked is not None and life.serial in revoked:
        return CHECK_CERT_REVOKED, (
            f"certificate {life.subject} (serial {serial_hex(life.serial)}) is revoked"
        )
    return None


__all__ = [
    "CHECK_CERT_EXPIRED",
    "CHECK_CERT_REVOKED",
    "REVOKED_CERTS_FILE",
    "REVOKED_CERTS_SCHEMA",
    "CertLife",
    "RevokedCerts",
    "life_of_der",
    "life_of_pem",
    "load_revoked_serials",
    "refusal",
    "revoke",
    "serial_hex",
]
