"""Verified envelope bytes: a stored signed document is verified once, then recognised by
the SHA-256 of its bytes.

Opening a signed document (DSSE/Ed25519 signature, strict canonical payload, recomputed
digest, identity, required fields) is a pure function of its exact bytes and the trusted
key set.  So once a version's stored envelope has been verified in full, its catalog row
keeps :class:`VerifiedBytes`: the SHA-256 of those bytes and the digest of the trusted key
set that verified them.  A reader that needs what the document says (the collector's
mark) hashes the stored bytes and compares (:func:`open_stored`):

* the recorded bytes, the same trusted keys: the document is the one verified, and its
  payload is read without running the signature, canonical-form and digest checks again;
* other bytes (a tampered, swapped or replaced object, or an edited record): refused,
  check :data:`CHECK`, naming the object and the version's digest;
* no record yet, or the trusted key set changed since (a key added, revoked or given
  another role): verified in full again, and the new :class:`Verification` is returned
  for the caller to record.
"""

from __future__ import annotations

import base64
import json
from dataclasses import dataclass

from relgate_trust.digests import sha256_digest

from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.documents.kind import DocumentKind
from relgate.errors import IntegrityError, RejectedError
from relgate.integrity.canonical import canonical_bytes
from relgate.integrity.contract import JsonObject, Record
from relgate.integrity.signing import TrustedKeys
from relgate.objects.layout import envelope_key
from relgate.objects.versioned import ObjectStore

#: The check a stored envelope fails when its bytes are not the bytes verified.
CHECK = "verified-digest"
_KINDS: dict[str, DocumentKind] = {"snapshot": sm.KIND, "release": rm.KIND}


class VerifiedBytes(Record):
    """What a catalog row keeps of its envelope's verification."""

    #: ``sha256:<hex>`` of the stored envelope bytes that were verified
    sha256: str
    #: :func:`trust_digest` of the trusted key set that verified them
    trust: str


@dataclass(frozen=True)
class Verification:
    """One envelope just verified in full: the row to record it on."""

    kind: str
    digest: str
    envelope_version: str
    verified: VerifiedBytes


@dataclass(frozen=True)
class Opened:
    """A stored document's payload, and its :class:`Verification` when it was verified in
    full just now (None when recognised by its recorded bytes)."""

    body: JsonObject
    verification: Verification | None


def trust_digest(trusted: TrustedKeys) -> str:
    """A digest of everything verification reads from the trusted key set: each key's id,
    role and version, and the revoked key ids."""
    keys = sorted(
        [keyid, key.role.value if key.role is not None else "", key.version]
        for keyid, key in trusted.keys.items()
    )
    return sha256_digest(canonical_bytes({"keys": keys, "revoked": sorted(trusted.revoked)}))


def _payload(data: bytes, subject: str) -> JsonObject:
    """The payload of envelope bytes that were verified before (so well formed)."""
    body = json.loads(base64.b64decode(json.loads(data)["payload"]))
    if not isinstance(body, dict):
        raise RejectedError("payload is not a JSON object", object=subject, check="schema")
    return body


def open_stored(
    store: ObjectStore,
    trusted: TrustedKeys,
    kind: str,
    digest: str,
    version_id: str,
    recorded: VerifiedBytes | None,
) -> Opened:
    """The payload of the envelope of ``kind`` ``digest`` stored at ``version_id``:
    recognised by ``recorded`` or verified in full (see the module docstring)."""
    key = envelope_key(kind, digest)
    data = store.get(key, version_id)
    actual = sha256_digest(data)
    if recorded is not None and recorded.sha256 != actual:
        raise IntegrityError(
            "stored envelope bytes are not the bytes verified when the version was admitted",
            object=f"{key}@{version_id}",
            check=CHECK,
            digest=digest,
            details={"recorded": recorded.sha256, "stored": actual},
        )
    if recorded is not None and recorded.trust == trust_digest(trusted):
        return Opened(_payload(data, key), None)
    body, verification = _verify(data, trusted, kind, digest, version_id)
    return Opened(body, verification)


def _verify(
    data: bytes, trusted: TrustedKeys, kind: str, digest: str, version_id: str
) -> tuple[JsonObject, Verification]:
    body = _KINDS[kind].open(data, trusted, expected=digest, subject=envelope_key(kind, digest))
    verified = VerifiedBytes(sha256=sha256_digest(data), trust=trust_digest(trusted))
    return body, Verification(kind, digest, version_id, verified)


def verify_stored(
    store: ObjectStore, trusted: TrustedKeys, kind: str, digest: str, version_id: str
) -> VerifiedBytes:
    """Verify the stored envelope in full and return what its row records: the one
    verification a version's admission runs."""
    data = store.get(envelope_key(kind, digest), version_id)
    return _verify(data, trusted, kind, digest, version_id)[1].verified
