"""Optional AES-256-GCM encryption of shard objects.

Stored object layout: ``MAGIC (8 bytes) || nonce (12 random bytes) || ciphertext || tag``.
The descriptor's ``digest`` and ``size`` are over these stored bytes; its
``logicalDigest`` is over the decrypted, decoded record stream, so after decryption the
verifier still proves the records.

Associated data binds a ciphertext to the one place it may be read: everything about the
shard that is known before the root manifest is sealed (the root's own digest is not, it
depends on the ciphertext digests)::

    RFC 8785 JSON {"aad": "relgate.shard.aad.v1", "keyVersion", "logicalDigest",
                   "recordSchema", "shard", "snapshot"}

so a shard moved under another descriptor (other id or logical digest), another snapshot,
another record schema or another key version fails authentication.  Keys are 32 raw bytes,
named by an opaque ``keyVersion`` recorded in the root manifest's ``writer`` block; a
reader holds a key ring ``{keyVersion: key}``.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from relgate.errors import IntegrityError, RejectedError, UsageError
from relgate.integrity.canonical import canonical_bytes
from relgate.integrity.identifiers import validate_id

MAGIC = b"RGAESGCM"
NONCE_BYTES = 12
TAG_BYTES = 16
ALGORITHM = "AES-256-GCM"


def shard_aad(
    *, snapshot: str, shard: str, logical_digest: str, record_schema: str, key_version: str
) -> bytes:
    return canonical_bytes(
        {
            "aad": "relgate.shard.aad.v1",
            "keyVersion": key_version,
            "logicalDigest": logical_digest,
            "recordSchema": record_schema,
            "shard": shard,
            "snapshot": snapshot,
        }
    )


#: An AES-256-GCM key is 32 raw bytes.
KEY_BYTES = 32


def _check_key(key: bytes, key_version: str) -> None:
    if not isinstance(key, bytes | bytearray) or len(key) != KEY_BYTES:
        raise UsageError(
            "an AES-256-GCM key is exactly 32 bytes",
            object=f"key {key_version}",
            check="key-length",
        )


def encrypt_shard(plaintext: bytes, key: bytes, aad: bytes, *, key_version: str) -> bytes:
    _check_key(key, key_version)
    nonce = os.urandom(NONCE_BYTES)  # random 96-bit nonce, never reused with one key
    return MAGIC + nonce + AESGCM(key).encrypt(nonce, plaintext, aad)


def decrypt_shard(
    stored: bytes, key: bytes, aad: bytes, *, key_version: str, shard: str, digest: str
) -> bytes:
    """Plaintext, or IntegrityError naming the shard, the check and the stored digest."""
    _check_key(key, key_version)
    if len(stored) < len(MAGIC) + NONCE_BYTES + TAG_BYTES or not stored.startswith(MAGIC):
        raise RejectedError(
            "stored object is not an AES-256-GCM shard",
            object=shard,
            check="ciphertext-format",
            digest=digest,
        )
    nonce = stored[len(MAGIC) : len(MAGIC) + NONCE_BYTES]
    try:
        return AESGCM(key).decrypt(nonce, stored[len(MAGIC) + NONCE_BYTES :], aad)
    except InvalidTag:
        raise IntegrityError(
            "shard does not decrypt: wrong key, or associated data of another shard/release",
            object=shard,
            check="decrypt-authenticate",
            digest=digest,
            details={"keyVersion": key_version},
        ) from None


def key_ring(specs: Iterable[str]) -> dict[str, bytes]:
    """``VERSION=PATH`` specs -> ``{keyVersion: key bytes}`` (the reader's key ring)."""
    ring = {}
    for spec in specs:
        version, sep, path = spec.partition("=")
        if not sep or not version:
            raise UsageError("a key is given as VERSION=PATH", object="--key", check="key-spec")
        version = validate_id(version, kind="key version", where="--key")
        try:
            with open(path, "rb") as fh:
                ring[version] = fh.read(33)
        except OSError as exc:
            raise UsageError(
                f"key file unreadable: {type(exc).__name__}",
                object=f"--key {version}",
                check="key-file",
            ) from None
    return ring
