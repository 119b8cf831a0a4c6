"""Signing keys and DSSE envelopes of the core: a thin layer over :mod:`relgate_trust.dsse`.

The envelope format, its strict parser (size, shape, base64, duplicate keys, depth, no
floats, safe integers, RFC 8785 canonical payload) and the trusted key set are written once,
in the agent package, and shared.  This module adds what is the core's:

* :class:`SigningKey` -- a PEM private key with the role and version it signs as;
* the mapping of every refusal to :mod:`relgate.errors` (``signature-valid`` ->
  IntegrityError, ``trusted-keys`` -> UsageError, everything else -> RejectedError: exit 3),
  keeping the check name, the subject and the keyid.
"""

from __future__ import annotations

import os
from collections.abc import Collection, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from relgate_trust import dsse
from relgate_trust.dsse import (
    DsseError,
    Role,
    TrustedKey,
    TrustedKeys,
    Verified,
    keyid_of,
    roles_for,
)

from relgate.errors import IntegrityError, RejectedError, RelgateError, UsageError
from relgate.integrity.contract import JsonObject

__all__ = [
    "Role",
    "SigningKey",
    "TrustedKey",
    "TrustedKeys",
    "Verified",
    "keyid_of",
    "load_envelope",
    "load_trusted",
    "open_verified",
    "sign_envelope",
    "verify_envelope",
]


@dataclass(frozen=True)
class SigningKey(dsse.Signer):
    """The agent's :class:`relgate_trust.dsse.Signer` (key, role, version; ``keyid`` and
    ``public_key`` come from there) plus what the core adds: loading a PEM file,
    generating a key and exporting PEM."""

    @classmethod
    def generate(cls, role: Role | None = None, version: int = 1) -> SigningKey:
        return cls(Ed25519PrivateKey.generate(), role, version)

    @classmethod
    def load(
        cls, path: str | os.PathLike[str], role: Role | None = None, version: int = 1
    ) -> SigningKey:
        try:
            key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        except (OSError, ValueError, TypeError) as exc:
            raise UsageError(
                f"cannot load signing key: {exc}", object=str(path), check="key-read"
            ) from None
        if not isinstance(key, Ed25519PrivateKey):
            raise UsageError("signing key is not Ed25519", object=str(path), check="key-type")
        return cls(key, role, version)

    def private_pem(self) -> bytes:
        pem: bytes = self.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
        return pem

    def public_pem(self) -> bytes:
        pem: bytes = self.public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return pem


def sign_envelope(payload_type: str, payload: bytes, key: SigningKey) -> JsonObject:
    """A DSSE envelope over ``payload`` (PAE and Ed25519 in :mod:`relgate_trust.dsse`)."""
    envelope: JsonObject = dsse.sign(payload_type, payload, key)
    return envelope


def relgate_error(exc: DsseError, subject: str | None = None) -> RelgateError:
    """The core error for a refusal: same check, subject and keyid; exit 3 (2 for key config)."""
    cls: type[RelgateError] = RejectedError
    if exc.check == "signature-valid":
        cls = IntegrityError
    elif exc.check == "trusted-keys":
        cls = UsageError
    return cls(
        exc.reason,
        object=subject or exc.subject,
        check=exc.check,
        digest=exc.keyid or None,
    )


def open_verified(
    envelope: bytes | str | Mapping[str, object],
    trusted: TrustedKeys,
    *,
    payload_type: str,
    subject: str,
    roles: Collection[Role | None] | None = None,
    canonical: bool = True,
) -> Verified:
    """Verify an envelope (bytes or parsed) and strictly parse its payload, or raise exit 3."""
    try:
        return dsse.verify(
            envelope,
            trusted,
            payload_type=payload_type,
            roles=roles_for(payload_type) if roles is None else roles,
            subject=subject,
            canonical=canonical,
        )
    except DsseError as exc:
        raise relgate_error(exc, subject) from None


def verify_envelope(
    envelope: bytes | str | Mapping[str, object],
    trusted: TrustedKeys,
    *,
    payload_type: str,
    subject: str,
) -> bytes:
    """Return the payload bytes if a trusted key of the right role signed exactly them."""
    verified = open_verified(envelope, trusted, payload_type=payload_type, subject=subject)
    payload: bytes = verified.payload
    return payload


def load_trusted(sources: Collection[str | os.PathLike[str]]) -> TrustedKeys:
    """Trusted keys from PEM files/dirs (``ROLE=PATH`` entries allowed); bad files exit 2."""
    try:
        return TrustedKeys.load(list(sources))
    except DsseError as exc:
        raise relgate_error(exc) from None


def load_envelope(path: str | os.PathLike[str]) -> bytes:
    """The bytes of an envelope file, bounded (parsing and checks happen in verification)."""
    try:
        with open(path, "rb") as fh:
            data = fh.read(dsse.MAX_ENVELOPE_BYTES + 1)
    except OSError as exc:
        raise UsageError(
            f"cannot read envelope: {exc}", object=str(path), check="envelope-read"
        ) from None
    if len(data) > dsse.MAX_ENVELOPE_BYTES:
        raise RejectedError(
            f"envelope is larger than {dsse.MAX_ENVELOPE_BYTES} bytes",
            object=str(path),
            check="envelope-size",
        )
    return data
