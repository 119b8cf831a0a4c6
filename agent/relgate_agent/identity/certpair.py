"""A host's key and certificate replaced as a pair, surviving a crash between the two renames.

A renewal (agent/renew.py) writes a new key and a new certificate; each file alone is
replaced atomically (``write_file_atomic``), but two renames are not one. Were the agent
killed between them, the key on disk would not match the certificate and the host could
not start: a fleet's renewal would turn a power cut into a re-enrollment.

So the pair goes through staged files beside the live ones (``<key>.next``,
``<cert>.next``, both fsynced, the key's 0600) before either live file changes, and
:func:`recover` (run when the agent starts, before the TLS files are read) finishes an
install a crash cut short: staged files that form a pair are renamed into place, the
certificate last; staged files that do not (a crash while staging) are removed and the
live pair, untouched, stays.
"""

from __future__ import annotations

import logging
import os
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from relgate_trust.fstree import write_file_atomic

from relgate_agent.pki import TlsFiles

log = logging.getLogger(__name__)

NEXT = ".next"


def _staged(path: Path) -> Path:
    return path.with_name(path.name + NEXT)


def pair_matches(key_pem: bytes, cert_pem: bytes) -> bool:
    """Is ``cert_pem`` the certificate of ``key_pem``'s public key?"""
    try:
        key = serialization.load_pem_private_key(key_pem, None)
        cert = x509.load_pem_x509_certificate(cert_pem)
    except (ValueError, TypeError):
        return False
    return cert.public_key() == key.public_key()


def install(tls: TlsFiles, key_pem: bytes, cert_pem: bytes) -> None:
    """Stage both files, then rename the key and the certificate over the live ones."""
    write_file_atomic(_staged(tls.key), key_pem, 0o600)
    write_file_atomic(_staged(tls.cert), cert_pem, 0o644)
    _commit(tls)


def _commit(tls: TlsFiles) -> None:
    if _staged(tls.key).exists():
        os.replace(_staged(tls.key), tls.key)
    os.replace(_staged(tls.cert), tls.cert)
    fd = os.open(tls.cert.parent, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def recover(tls: TlsFiles) -> str:
    """Finish or undo an install a crash cut short; what was done ("" nothing)."""
    key_next, cert_next = _staged(tls.key), _staged(tls.cert)
    if not cert_next.exists():
        if key_next.exists():  # staging stopped before the certificate: the live pair stands
            key_next.unlink()
            return "removed a staged key without its certificate"
        return ""
    cert_pem = cert_next.read_bytes()
    key_path = key_next if key_next.exists() else tls.key  # the key renamed already
    if pair_matches(key_path.read_bytes(), cert_pem):
        _commit(tls)
        log.warning("finished a certificate install a restart cut short: %s", tls.cert)
        return "finished the staged install"
    for leftover in (key_next, cert_next):
        leftover.unlink(missing_ok=True)
    log.warning("removed staged key/certificate files that are no pair: %s", tls.cert)
    return "removed staged files that are no pair"


__all__ = ["install", "pair_matches", "recover"]
