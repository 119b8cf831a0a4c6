"""Membership tables: one row per member, sorted by sampleId, stored as parquet in CAS.

Columns: sampleId, sourceId, sourceVersion, logicalContentDigest, split.  No sample text
ever goes into a membership table or a manifest.
"""

from __future__ import annotations

import io
import logging
import os
import shutil
import stat
from collections.abc import Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import pyarrow as pa
import pyarrow.parquet as pq
from relgate_trust.digests import file_sha256_digest

from relgate.errors import IntegrityError
from relgate.integrity.digests import hex_of
from relgate.integrity.hashing import length_prefixed, sha256_fields
from relgate.integrity.merkle import MerkleAccumulator, root_from_packed_leaves
from relgate.objects.cas import ContentRef, ContentStore
from relgate.records.values import constant_column

if TYPE_CHECKING:  # polars loads when a table is scanned or read, not at CLI start-up
    import polars as pl

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
_log = logging.getLogger(__name__)


#: Rows per parquet row group of a membership table (part of its byte format).
ROW_GROUP_ROWS = 262_144
_PARQUET_OPTIONS: dict[str, object] = {
    "compression": "zstd",
    "compression_level": 3,
    "write_statistics": True,
    "store_schema": False,
}


def _membership_table(table: pa.Table | pl.DataFrame) -> pa.Table:
    if not isinstance(table, pa.Table):  # a polars DataFrame
        table = table.to_arrow()
    return table.select(COLUMNS).cast(MEMBERSHIP_SCHEMA)


def membership_parquet(table: pa.Table) -> bytes:
    """Deterministic parquet bytes for a membership table (already sorted by sampleId)."""
    sink = io.BytesIO()
    pq.write_table(
        _membership_table(table), sink, row_group_size=ROW_GROUP_ROWS, **_PARQUET_OPTIONS
    )
    return sink.getvalue()


class MembershipWriter:
    """The bytes of :func:`membership_parquet`, written from sorted chunks in order: rows
    are held until a full row group is there, so the row groups are the same."""

    def __init__(self, path: Path) -> None:
        self._writer = pq.ParquetWriter(path, MEMBERSHIP_SCHEMA, **_PARQUET_OPTIONS)
        self._held: list[pa.Table] = []
        self._rows = 0
        self._written = False
        # One row group is encoded on a thread (pyarrow releases the GIL) while the caller
        # hashes the next chunk; one worker keeps the groups in order.
        self._pool = ThreadPoolExecutor(max_workers=1)
        self._encoding: Future[None] | None = None

    def write(self, chunk: pa.Table | pl.DataFrame) -> None:
        table = _membership_table(chunk)
        self._held.append(table)
        self._rows += table.num_rows
        if self._rows >= ROW_GROUP_ROWS:
            held = pa.concat_tables(self._held)
            full = self._rows // ROW_GROUP_ROWS * ROW_GROUP_ROWS
            for start in range(0, full, ROW_GROUP_ROWS):
                self._group(held.slice(start, ROW_GROUP_ROWS))
            self._held, self._rows = [held.slice(full)], self._rows - full

    def _group(self, table: pa.Table) -> None:
        self._written = True
        self._wait()
        self._encoding = self._pool.submit(
            self._writer.write_table, table.combine_chunks(), row_group_size=ROW_GROUP_ROWS
        )

    def _wait(self) -> None:
        if self._encoding is not None:
            self._encoding.result()
            self._encoding = None

    def close(self) -> None:
        """The last, partial row group (an empty table writes one empty group, as
        :func:`membership_parquet` does), then the footer."""
        if self._rows or not self._written:
            self._group(
                pa.concat_tables(self._held) if self._held else MEMBERSHIP_SCHEMA.empty_table()
            )
        self._held, self._rows = [], 0
        try:
            self._wait()
        finally:
            self._pool.shutdown()
            self._writer.close()


def tuple_encoding(table: pa.Table | pl.DataFrame, schema_digest: str) -> pa.Array:
    if not isinstance(table, pa.Table):  # a polars DataFrame
        table = table.to_arrow()
    schema_col = constant_column(schema_digest, table.num_rows)
    return length_prefixed(*(table.column(c) for c in COLUMNS), schema_col)


def tuple_leaves(table: pa.Table | pl.DataFrame, schema_digest: str) -> bytes:
    """RFC 6962 leaf hashes ``SHA-256(0x00 || tuple)`` of every row, packed (the fused
    kernel: the same bytes as hashing :func:`tuple_encoding`'s rows)."""
    if not isinstance(table, pa.Table):  # a polars DataFrame
        table = table.to_arrow()
    schema_col = constant_column(schema_digest, table.num_rows)
    return sha256_fields(*(table.column(c) for c in COLUMNS), schema_col, prefix=b"\x00")


def tuple_root(table: pa.Table | pl.DataFrame, schema_digest: str) -> str:
    return "sha256:" + root_from_packed_leaves(tuple_leaves(table, schema_digest)).hex()


class Tally:
    """What a membership table sums to, from its chunks in order: rows, tuple root, and
    the counts by split and by source."""

    def __init__(self, schema_digest: str) -> None:
        self.schema_digest = schema_digest
        self.rows = 0
        self._merkle = MerkleAccumulator()
        self._splits: dict[str, int] = {}
        self._sources: dict[str, int] = {}

    def add(self, chunk: pl.DataFrame) -> None:
        if not chunk.height:
            return
        self.rows += chunk.height
        self._merkle.add_packed_leaf_hashes(tuple_leaves(chunk, self.schema_digest))
        for counts, column in ((self._splits, "split"), (self._sources, "sourceId")):
            for key, n in chunk.group_by(column).len().iter_rows():
                counts[key] = counts.get(key, 0) + n

    @property
    def tuple_root(self) -> str:
        return "sha256:" + self._merkle.root().hex()

    @property
    def splits(self) -> dict[str, int]:
        return dict(sorted(self._splits.items()))

    @property
    def by_source(self) -> dict[str, int]:
        return dict(sorted(self._sources.items()))


@dataclass
class MembershipCache:
    """Local copies of membership tables for polars to scan: only a cache.

    A cached copy is re-hashed against its digest whenever it is read (a copy already
    verified in this process is recognised by its inode, size and times); one that does
    not match is discarded and rebuilt from the exact stored version, and that is never
    a finding against the snapshot.  ``path(ref, from_store=True)`` (what validation and
    reuse call) always re-reads and hashes the stored version itself: a stored object
    that fails its digest is refused (``storage-digest``, naming key, version, expected
    and actual), whatever the cache holds.
    """

    cas: ContentStore
    cache_dir: Path
    _verified: dict[Path, tuple[int, int, int, int]] = field(default_factory=dict, repr=False)

    def path(self, ref: ContentRef, *, from_store: bool = False) -> Path:
        target = self.cache_dir / hex_of(ref.digest)
        if not from_store and self._cached(target, ref.digest):
            return target
        self._verified.pop(target, None)
        # Bounded by the size the signed manifest records (0: a catalog row's ref, unsized).
        self.cas.fetch_to(ref.digest, ref.version_id, target, size=ref.size or None)
        self._remember(target)
        return target

    def _remember(self, target: Path) -> None:
        st = os.stat(target, follow_symlinks=False)
        self._verified[target] = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)

    def _cached(self, target: Path, digest: str) -> bool:
        """Whether the cached copy is there and hashes to ``digest`` (a cache fault is
        discarded here, to be rebuilt: never reported against the snapshot)."""
        try:
            st = os.stat(target, follow_symlinks=False)
        except FileNotFoundError:
            return False
        if self._verified.get(target) == (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns):
            return True
        if stat.S_ISREG(st.st_mode) and _file_digest(target) == digest:
            self._remember(target)
            return True
        _log.warning(
            "membership cache %s does not hash to %s; rebuilt from the store", target, digest
        )
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(target, ignore_errors=True)
        else:
            target.unlink(missing_ok=True)
        return False

    def scan(self, ref: ContentRef) -> pl.LazyFrame:
        import polars as pl  # noqa: PLC0415 - see the TYPE_CHECKING import

        return pl.scan_parquet(self.path(ref))

    def frames(self, ref: ContentRef, rows: int = 65_536) -> Iterator[pl.DataFrame]:
        """The table's membership columns in chunks of ``rows``, in stored order."""
        import polars as pl  # noqa: PLC0415 - see the TYPE_CHECKING import

        path = self.path(ref)
        try:
            for batch in pq.ParquetFile(path).iter_batches(batch_size=rows, columns=COLUMNS):
                frame = pl.from_arrow(batch)
                if isinstance(frame, pl.DataFrame):
                    yield frame
        except _decode_errors() as exc:
            raise _undecodable(ref, exc) from None

    def read(self, ref: ContentRef) -> pl.DataFrame:
        import polars as pl  # noqa: PLC0415 - see the TYPE_CHECKING import

        path = self.path(ref)
        try:
            return pl.read_parquet(path)
        except _decode_errors() as exc:  # a parquet that hashes right but does not decode
            raise _undecodable(ref, exc) from None


def _decode_errors() -> tuple[type[Exception], ...]:
    """What reading hostile parquet bytes raises (pyarrow's and polars' own errors, I/O);
    only called where polars is loaded already."""
    import polars as pl  # noqa: PLC0415 - see the TYPE_CHECKING import

    return (OSError, ValueError, pa.ArrowException, pl.exceptions.PolarsError)


def _undecodable(ref: ContentRef, exc: Exception) -> IntegrityError:
    return IntegrityError(
        f"membership table does not decode: {type(exc).__name__}",
        object=ref.uri,
        check="membership-decode",
        digest=ref.digest,
    )


def _file_digest(path: Path) -> str:
    with open(path, "rb") as fh:
        return file_sha256_digest(fh)


def put_membership(cas: ContentStore, table: pa.Table) -> ContentRef:
    data = membership_parquet(table)
    return cas.put(data)


__all__ = [
    "COLUMNS",
    "MEMBERSHIP_SCHEMA",
    "MembershipCache",
    "MembershipWriter",
    "Tally",
    "membership_parquet",
    "put_membership",
    "tuple_encoding",
    "tuple_root",
]
