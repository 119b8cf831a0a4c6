"""Membership tables: one row per member, sorted by sampleId, stored as parquet in CAS.

Columns: sampleId, sourceId, sourceVersion, logicalContentDigest, split.  No sample text
ever goes into a membership table or a manifest.
"""

from __future__ import annotations

import hashlib
import io
import os
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq

from relgate.errors import IntegrityError
from relgate.integrity.digests import hex_of
from relgate.integrity.hashing import length_prefixed, merkle_root_rows
from relgate.objects.cas import ContentRef, ContentStore
from relgate.objects.layout import membership_key

MEMBERSHIP_SCHEMA = pa.schema(
    [
        ("sampleId", pa.string()),
        ("sourceId", pa.string()),
        ("sourceVersion", pa.string()),
        ("logicalContentDigest", pa.string()),
        ("split", pa.string()),
    ]
)
COLUMNS = MEMBERSHIP_SCHEMA.names


def membership_parquet(table: pa.Table) -> bytes:
    """Deterministic parquet bytes for a membership table (already sorted by sampleId)."""
    sink = io.BytesIO()
    pq.write_table(
        table.select(COLUMNS).cast(MEMBERSHIP_SCHEMA),
        sink,
        compression="zstd",
        compression_level=3,
        row_group_size=262_144,
        write_statistics=True,
        store_schema=False,
    )
    return sink.getvalue()


def tuple_encoding(table: pa.Table | pl.DataFrame, schema_digest: str) -> pa.Array:
    if isinstance(table, pl.DataFrame):
        table = table.to_arrow()
    schema_col = pa.array([schema_digest] * table.num_rows, pa.string())
    return length_prefixed(*(table.column(c) for c in COLUMNS), schema_col)


def tuple_root(table: pa.Table | pl.DataFrame, schema_digest: str) -> str:
    return "sha256:" + merkle_root_rows(tuple_encoding(table, schema_digest)).hex()


@dataclass
class MembershipCache:
    """Local, digest-verified copies of membership tables for polars to scan."""

    cas: ContentStore
    cache_dir: Path

    def path(self, digest: str, version_id: str) -> Path:
        target = self.cache_dir / hex_of(digest)
        if target.exists():
            return target
        store = self.cas.store
        local = getattr(store, "local_path", None)
        self.cache_dir.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=self.cache_dir, prefix=".part-")
        os.close(fd)
        try:
            if local is not None:
                shutil.copyfile(local(membership_key(digest), version_id), tmp)
            else:
                Path(tmp).write_bytes(store.get(membership_key(digest), version_id))
            actual = _file_digest(Path(tmp))
            if actual != digest:
                raise IntegrityError(
                    "membership table bytes do not match their digest",
                    object=f"{membership_key(digest)}@{version_id}",
                    check="storage-digest",
                    digest=digest,
                    details={"actual": actual},
                )
            os.replace(tmp, target)
        finally:
            if os.path.exists(tmp):
                os.unlink(tmp)
        return target

    def scan(self, ref: ContentRef) -> pl.LazyFrame:
        return pl.scan_parquet(self.path(ref.digest, ref.version_id))

    def read(self, ref: ContentRef) -> pl.DataFrame:
        path = self.path(ref.digest, ref.version_id)
        try:
            return pl.read_parquet(path)
        except Exception as exc:  # a parquet that hashes right but does not decode
            raise IntegrityError(
                f"membership table does not decode: {type(exc).__name__}",
                object=ref.uri,
                check="membership-decode",
                digest=ref.digest,
            ) from None


def _file_digest(path: Path) -> str:
    with open(path, "rb") as fh:
        return "sha256:" + hashlib.file_digest(fh, "sha256").hexdigest()


def put_membership(cas: ContentStore, table: pa.Table) -> ContentRef:
    data = membership_parquet(table)
    return cas.put(data)


__all__ = [
    "COLUMNS",
    "MEMBERSHIP_SCHEMA",
    "MembershipCache",
    "membership_parquet",
    "put_membership",
    "tuple_encoding",
    "tuple_root",
]
