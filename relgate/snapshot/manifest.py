"""The ``training.dataset.snapshot.v1`` manifest, its signature and its storage.

The manifest enumerates facts: pinned source versions, both fence watermarks, record
schema, policies by digest (and their full text, so replay needs nothing else), the
transform by image digest, the membership table by content address and tuple root, and
PROV-style lineage.  Its digest (the ``snapshotId``) is SHA-256 over the RFC 8785 form
without ``snapshotId``, ``signatures`` or transport fields.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from relgate.canonical import canonical_bytes, manifest_digest
from relgate.digests import hex_of, require_digest
from relgate.errors import IntegrityError, RejectedError
from relgate.objects.base import ObjectStore
from relgate.objects.cas import ContentRef, digest_of_uri
from relgate.signing import SigningKey, TrustedKeys, sign_envelope, verify_envelope

SCHEMA = "training.dataset.snapshot.v1"
PAYLOAD_TYPE = "application/vnd.relgate.dataset-snapshot.v1+json"
MANIFEST_PREFIX = "manifests/snapshots/"

REQUIRED_FIELDS = (
    "schema",
    "parents",
    "sources",
    "tombstoneWatermark",
    "benchmarkFence",
    "recordSchema",
    "selectionPolicy",
    "transformImage",
    "members",
    "splitPolicy",
    "purpose",
    "splits",
    "policies",
    "provenance",
)


def envelope_key(digest: str) -> str:
    return f"{MANIFEST_PREFIX}{hex_of(digest)}.dsse.json"


@dataclass(frozen=True)
class SnapshotManifest:
    body: dict[str, Any]

    @property
    def digest(self) -> str:
        return str(self.body["snapshotId"])

    @property
    def members_ref(self) -> ContentRef:
        members = self.body["members"]
        return ContentRef(
            digest_of_uri(members["uri"]), members["objectVersion"], int(members["size"])
        )

    @property
    def member_count(self) -> int:
        return int(self.body["members"]["count"])

    @property
    def tuple_root(self) -> str:
        return str(self.body["members"]["tupleRoot"])

    def source(self, source_id: str) -> dict[str, Any]:
        for entry in self.body["sources"]:
            if entry["id"] == source_id:
                return dict(entry)
        raise KeyError(source_id)


def seal(body: dict[str, Any]) -> SnapshotManifest:
    """Compute the digest of a manifest body and set ``snapshotId`` from it."""
    missing = [f for f in REQUIRED_FIELDS if f not in body]
    if missing:
        raise RejectedError(f"manifest lacks {missing}", object="manifest", check="required-fields")
    body = {k: v for k, v in body.items() if k not in ("snapshotId", "signatures")}
    digest = manifest_digest(body)
    return SnapshotManifest({**body, "snapshotId": digest})


def sign(manifest: SnapshotManifest, key: SigningKey) -> dict[str, Any]:
    return sign_envelope(PAYLOAD_TYPE, canonical_bytes(manifest.body), key)


def store_envelope(store: ObjectStore, manifest: SnapshotManifest, envelope: dict[str, Any]) -> str:
    version = store.create(
        envelope_key(manifest.digest), json.dumps(envelope, sort_keys=True).encode()
    )
    return version.version_id


def open_envelope(
    envelope: dict[str, Any],
    trusted: TrustedKeys,
    *,
    expected: str | None = None,
    subject: str = "manifest",
) -> SnapshotManifest:
    """Verify signature, schema and digest; return the manifest the envelope vouches for."""
    payload = verify_envelope(envelope, trusted, payload_type=PAYLOAD_TYPE, subject=subject)
    try:
        body = json.loads(payload)
    except ValueError:
        raise RejectedError(
            "signed payload is not JSON", object=subject, check="payload-json"
        ) from None
    if not isinstance(body, dict) or body.get("schema") != SCHEMA:
        raise RejectedError(f"payload is not a {SCHEMA}", object=subject, check="schema")
    claimed = require_digest(str(body.get("snapshotId", "")), what="snapshotId")
    actual = manifest_digest(body)
    if actual != claimed:
        raise IntegrityError(
            "manifest digest does not match its snapshotId",
            object=subject,
            check="manifest-digest",
            digest=claimed,
            details={"recomputed": actual},
        )
    if expected is not None and claimed != expected:
        raise IntegrityError(
            "envelope holds a different snapshot",
            object=subject,
            check="manifest-identity",
            digest=expected,
            details={"found": claimed},
        )
    missing = [f for f in REQUIRED_FIELDS if f not in body]
    if missing:
        raise RejectedError(
            f"manifest lacks {missing}", object=subject, check="required-fields", digest=claimed
        )
    return SnapshotManifest(body)


def load(
    store: ObjectStore, trusted: TrustedKeys, digest: str, version_id: str
) -> SnapshotManifest:
    raw = store.get(envelope_key(digest), version_id)
    try:
        envelope = json.loads(raw)
    except ValueError:
        raise IntegrityError(
            "stored envelope is not JSON",
            object=envelope_key(digest),
            check="envelope-json",
            digest=digest,
        ) from None
    return open_envelope(envelope, trusted, expected=digest, subject=envelope_key(digest))
