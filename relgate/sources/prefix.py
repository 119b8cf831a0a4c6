"""A versioned object prefix: JSON-lines objects, each pinned by version id and byte digest.

Pinning lists the prefix once and records every current object's exact version and
SHA-256; reads go by that version, so objects added during or after the scan belong to
the next snapshot, objects deleted meanwhile stay readable through their pinned version,
and content replaced under a reused name is a new version the snapshot never sees.
The object list is stored content-addressed and referenced from the manifest.
"""

from __future__ import annotations

import json
from typing import Any

import pyarrow as pa
from relgate_trust.digests import sha256_digest

from relgate.documents.source_pins import (
    ObjectList,
    ObjectPrefixPin,
    SourceEntry,
    SourcePin,
    expect_pin,
)
from relgate.errors import IntegrityError, NotFoundError, RejectedError
from relgate.integrity.canonical import canonical_bytes
from relgate.objects.cas import ContentStore, digest_of_uri
from relgate.records.record_schema import TEXT_SCHEMA, RecordSchema
from relgate.records.rows import RowBuilder
from relgate.sources.source import Source, parse_row

PIN_KIND = "relgate.object-pin.v1"


class ObjectPrefixSource(Source):
    kind = "object-prefix"

    def __init__(
        self, source_id: str, *, cas: ContentStore, prefix: str, schema: RecordSchema = TEXT_SCHEMA
    ) -> None:
        super().__init__(source_id, schema=schema)
        self.cas = cas
        self.store = cas.store
        self.prefix = prefix

    def pin(self) -> SourcePin:
        objects = []
        total = 0
        for version in self.store.list(self.prefix):
            try:
                data = self.store.get(version.key, version.version_id)
            except NotFoundError:
                # Listed but purged before we could read it: the listing is not a
                # consistent view, so refuse rather than pin a set we cannot read.
                raise RejectedError(
                    "object vanished between listing and pinning; retry the build",
                    object=f"{self.id}:{version.key}@{version.version_id}",
                    check="source-consistent",
                ) from None
            objects.append([version.key, version.version_id, sha256_digest(data), len(data)])
            total += len(data)
        doc = {"kind": PIN_KIND, "prefix": self.prefix, "objects": objects}
        ref = self.cas.put(canonical_bytes(doc))
        listed = ObjectList(
            uri=ref.uri, object_version=ref.version_id, count=len(objects), bytes=total
        )
        entry = ObjectPrefixPin(id=self.id, prefix=self.prefix, objects=listed)
        return SourcePin(entry=entry, stats={"objects": len(objects), "unversionedObjects": 0})

    def _pinned(self, entry: SourceEntry) -> list[list[Any]]:
        ref = expect_pin(entry, ObjectPrefixPin, self.id).objects
        doc = json.loads(self.cas.get(digest_of_uri(ref.uri), ref.object_version))
        if doc.get("kind") != PIN_KIND or len(doc["objects"]) != ref.count:
            raise IntegrityError(
                "object pin list does not match the manifest",
                object=self.id,
                check="pin-list",
                digest=digest_of_uri(ref.uri),
            )
        return list(doc["objects"])

    def read(self, entry: SourceEntry) -> pa.Table:
        rows = RowBuilder(self.schema)
        for key, version_id, digest, size in self._pinned(entry):
            data = self.store.get(key, version_id)
            if len(data) != size or sha256_digest(data) != digest:
                raise IntegrityError(
                    "pinned object version no longer has its recorded bytes",
                    object=f"{self.id}:{key}@{version_id}",
                    check="source-byte-digest",
                    digest=digest,
                )
            source_version = f"{key}@{version_id}"
            for number, line in enumerate(data.splitlines(), start=1):
                if not line.strip():
                    continue
                where = f"{self.id}:{source_version} line {number}"
                record = parse_row(line, where)
                rows.add(str(record["id"]), record, source_version, where)  # id validated
        return rows.table()

    def check_readable(self, entry: SourceEntry) -> list[str]:
        problems = []
        for key, version_id, digest, size in self._pinned(entry):
            try:
                data = self.store.get(key, version_id)
            except NotFoundError:
                problems.append(f"{self.id}: {key}@{version_id} is gone")
                continue
            if len(data) != size or sha256_digest(data) != digest:
                problems.append(f"{self.id}: {key}@{version_id} no longer hashes to {digest}")
        return problems
