"""Signed, content-addressed JSON documents: seal (digest into the id field), sign, open.

One implementation for every manifest kind (snapshots, shard releases, reports): the
digest is SHA-256 over the RFC 8785 form without the id field, ``signatures`` and
transport fields; the envelope is DSSE/Ed25519; opening checks the signature against an
explicit trusted key set, then the schema, then the recomputed digest.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass

from relgate.errors import IntegrityError, RejectedError, UsageError
from relgate.integrity.canonical import canonical_bytes, manifest_digest
from relgate.integrity.contract import JsonObject, JsonValue
from relgate.integrity.digests import require_digest
from relgate.integrity.signing import SigningKey, TrustedKeys, open_verified, sign_envelope
from relgate.objects.versioned import ObjectStore


@dataclass(frozen=True)
class DocumentKind:
    """One kind of signed document: its schema, DSSE payload type, id field and the
    fields it must carry."""

    schema: str
    payload_type: str
    id_field: str
    required: tuple[str, ...]

    def seal(self, body: Mapping[str, JsonValue]) -> JsonObject:
        """The body with its id field set to the digest of the rest (``signatures`` dropped)."""
        missing = [f for f in self.required if f not in body]
        if missing:
            raise RejectedError(
                f"{self.schema} lacks {missing}", object=self.schema, check="required-fields"
            )
        clean = {k: v for k, v in body.items() if k not in (self.id_field, "signatures")}
        return {**clean, self.id_field: manifest_digest(clean)}

    def sign(self, sealed: Mapping[str, JsonValue], key: SigningKey) -> JsonObject:
        """The DSSE envelope over the sealed body's canonical bytes."""
        return sign_envelope(self.payload_type, canonical_bytes(sealed), key)

    def open(
        self,
        envelope: bytes | str | Mapping[str, object],
        trusted: TrustedKeys,
        *,
        expected: str | None = None,
        subject: str = "manifest",
    ) -> JsonObject:
        """Verify (role, key version, revocation, strict canonical payload), then the schema,
        the recomputed digest and, with ``expected``, the identity.  ``envelope`` is the
        envelope's bytes (preferred: duplicate keys and depth are checked on them) or its
        parsed JSON."""
        body = open_verified(
            envelope, trusted, payload_type=self.payload_type, subject=subject
        ).body
        if not isinstance(body, dict) or body.get("schema") != self.schema:
            raise RejectedError(f"payload is not a {self.schema}", object=subject, check="schema")
        try:
            claimed = require_digest(body.get(self.id_field, ""), what=self.id_field)
        except UsageError as exc:  # a signed but malformed id is a rejected document
            raise RejectedError(exc.message, object=subject, check="digest-syntax") from None
        actual = manifest_digest(body)
        if actual != claimed:
            raise IntegrityError(
                f"manifest digest does not match its {self.id_field}",
                object=subject,
                check="manifest-digest",
                digest=claimed,
                details={"recomputed": actual},
            )
        if expected is not None and claimed != expected:
            raise IntegrityError(
                "envelope holds a different document",
                object=subject,
                check="manifest-identity",
                digest=expected,
                details={"found": claimed},
            )
        missing = [f for f in self.required if f not in body]
        if missing:
            raise RejectedError(
                f"manifest lacks {missing}", object=subject, check="required-fields", digest=claimed
            )
        return body

    def load(
        self, store: ObjectStore, trusted: TrustedKeys, *, key: str, digest: str, version_id: str
    ) -> JsonObject:
        """Open the envelope stored at an exact object version; it must hold ``digest``."""
        return self.open(store.get(key, version_id), trusted, expected=digest, subject=key)
