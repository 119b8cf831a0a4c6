"""Write a shard release: records from pinned sources -> parquet shards -> signed root.

Order of work (seed 000, "write to staging, then switch only the pointer"):

1. the snapshot must be APPROVED or ACTIVE and carry a signed approval (the gate's one approval
   rule, re-opened in a gate transaction); its signed manifest is opened;
2. every member's record is re-read from the pinned sources (selection re-run with
   content kept) and checked against the stored membership table: a member whose
   recomputed content digest, source version, source or split differs is refused, named
   by sampleId and digest (never by text);
3. records are ordered by ``SHA-256(lp(sortSeed) || lp(sampleId))`` and cut into shards
   by the recorded sharding function (record boundaries preserved);
4. each shard is written as parquet with pinned parameters, optionally encrypted, and
   staged under its digest (``shards/sha256/<hex>.parquet``) by conditional create:
   identical bytes are idempotent, different bytes under the key are an IntegrityError;
5. the root manifest (descriptors, watermarks, totals, tuple root recomputed from the
   shard records, writer parameters) is sealed, signed and stored, and the release row
   is inserted as STAGED.  Nothing here makes it visible to runs: that is the gate's job.
"""

from __future__ import annotations

import io
from collections import deque
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, replace

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from relgate_trust.digests import sha256_digest

from relgate.catalog.db import one
from relgate.catalog.release_table import insert_release
from relgate.catalog.snapshot_table import get_snapshot
from relgate.documents import release_root as rm
from relgate.documents import shard_format as rr
from relgate.documents import snapshot_manifest as sm
from relgate.documents.membership import COLUMNS as MEMBER_COLUMNS
from relgate.documents.membership import tuple_root
from relgate.documents.verified_bytes import verify_stored
from relgate.errors import IntegrityError, ObjectExistsError, RejectedError
from relgate.gate.transitions import open_gate
from relgate.holds.pins import publisher_lease, renew_lease
from relgate.integrity.contract import JsonObject
from relgate.integrity.hashing import sha256_fields
from relgate.integrity.tuples import encode_fields
from relgate.objects.layout import RELEASE_SHARD_PREFIX, release_shard_key
from relgate.objects.versioned import ObjectStore
from relgate.progress import track
from relgate.records.record_schema import ID_COLUMN
from relgate.records.tokens import TokenizerBytes
from relgate.records.values import canonical_column
from relgate.release import crypto
from relgate.snapshot import tokenizer
from relgate.snapshot.validate import recompute
from relgate.workspace import Workspace

SHARD_PREFIX = RELEASE_SHARD_PREFIX
#: A release is cut only from a snapshot a person approved (seed 002: approval is bound to
#: the digest); a VALIDATED nightly snapshot nobody approved cannot be released.
WRITABLE_SNAPSHOT_STATES = frozenset({"APPROVED", "ACTIVE"})
DEFAULT_SHARD_MB = 64
SORT_KEY_RULE = "sha256(len32be(sortSeed) sortSeed len32be(sampleId) sampleId)"
RECORD_BYTES_RULE = "sum of canonical byte lengths of the fields + 8"


@dataclass(frozen=True)
class ParquetParams:
    """Serializer parameters: recorded in the root so a shard can be re-written bit-exact."""

    codec: str = "zstd"
    level: int | None = 3
    row_group_records: int = 65_536
    dictionary_columns: tuple[str, ...] = ("sourceId", "sourceVersion", "split", "lang")

    def compression(self) -> rm.Compression:
        """As the root's ``writer.compression`` records it."""
        return rm.Compression(
            codec=self.codec,
            level=self.level,
            row_group_records=self.row_group_records,
            dictionary_columns=self.dictionary_columns,
            statistics=False,
            page_index=False,
        )

    def to_json(self) -> JsonObject:
        return self.compression().to_json()

    def for_format(self, fmt: rr.ShardFormat) -> ParquetParams:
        """These parameters with dictionary encoding only on columns the format has."""
        kept = tuple(c for c in self.dictionary_columns if c in fmt.columns)
        return replace(self, dictionary_columns=kept)


def shard_key(digest: str, *, encrypted: bool) -> str:
    """The key a shard's stored bytes are staged under (:mod:`relgate.objects.layout`)."""
    return release_shard_key(digest, encrypted=encrypted)


def serialize_shard(table: pa.Table, params: ParquetParams, fmt: rr.ShardFormat) -> bytes:
    schema = fmt.arrow_schema.with_metadata({rr.SCHEMA_METADATA_KEY: fmt.digest.encode()})
    sink = io.BytesIO()
    pq.write_table(
        table.cast(schema),
        sink,
        compression=params.codec,
        compression_level=params.level,
        row_group_size=params.row_group_records,
        use_dictionary=list(params.dictionary_columns),
        write_statistics=False,
        store_schema=True,
    )
    return sink.getvalue()


def stage_object(store: ObjectStore, key: str, data: bytes) -> str:
    """Conditional create; an existing key must hold exactly these bytes.  Returns version."""
    try:
        return store.create(key, data).version_id
    except ObjectExistsError:
        current = store.head(key)
        existing = store.get(key, current.version_id)
        if existing != data:
            raise IntegrityError(
                "a staged key holds different bytes than its digest names; refusing to overwrite",
                object=f"{key}@{current.version_id}",
                check="staged-bytes",
                digest=sha256_digest(data),
                details={"found": sha256_digest(existing)},
            ) from None
        return current.version_id


def _require_writable(state: str, digest: str) -> None:
    if state not in WRITABLE_SNAPSHOT_STATES:
        raise RejectedError(
            f"snapshot {digest} is {state}; a release is written only from an APPROVED or"
            " ACTIVE snapshot",
            object=f"snapshot {digest}",
            check="snapshot-state",
            digest=digest,
            details={"state": state, "allowed": sorted(WRITABLE_SNAPSHOT_STATES)},
        )


def member_records(ws: Workspace, manifest: sm.SnapshotManifest) -> pl.DataFrame:
    """Stored membership joined with each member's record re-read from the pinned sources."""
    stored = ws.membership.read(manifest.members_ref).select(MEMBER_COLUMNS)
    if stored["sampleId"].n_unique() != stored.height:
        raise IntegrityError(
            "membership table repeats a sampleId",
            object="snapshot membership",
            check="member-unique",
            digest=manifest.members_ref.digest,
        )
    fresh = recompute(ws, manifest, keep_content=True)
    joined = stored.join(fresh, on="sampleId", how="full", suffix="_re", coalesce=True)
    unread = joined.filter(pl.col("sourceId_re").is_null())
    if unread.height:
        raise RejectedError(
            f"{unread.height} members could not be re-read from the pinned sources",
            object=f"member {unread['sampleId'][0]}",
            check="member-readable",
            digest=str(unread["logicalContentDigest"][0]),
            details={"count": unread.height},
        )
    unexpected = joined.filter(pl.col("sourceId").is_null())
    if unexpected.height:
        raise RejectedError(
            f"{unexpected.height} records selected from the pinned sources are not members",
            object=f"member {unexpected['sampleId'][0]}",
            check="member-unexpected",
            digest=manifest.members_ref.digest,
            details={"count": unexpected.height},
        )
    for column, check in (
        ("logicalContentDigest", "member-content"),
        ("sourceVersion", "member-source-version"),
        ("sourceId", "member-source"),
        ("split", "member-split"),
    ):
        bad = joined.filter(pl.col(column) != pl.col(f"{column}_re"))
        if bad.height:
            first = bad.row(0, named=True)
            raise IntegrityError(
                f"{bad.height} members differ from the snapshot in {column}",
                object=f"member {first['sampleId']}",
                check=check,
                digest=str(first["logicalContentDigest"]),
                details={
                    "count": bad.height,
                    "recomputedContentDigest": str(first["logicalContentDigest_re"]),
                },
            )
    own = [c for c in manifest.record_schema_document.column_names if c != ID_COLUMN]
    return joined.select([*MEMBER_COLUMNS, *own])


def ordered(
    records: pl.DataFrame, sort_seed: str, fmt: rr.ShardFormat, fetch: TokenizerBytes | None
) -> pa.Table:
    """Records in release order: by SHA-256(lp(seed) || lp(sampleId)), then sampleId."""
    ids = records["sampleId"].to_arrow()
    keys = sha256_fields(ids, prefix=encode_fields([sort_seed]))
    key_col = pa.FixedSizeBinaryArray.from_buffers(
        pa.binary(32), len(records), [None, pa.py_buffer(keys)]
    )
    frame = records.with_columns(
        pl.from_arrow(pc.cast(key_col, pa.binary())).alias("__sortKey")  # type: ignore[union-attr]
    )
    frame = frame.sort(["__sortKey", "sampleId"]).drop("__sortKey")
    table = frame.to_arrow()
    columns = [table.column(c).combine_chunks() for c in fmt.columns if c != rr.TOKENS_COLUMN]
    base = pa.Table.from_arrays(columns, names=[c for c in fmt.columns if c != rr.TOKENS_COLUMN])
    tokens = fmt.token_counts(base, fetch)
    return pa.Table.from_arrays([*columns, tokens], schema=fmt.arrow_schema)


def sharding_function(shard_mb: int, records_per_shard: int | None) -> rm.ShardingFunction:
    if records_per_shard is not None:
        return rm.ShardingFunction(
            name="relgate.shard.cut.records.v1",
            rule="shard(i) = floor(i / recordsPerShard)",
            records_per_shard=records_per_shard,
        )
    return rm.ShardingFunction(
        name="relgate.shard.cut.bytes.v1",
        rule="shard(i) = rank of floor(bytesBefore(i) / targetBytes)",
        record_bytes=RECORD_BYTES_RULE,
        target_bytes=shard_mb * 1024 * 1024,
    )


def record_bytes(table: pa.Table, fmt: rr.ShardFormat) -> np.ndarray:
    """Per record, :data:`RECORD_BYTES_RULE`: the canonical byte lengths of its fields
    (the member-tuple strings and the record's own columns) plus 8."""
    sizes = np.full(table.num_rows, 8, dtype=np.int64)
    for name in rr.TUPLE_COLUMNS:
        sizes += pc.binary_length(table.column(name)).to_numpy().astype(np.int64)
    for spec in fmt.records.fields:
        if spec.name != ID_COLUMN:
            encoded = canonical_column(table.column(spec.name), spec)
            sizes += pc.binary_length(encoded).to_numpy().astype(np.int64)
    return sizes


def cut(table: pa.Table, function: rm.ShardingFunction, fmt: rr.ShardFormat) -> Iterator[pa.Table]:
    n = table.num_rows
    if n == 0:
        return
    if function.records_per_shard is not None:
        step = function.records_per_shard
        for lo in range(0, n, step):
            yield table.slice(lo, min(step, n - lo))
        return
    sizes = record_bytes(table, fmt)
    before = np.concatenate([[0], np.cumsum(sizes)[:-1]])
    bucket = before // int(function.target_bytes or 0)
    starts = np.flatnonzero(np.concatenate([[True], bucket[1:] != bucket[:-1]]))
    ends = np.append(starts[1:], n)
    for lo, hi in zip(starts.tolist(), ends.tolist(), strict=True):
        yield table.slice(lo, hi - lo)


@dataclass(frozen=True)
class WriteOptions:
    """How a release is written (every choice is recorded in the root's ``writer``)."""

    shard_mb: int = DEFAULT_SHARD_MB
    records_per_shard: int | None = None
    encrypt_key: bytes | None = None
    key_version: str | None = None
    sort_seed: str | None = None
    parquet: ParquetParams = ParquetParams()

    def validate(self) -> None:
        if self.shard_mb < 1 or (self.records_per_shard is not None and self.records_per_shard < 1):
            raise RejectedError(
                "shard size must be positive", object="writer", check="shard-size", digest=None
            )
        if (self.encrypt_key is None) != (self.key_version is None):
            raise RejectedError(
                "encryption needs both a key and its key version",
                object="writer",
                check="key-version",
            )


#: Adds a key to the writer's publisher lease (and renews it) before the key is staged.
Lease = Callable[[str], None]


def write_release(  # noqa: PLR0913 - the public keyword API; bundled into WriteOptions
    ws: Workspace,
    snapshot_digest: str,
    *,
    shard_mb: int = DEFAULT_SHARD_MB,
    records_per_shard: int | None = None,
    encrypt_key: bytes | None = None,
    key_version: str | None = None,
    sort_seed: str | None = None,
    parquet: ParquetParams | None = None,
    actor: str,
    lease_id: str | None = None,
    lease_ttl_seconds: int = 3600,
) -> rm.ReleaseManifest:
    """Stage shards and a signed root manifest for a snapshot; the release row is STAGED.

    Every key is added to a publisher lease (:mod:`relgate.holds.pins`), and the lease
    renewed, before it is staged, so garbage collection never deletes a staged or reused
    object under an in-progress publisher.  Without ``lease_id`` the writer acquires its
    own lease and releases it once the release row is committed (the row then retains
    the objects); with ``lease_id`` the caller's lease is used and left held.
    """
    options = WriteOptions(
        shard_mb=shard_mb,
        records_per_shard=records_per_shard,
        encrypt_key=encrypt_key,
        key_version=key_version,
        sort_seed=sort_seed,
        parquet=parquet or ParquetParams(),
    )
    if lease_id is not None:
        return _write(ws, snapshot_digest, options, actor, _lease(ws, lease_id, lease_ttl_seconds))
    with publisher_lease(
        ws, holder=f"release-writer:{actor}", ttl_seconds=lease_ttl_seconds
    ) as held:
        return _write(
            ws, snapshot_digest, options, actor, _lease(ws, held.lease_id, lease_ttl_seconds)
        )


def _lease(ws: Workspace, lease_id: str, ttl_seconds: int) -> Lease:
    def lease(key: str) -> None:
        renew_lease(ws, lease_id, ttl_seconds=ttl_seconds, keys=[key])

    return lease


@dataclass
class _Staged:
    """The shards staged so far: their descriptors, member tuples and totals."""

    descriptors: list[rm.ShardDescriptor]
    tuples: list[pa.Table]

    def totals(self) -> rm.ReleaseTotals:
        return rm.ReleaseTotals(
            shards=len(self.descriptors),
            records=sum(d.records for d in self.descriptors),
            tokens=sum(d.tokens for d in self.descriptors),
            bytes=sum(d.size for d in self.descriptors),
        )


def _write(
    ws: Workspace, snapshot_digest: str, options: WriteOptions, actor: str, lease: Lease
) -> rm.ReleaseManifest:
    options.validate()
    row = get_snapshot(ws.db, snapshot_digest)
    _require_writable(str(row.state), snapshot_digest)
    with ws.db.gate_tx() as conn:  # the state says approved; the signed approval must too
        open_gate(ws).require_approved(conn, "snapshot", snapshot_digest)
    snap = sm.load(ws.store, ws.trusted_keys, snapshot_digest, row.envelope_version)
    seed = options.sort_seed if options.sort_seed is not None else snapshot_digest
    function = sharding_function(options.shard_mb, options.records_per_shard)
    fmt = rr.ShardFormat(snap.record_schema_document)
    options = replace(options, parquet=options.parquet.for_format(fmt))
    records = ordered(member_records(ws, snap), seed, fmt, tokenizer.fetcher(ws, snap))
    pieces = list(cut(records, function, fmt))
    staged = _Staged([], [])
    encoded_shards = _encoded(snap, fmt, options, pieces)
    for encoded in track(encoded_shards, "write shards", total=len(pieces)):
        _stage_shard(ws, lease, staged, encoded)
    root = _reproduced_tuple_root(staged, snap)
    body = rm.ReleaseRoot(
        dataset_snapshot=snapshot_digest,
        tombstone_watermark=snap.tombstone_watermark,
        benchmark_fence=snap.benchmark_fence,
        record_schema=fmt.digest,
        record_schema_document=fmt.document,
        member_schema=snap.record_schema,
        shards=tuple(staged.descriptors),
        totals=staged.totals(),
        ordered_member_tuple_root=root,
        writer=_writer_params(options, seed, function),
    )
    return _commit_root(ws, rm.seal(body), snap, actor, lease)


#: Shards serialized (and hashed) at once: compression, encryption and hashing release the
#: GIL, so this many cores work on shards while the shards before them are staged in order.
ENCODE_THREADS = 2


@dataclass(frozen=True)
class _Encoded:
    """One shard's stored bytes and the descriptor fields computed from its records."""

    piece: pa.Table
    data: bytes
    encrypted: bool
    descriptor: rm.ShardDescriptor


def _encoded(
    snap: sm.SnapshotManifest, fmt: rr.ShardFormat, options: WriteOptions, pieces: list[pa.Table]
) -> Iterator[_Encoded]:
    """Every piece encoded, in order, ``ENCODE_THREADS`` at a time (bounded look-ahead)."""
    total = len(pieces)
    with ThreadPoolExecutor(max_workers=ENCODE_THREADS) as pool:
        pending: deque[Future[_Encoded]] = deque()
        for index, piece in enumerate(pieces):
            pending.append(pool.submit(_encode_shard, snap, fmt, options, (index, total, piece)))
            if len(pending) > ENCODE_THREADS:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _encode_shard(
    snap: sm.SnapshotManifest,
    fmt: rr.ShardFormat,
    options: WriteOptions,
    piece_at: tuple[int, int, pa.Table],
) -> _Encoded:
    """Serialize (and encrypt) one piece and describe it; the version is filled at staging.

    The logical digest takes each record's content digest from the ``logicalContentDigest``
    column: :func:`member_records` has proven it equal, row by row, to the digest
    recomputed from the re-read content, so the content is not hashed a second time here.
    """
    index, total, piece = piece_at
    sid = rr.shard_id(index, total)
    data = serialize_shard(piece, options.parquet, fmt)
    logical = fmt.logical_digest(piece, piece.column("logicalContentDigest"))
    encrypted = options.encrypt_key is not None
    if options.encrypt_key is not None and options.key_version is not None:
        aad = crypto.shard_aad(
            snapshot=snap.digest,
            shard=sid,
            logical_digest=logical,
            record_schema=fmt.digest,
            key_version=options.key_version,
        )
        data = crypto.encrypt_shard(data, options.encrypt_key, aad, key_version=options.key_version)
    descriptor = rm.ShardDescriptor(
        id=sid,
        media_type=rm.ENCRYPTED_SHARD_MEDIA_TYPE if encrypted else rm.SHARD_MEDIA_TYPE,
        digest=sha256_digest(data),
        size=len(data),
        object_version="",
        logical_digest=logical,
        records=piece.num_rows,
        tokens=int(pc.sum(piece.column("tokens")).as_py() or 0),
        member_set_digest=rr.member_set_digest(piece, snap.record_schema),
    )
    return _Encoded(piece, data, encrypted, descriptor)


def _stage_shard(ws: Workspace, lease: Lease, staged: _Staged, encoded: _Encoded) -> None:
    """Stage one encoded shard under its digest (leased first) and record its descriptor."""
    key = shard_key(encoded.descriptor.storage_digest, encrypted=encoded.encrypted)
    lease(key)
    version = stage_object(ws.store, key, encoded.data)
    staged.descriptors.append(encoded.descriptor.model_copy(update={"object_version": version}))
    staged.tuples.append(encoded.piece.select(list(rr.TUPLE_COLUMNS)))


def _reproduced_tuple_root(staged: _Staged, snap: sm.SnapshotManifest) -> str:
    """The root is recomputed from what went into the shards, never copied from the
    snapshot; it must come out equal because it is over the same tuple set."""
    if staged.tuples:
        members = pa.concat_tables(staged.tuples)
        members = members.take(pc.sort_indices(members, [("sampleId", "ascending")]))
    else:
        members = pa.table({c: pa.array([], pa.string()) for c in rr.TUPLE_COLUMNS})
    root = tuple_root(members, snap.record_schema)
    if root != snap.tuple_root:
        raise IntegrityError(
            "shard records do not reproduce the snapshot's tuple root",
            object="release",
            check="ordered-member-tuple-root",
            digest=snap.tuple_root,
            details={"recomputed": root},
        )
    return root


def _writer_params(
    options: WriteOptions, seed: str, function: rm.ShardingFunction
) -> rm.WriterParams:
    return rm.WriterParams(
        serializer=rm.Serializer(
            format="parquet", library="pyarrow", version=pa.__version__, stream=rr.STREAM_NAME
        ),
        sort_seed=seed,
        sort_key=SORT_KEY_RULE,
        sharding_function=function,
        compression=options.parquet.compression(),
        key_version=options.key_version,
        encryption=rm.Encryption(
            algorithm=crypto.ALGORITHM,
            aad="relgate.shard.aad.v1",
            nonce="random 96-bit, stored before the ciphertext",
        )
        if options.encrypt_key is not None
        else None,
    )


def _commit_root(
    ws: Workspace,
    release: rm.ReleaseManifest,
    snap: sm.SnapshotManifest,
    actor: str,
    lease: Lease,
) -> rm.ReleaseManifest:
    """Sign and store the root (idempotent), then insert the release row as STAGED."""
    envelope = rm.sign(release, ws.signing_key)
    try:
        lease(rm.envelope_key(release.digest))
        envelope_version = rm.store_envelope(ws.store, release, envelope)
    except ObjectExistsError:
        # The same snapshot written with the same parameters yields the same root.
        current = ws.store.head(rm.envelope_key(release.digest))
        rm.load(ws.store, ws.trusted_keys, release.digest, current.version_id)
        envelope_version = current.version_id
    verified = verify_stored(ws.store, ws.trusted_keys, "release", release.digest, envelope_version)
    with ws.db.tx() as conn:
        if one(conn, "SELECT digest FROM releases WHERE digest = :d", {"d": release.digest}):
            return release
        insert_release(
            conn,
            release,
            members_digest=snap.members_ref.digest,
            members_version=snap.members_ref.version_id,
            envelope_version=envelope_version,
            actor=actor,
            verified=verified,
        )
    return release
