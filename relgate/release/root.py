"""The ``training.shard.release.v1`` root manifest.

Binds a dataset snapshot to physical shards: one OCI-style descriptor per shard
(``mediaType``, ``digest`` of the stored bytes, ``size``, ``objectVersion``,
``logicalDigest`` of the decoded canonical record stream, ``records``, ``tokens``,
``memberSetDigest``), both fence watermarks, the record schema, totals, the
``orderedMemberTupleRoot`` and the writer parameters (serializer, sort seed, sharding
function, compression, key version).  Its digest, the ``rootId``, is what approvals,
permits and runs name.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from relgate.integrity.digests import hex_of
from relgate.integrity.documents import DocumentKind
from relgate.integrity.signing import SigningKey, TrustedKeys
from relgate.objects.versioned import ObjectStore

SCHEMA = "training.shard.release.v1"
PAYLOAD_TYPE = "application/vnd.relgate.shard-release.v1+json"
SHARD_MEDIA_TYPE = "application/vnd.apache.parquet"
ENCRYPTED_SHARD_MEDIA_TYPE = "application/vnd.relgate.parquet+aes256gcm"
MANIFEST_PREFIX = "manifests/releases/"

REQUIRED_FIELDS = (
    "schema",
    "datasetSnapshot",
    "tombstoneWatermark",
    "benchmarkFence",
    "recordSchema",
    "shards",
    "totals",
    "orderedMemberTupleRoot",
    "writer",
)
DESCRIPTOR_FIELDS = (
    "id",
    "mediaType",
    "digest",
    "size",
    "objectVersion",
    "logicalDigest",
    "records",
    "tokens",
    "memberSetDigest",
)

KIND = DocumentKind(SCHEMA, PAYLOAD_TYPE, "rootId", REQUIRED_FIELDS)


def envelope_key(digest: str) -> str:
    return f"{MANIFEST_PREFIX}{hex_of(digest)}.dsse.json"


@dataclass(frozen=True)
class ReleaseManifest:
    body: dict[str, Any]

    @property
    def digest(self) -> str:
        return str(self.body["rootId"])

    @property
    def shards(self) -> list[dict[str, Any]]:
        return list(self.body["shards"])

    @property
    def snapshot(self) -> str:
        return str(self.body["datasetSnapshot"])


def seal(body: dict[str, Any]) -> ReleaseManifest:
    return ReleaseManifest(KIND.seal(body))


def sign(manifest: ReleaseManifest, key: SigningKey) -> dict[str, Any]:
    return KIND.sign(manifest.body, key)


def store_envelope(store: ObjectStore, manifest: ReleaseManifest, envelope: dict[str, Any]) -> str:
    return store.create(
        envelope_key(manifest.digest), json.dumps(envelope, sort_keys=True).encode()
    ).version_id


def open_envelope(
    envelope: dict[str, Any],
    trusted: TrustedKeys,
    *,
    expected: str | None = None,
    subject: str = "release",
) -> ReleaseManifest:
    return ReleaseManifest(KIND.open(envelope, trusted, expected=expected, subject=subject))


def load(store: ObjectStore, trusted: TrustedKeys, digest: str, version_id: str) -> ReleaseManifest:
    return ReleaseManifest(
        KIND.load(store, trusted, key=envelope_key(digest), digest=digest, version_id=version_id)
    )
