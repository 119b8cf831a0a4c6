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

from relgate.integrity.digests import hex_of
from relgate.integrity.documents import DocumentKind
from relgate.integrity.signing import SigningKey, TrustedKeys
from relgate.objects.cas import ContentRef, digest_of_uri
from relgate.objects.versioned import ObjectStore

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


KIND = DocumentKind(SCHEMA, PAYLOAD_TYPE, "snapshotId", REQUIRED_FIELDS)


def seal(body: dict[str, Any]) -> SnapshotManifest:
    """Compute the digest of a manifest body and set ``snapshotId`` from it."""
    return SnapshotManifest(KIND.seal(body))


def sign(manifest: SnapshotManifest, key: SigningKey) -> dict[str, Any]:
    return KIND.sign(manifest.body, key)


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
    return SnapshotManifest(KIND.open(envelope, trusted, expected=expected, subject=subject))


def load(
    store: ObjectStore, trusted: TrustedKeys, digest: str, version_id: str
) -> SnapshotManifest:
    return SnapshotManifest(
        KIND.load(store, trusted, key=envelope_key(digest), digest=digest, version_id=version_id)
    )
