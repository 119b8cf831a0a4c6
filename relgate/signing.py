"""DSSE envelopes signed with Ed25519, verified only against an explicit trusted key set.

keyid = ``sha256:<hex>`` of the raw 32-byte public key.  Private keys are PEM PKCS8,
public keys PEM SubjectPublicKeyInfo.  An envelope with no signature from a trusted key is
rejected; a trusted key whose signature does not verify means the payload was tampered
with, and that is rejected too.  Nothing here ever warns and carries on.
"""

from __future__ import annotations

import base64
import binascii
import json
import os
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from relgate.digests import sha256_digest
from relgate.errors import IntegrityError, RejectedError, UsageError


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE pre-authentication encoding."""
    t = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(t), t, len(payload), payload)


def keyid_of(public_key: Ed25519PublicKey) -> str:
    raw = public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return sha256_digest(raw)


@dataclass(frozen=True)
class SigningKey:
    private_key: Ed25519PrivateKey

    @classmethod
    def generate(cls) -> SigningKey:
        return cls(Ed25519PrivateKey.generate())

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> SigningKey:
        key = serialization.load_pem_private_key(Path(path).read_bytes(), password=None)
        if not isinstance(key, Ed25519PrivateKey):
            raise UsageError("signing key is not Ed25519", object=str(path), check="key-type")
        return cls(key)

    @property
    def public_key(self) -> Ed25519PublicKey:
        return self.private_key.public_key()

    @property
    def keyid(self) -> str:
        return keyid_of(self.public_key)

    def private_pem(self) -> bytes:
        return self.private_key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )

    def public_pem(self) -> bytes:
        return self.public_key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )


@dataclass(frozen=True)
class TrustedKeys:
    keys: dict[str, Ed25519PublicKey] = field(default_factory=dict)

    @classmethod
    def of(cls, *public_keys: Ed25519PublicKey) -> TrustedKeys:
        return cls({keyid_of(k): k for k in public_keys})

    @classmethod
    def load(cls, paths: Iterable[str | os.PathLike[str]]) -> TrustedKeys:
        """Load PEM public keys from files, or every ``*.pem`` in a directory."""
        keys: dict[str, Ed25519PublicKey] = {}
        for entry in paths:
            path = Path(entry)
            files = sorted(path.glob("*.pem")) if path.is_dir() else [path]
            for file in files:
                key = serialization.load_pem_public_key(file.read_bytes())
                if not isinstance(key, Ed25519PublicKey):
                    raise UsageError(
                        "trusted key is not Ed25519", object=str(file), check="key-type"
                    )
                keys[keyid_of(key)] = key
        return cls(keys)

    def __contains__(self, keyid: object) -> bool:
        return keyid in self.keys

    def __len__(self) -> int:
        return len(self.keys)


def sign_envelope(payload_type: str, payload: bytes, key: SigningKey) -> dict[str, Any]:
    sig = key.private_key.sign(pae(payload_type, payload))
    return {
        "payloadType": payload_type,
        "payload": base64.b64encode(payload).decode(),
        "signatures": [{"keyid": key.keyid, "sig": base64.b64encode(sig).decode()}],
    }


def verify_envelope(
    envelope: Any, trusted: TrustedKeys, *, payload_type: str, subject: str
) -> bytes:
    """Return the payload bytes if a trusted key signed exactly them; else raise."""
    if not isinstance(envelope, dict) or not isinstance(envelope.get("payload"), str):
        raise RejectedError("not a DSSE envelope", object=subject, check="envelope-shape")
    if envelope.get("payloadType") != payload_type:
        raise RejectedError(
            f"payloadType {envelope.get('payloadType')!r} is not {payload_type!r}",
            object=subject,
            check="payload-type",
        )
    if len(trusted) == 0:
        raise UsageError("no trusted keys configured", object=subject, check="trusted-keys")
    try:
        payload = base64.b64decode(envelope["payload"], validate=True)
    except (binascii.Error, ValueError):
        raise RejectedError(
            "payload is not base64", object=subject, check="envelope-shape"
        ) from None
    signatures = envelope.get("signatures") or []
    if not signatures:
        raise RejectedError("envelope is unsigned", object=subject, check="signature-present")
    message = pae(payload_type, payload)
    seen_unknown = []
    for entry in signatures:
        keyid = entry.get("keyid") if isinstance(entry, dict) else None
        if not isinstance(keyid, str) or keyid not in trusted:
            seen_unknown.append(str(keyid))
            continue
        try:
            sig = base64.b64decode(entry.get("sig", ""), validate=True)
            trusted.keys[keyid].verify(sig, message)
        except (InvalidSignature, binascii.Error, ValueError):
            raise IntegrityError(
                "signature does not verify: the payload was changed after signing",
                object=subject,
                check="signature-valid",
                digest=keyid,
            ) from None
        return payload
    raise RejectedError(
        "no signature from a trusted key",
        object=subject,
        check="signature-trusted",
        details={"unknownKeyids": seen_unknown},
    )


def load_envelope(path: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        data = json.loads(Path(path).read_bytes())
    except (OSError, ValueError) as exc:
        raise UsageError(
            f"cannot read envelope: {exc}", object=str(path), check="envelope-read"
        ) from None
    if not isinstance(data, dict):
        raise RejectedError("not a DSSE envelope", object=str(path), check="envelope-shape")
    return data
