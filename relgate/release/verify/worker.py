"""The per-shard verification worker: every check of one shard, from its exact version.

Runs in a separate process (or a thread) per shard (:func:`run_shards`), passed everything
by value (:class:`ShardTask`): size, storage digest, optional AES-256-GCM decryption, parquet
footer, record schema, decode of every record, content digest of every record recomputed
from its text, token recount, logical digest, record and token counts, member-set digest.
It never raises on bad data: every finding is a :class:`~relgate.release.verify.checks.Check`
counted in the :class:`ShardResult`.
"""

from __future__ import annotations

import hashlib
import multiprocessing as mp
import os
import time
from collections.abc import Mapping
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import cached_property

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from relgate.documents import shard_format as rr
from relgate.documents.shard_descriptor import (
    ENCRYPTED_SHARD_MEDIA_TYPE,
    SHARD_MEDIA_TYPE,
    ShardDescriptor,
)
from relgate.errors import IntegrityError, NotFoundError, RejectedError, RelgateError
from relgate.integrity.contract import JsonObject, JsonValue
from relgate.objects.versioned import SIZE_MISMATCH, ObjectStore
from relgate.progress import track
from relgate.records.record_schema import RecordSchema
from relgate.release import crypto
from relgate.release.verify.checks import Check
from relgate.workspace import build_object_store


@dataclass(frozen=True)
class ShardTask:
    """Everything a worker needs, passed by value: no writer state, no shared handles."""

    store_config: JsonObject
    descriptor: ShardDescriptor
    snapshot: str
    records: RecordSchema
    member_schema: str
    key_version: str | None
    key: bytes | None = None
    #: the pinned tokenizer's JSON bytes, when the record schema counts with one
    tokenizer: bytes | None = None

    @cached_property
    def fmt(self) -> rr.ShardFormat:
        return rr.ShardFormat(self.records)

    @property
    def record_schema(self) -> str:
        """The shard schema digest every shard footer must declare."""
        return self.fmt.digest

    def fetch_tokenizer(self, digest: str) -> bytes:
        if self.tokenizer is None:
            raise NotFoundError(
                "no tokenizer was handed over", object="tokenizer", check="tokenizer-digest"
            )
        return self.tokenizer

    def __post_init__(self) -> None:
        # Callers that hold a descriptor as signed (a wire object) hand it over as is.
        if isinstance(self.descriptor, Mapping):
            object.__setattr__(self, "descriptor", ShardDescriptor.parse(self.descriptor))


@dataclass
class ShardResult:
    """What one worker found in one shard (mutable while the worker runs)."""

    id: str
    digest: str
    object_version: str
    failures: list[JsonObject] = field(default_factory=list)
    records: int = 0
    tokens: int = 0
    bytes: int = 0
    stored_content_mismatches: int = 0
    schema_seen: str | None = None
    tuples: pa.Table | None = None
    decrypted: bool = False
    decoded_bytes: int = 0
    read_seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return not self.failures

    @property
    def read_micros(self) -> int:
        """Time spent reading the stored bytes, in whole microseconds (as reported)."""
        return int(self.read_seconds * 1_000_000)

    @property
    def failed_checks(self) -> set[str]:
        return {str(f["check"]) for f in self.failures}

    def fail(self, check: Check, message: str, **details: JsonValue) -> None:
        self.failures.append({"check": check.value, "message": message, **details})

    def to_json(self) -> JsonObject:
        """The shard's entry in the verification report."""
        return {
            "id": self.id,
            "digest": self.digest,
            "objectVersion": self.object_version,
            "ok": self.ok,
            "records": self.records,
            "tokens": self.tokens,
            "bytes": self.bytes,
            "storedContentDigestMismatches": self.stored_content_mismatches,
            "recordSchema": self.schema_seen,
            "decodedBytes": self.decoded_bytes,
            "readMicros": self.read_micros,
            "failures": list(self.failures),
        }

    def adopt(self, body: ShardResult) -> None:
        """Take over what the decode found (once the stored bytes proved to be vouched)."""
        self.failures.extend(body.failures)
        self.records, self.tokens = body.records, body.tokens
        self.stored_content_mismatches = body.stored_content_mismatches
        self.schema_seen, self.tuples = body.schema_seen, body.tuples
        self.decrypted, self.decoded_bytes = body.decrypted, body.decoded_bytes


def sha256_of(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _read_exact(task: ShardTask, result: ShardResult) -> bytes | None:
    """The bytes of the exact pinned version (the verifier keeps no cache of its own)."""
    d = task.descriptor
    key = d.object_key
    store: ObjectStore = build_object_store(task.store_config)
    try:
        # Bounded by the size the signed descriptor records: a larger object is refused
        # from its stat (or response headers) before a byte of it is read or parsed.
        return store.get(key, d.object_version, max_size=d.size)
    except IntegrityError as exc:
        if exc.check != SIZE_MISMATCH:
            raise  # the store saw bytes that do not match what it stored: not an outage
        result.fail(
            Check.SIZE_MISMATCH,
            "stored object is larger than the descriptor's size; not read",
            actual=int(exc.details.get("actual", 0)),
            key=key,
        )
        return None
    except NotFoundError:
        result.fail(Check.OBJECT_UNAVAILABLE, "pinned object version is not in the store", key=key)
        return None
    except RejectedError:
        raise  # the store saw bytes that do not match what it stored: not an outage
    except Exception as exc:  # unreadable: permissions, network, throttling
        result.fail(
            Check.OBJECT_UNAVAILABLE,
            f"pinned object version could not be read: {type(exc).__name__}",
            key=key,
        )
        return None


def verify_shard(task: ShardTask) -> ShardResult:
    """Every per-shard check, from the exact object version; never raises on bad data."""
    d = task.descriptor
    result = ShardResult(d.id, d.storage_digest, d.object_version)
    started = time.perf_counter()
    data = _read_exact(task, result)
    result.read_seconds = time.perf_counter() - started
    if data is None:
        return result
    result.bytes = len(data)
    if len(data) != d.size:
        result.fail(Check.SIZE_MISMATCH, "stored size differs from descriptor", actual=len(data))
    body = ShardResult(result.id, result.digest, result.object_version)
    with ThreadPoolExecutor(max_workers=2) as pool:
        # The storage digest runs beside the decode (hashlib and pyarrow release the GIL);
        # nothing decoded is reported unless the stored bytes are the vouched ones.
        storage = pool.submit(sha256_of, data)
        _decode_and_check(task, body, data, pool)
        actual = storage.result()
    if actual != d.storage_digest:
        result.fail(
            Check.STORAGE_DIGEST_MISMATCH,
            "stored bytes do not hash to descriptor digest",
            actual=actual,
        )
        return result
    result.adopt(body)
    return result


def _plaintext(task: ShardTask, result: ShardResult, data: bytes) -> bytes | None:
    """The parquet bytes of a shard: decrypted when its media type says so."""
    d = task.descriptor
    if d.media_type == ENCRYPTED_SHARD_MEDIA_TYPE:
        if task.key is None or task.key_version is None:
            result.fail(
                Check.KEY_UNAVAILABLE,
                "no key for this key version: this reader cannot open the shard",
                keyVersion=task.key_version,
            )
            return None
        aad = crypto.shard_aad(
            snapshot=task.snapshot,
            shard=d.id,
            logical_digest=d.logical_digest,
            record_schema=task.record_schema,
            key_version=task.key_version,
        )
        try:
            plain = crypto.decrypt_shard(
                data,
                task.key,
                aad,
                key_version=task.key_version,
                shard=result.id,
                digest=d.storage_digest,
            )
        except RelgateError as exc:
            result.fail(Check.DECRYPT_FAILURES, exc.message, failedCheck=exc.check)
            return None
        result.decrypted = True
        return plain
    if d.media_type != SHARD_MEDIA_TYPE:
        result.fail(Check.FOOTER_UNREADABLE, "unknown media type", mediaType=d.media_type)
        return None
    return data


def _decoded_table(task: ShardTask, result: ShardResult, data: bytes) -> pa.Table | None:
    """Footer, declared record schema and every record decoded, or the finding why not."""
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
        kv = parquet.metadata.metadata or {}
    except (OSError, ValueError, pa.ArrowException) as exc:  # hostile bytes: a finding
        result.fail(Check.FOOTER_UNREADABLE, f"parquet footer does not parse: {type(exc).__name__}")
        return None
    declared = kv.get(rr.SCHEMA_METADATA_KEY, b"").decode("utf-8", "replace")
    result.schema_seen = declared or None
    try:
        table = parquet.read()
        # Parquet decoding checks structure, not values: a string column may carry bytes
        # that are not UTF-8, which every later step would trip over.  Full validation
        # proves every value well formed before anything reads one.
        table.validate(full=True)
    except (OSError, ValueError, pa.ArrowException) as exc:  # hostile bytes: a finding
        result.fail(Check.DECODE_FAILURES, f"records do not decode: {type(exc).__name__}")
        return None
    schema = table.schema.remove_metadata()
    if declared != task.record_schema or not schema.equals(task.fmt.arrow_schema):
        result.fail(
            Check.RECORD_SCHEMA_MISMATCH,
            "shard's record schema is not the root's",
            declared=declared or None,
            columns=list(schema.names),
        )
        return None
    return table.combine_chunks()


def _decode_and_check(
    task: ShardTask, result: ShardResult, data: bytes, pool: ThreadPoolExecutor
) -> None:
    plain = _plaintext(task, result, data)
    if plain is None:
        return
    table = _decoded_table(task, result, plain)
    if table is None:
        return
    d = task.descriptor
    result.records = table.num_rows
    result.decoded_bytes = int(table.nbytes)
    fmt = task.fmt
    fetch = task.fetch_tokenizer if task.tokenizer is not None else None
    recount_future = pool.submit(fmt.token_counts, table, fetch)
    content = fmt.content_digests(table)
    result.stored_content_mismatches = int(
        pc.sum(
            pc.cast(pc.not_equal(content, table.column("logicalContentDigest")), pa.int64())
        ).as_py()
        or 0
    )
    recount = recount_future.result()
    result.tokens = int(pc.sum(table.column("tokens")).as_py() or 0)
    if not recount.equals(table.column("tokens").chunk(0) if table.num_rows else recount):
        result.fail(Check.TOKEN_COUNT_MISMATCH, "a record's token count is not its recount")
    elif result.tokens != d.tokens:
        result.fail(
            Check.TOKEN_COUNT_MISMATCH, "token total differs from descriptor", actual=result.tokens
        )
    if table.num_rows != d.records:
        result.fail(
            Check.RECORD_COUNT_MISMATCH,
            "record count differs from descriptor",
            actual=table.num_rows,
        )
    logical = fmt.logical_digest(table, content)
    if logical != d.logical_digest:
        result.fail(Check.LOGICAL_DIGEST_MISMATCH, "decoded record stream differs", actual=logical)
    members = rr.member_set_digest(table, task.member_schema, content)
    if members != d.member_set_digest:
        result.fail(Check.MEMBER_SET_DIGEST_MISMATCH, "shard's member set differs", actual=members)
    # The tuple carries the content digest recomputed from the decoded content, not the column.
    result.tuples = pa.table(
        {
            "sampleId": table.column("sampleId"),
            "sourceId": table.column("sourceId"),
            "sourceVersion": table.column("sourceVersion"),
            "logicalContentDigest": content,
            "split": table.column("split"),
        }
    )


def _worker_init() -> None:
    # One shard per worker process: nested hashing pools would only oversubscribe.
    os.environ["RELGATE_HASH_WORKERS"] = "1"


#: How :func:`run_shards` runs its workers: separate processes (started with ``spawn``,
#: never forked from this possibly threaded process) or threads of this process (the
#: heavy work, hashlib over whole buffers, pyarrow and the hashing kernel, releases the GIL).
PROCESS, THREAD = "process", "thread"


def run_shards(tasks: list[ShardTask], workers: int, *, mode: str = PROCESS) -> list[ShardResult]:
    """Verify shards in ``workers`` workers, results in task order (0: in this thread)."""
    what, total = "verify shards", len(tasks)
    if workers <= 0 or not tasks:
        return list(track(map(verify_shard, tasks), what, total))
    count = min(workers, len(tasks))
    if mode == THREAD:
        with ThreadPoolExecutor(max_workers=count) as threads:
            return list(track(threads.map(verify_shard, tasks), what, total))
    ctx = mp.get_context("spawn")
    with ProcessPoolExecutor(max_workers=count, mp_context=ctx, initializer=_worker_init) as pool:
        return list(track(pool.map(verify_shard, tasks), what, total))
