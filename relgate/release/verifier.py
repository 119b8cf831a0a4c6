"""The independent verifier of a shard release.

A separate code path from the writer: it trusts nothing the writer computed except what
the signed root manifest states, and shares only the record-stream definition
(:mod:`relgate.release.stream`).  It never lists a prefix: every object is read by the
key its descriptor's digest names and the exact ``objectVersion`` the descriptor pins.

Per shard (in worker processes, one shard per task): size, storage digest, optional
AES-256-GCM decryption, parquet footer, record schema, decode of every record, content
digest of every record recomputed from its text, token recount, logical digest, record
and token counts, member-set digest.  Then, over the whole release: the tuple multiset
built from the decoded records is diffed in full against the snapshot's membership table
(missing, extra, duplicate, content substitution, sourceVersion substitution, split
conflicts), the ``orderedMemberTupleRoot`` is recomputed, totals and watermarks are
checked.  The ``relgate.release.verification.v1`` report is signed (DSSE) and stored
content-addressed, bound to the root digest, together with an in-toto/SLSA provenance
statement; the release moves STAGED -> VERIFIED when every count is zero, else INVALID.

``python -m relgate.release.verifier --home H --root D [--shard ID ...] [--workers N]``
verifies a release (or only the named shards, without a state change) and prints JSON.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import multiprocessing as mp
import os
import re
import sys
import time
import traceback
from collections.abc import Iterable, Mapping
from concurrent.futures import ProcessPoolExecutor, ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from botocore.exceptions import BotoCoreError

from relgate.catalog.audit import record_report
from relgate.catalog.release_table import get_release, record_attempt
from relgate.catalog.snapshot_table import get_snapshot
from relgate.catalog.states import current_state, transition
from relgate.errors import NotFoundError, RejectedError, RelgateError, UsageError
from relgate.integrity.canonical import canonical_bytes
from relgate.integrity.digests import is_digest
from relgate.integrity.signing import sign_envelope
from relgate.release import attest, crypto
from relgate.release.checks import (
    INCONCLUSIVE_WHEN_PARTIAL,
    RELEASE_CHECKS,
    SHARD_CHECKS,
    UNAVAILABLE_CHECKS,
    ZERO_CHECKS,
    Check,
)
from relgate.release import root as rm
from relgate.release import stream as rr
from relgate.snapshot import manifest as sm
from relgate.snapshot.membership import tuple_root
from relgate.workspace import Workspace, build_object_store

REPORT_SCHEMA = "relgate.release.verification.v1"
REPORT_PAYLOAD_TYPE = "application/vnd.relgate.release-verification.v1+json"
SHARD_KEY_PREFIX = "shards/sha256/"

#: Outcomes of one verification attempt.  UNAVAILABLE is not a verdict: an object could not
#: be read or no key could open it, so nothing was proven and the release keeps its state
#: (STAGED stays STAGED) with the failed attempt recorded.  INVALID is final.
OUTCOMES = ("VERIFIED", "INVALID", "UNAVAILABLE")
#: A fatal error of one of these types is an unreadable object (missing, or the store not
#: reachable), not a wrong one.
_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (NotFoundError, OSError, BotoCoreError)

_SHARD_ID = re.compile(r"^shard-(\d{5,})-of-(\d{5,})$")
_DESCRIPTOR_TYPES: dict[str, type] = {
    "id": str,
    "mediaType": str,
    "digest": str,
    "size": int,
    "objectVersion": str,
    "logicalDigest": str,
    "records": int,
    "tokens": int,
    "memberSetDigest": str,
}


# -- one shard (runs in a worker process) ------------------------------------------------


@dataclass(frozen=True)
class ShardTask:
    """Everything a worker needs, passed by value: no writer state, no shared handles."""

    store_config: dict[str, Any]
    descriptor: dict[str, Any]
    snapshot: str
    record_schema: str
    member_schema: str
    key_version: str | None
    key: bytes | None = None


@dataclass
class ShardResult:
    id: str
    digest: str
    object_version: str
    failures: list[dict[str, Any]] = field(default_factory=list)
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

    def fail(self, check: Check, message: str, **details: Any) -> None:
        self.failures.append({"check": check.value, "message": message, **details})

    def to_json(self) -> dict[str, Any]:
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
            "readMicros": int(self.read_seconds * 1_000_000),
            "failures": self.failures,
        }


def object_key(descriptor: Mapping[str, Any]) -> str:
    """Objects are addressed by the digest of their stored bytes (never by listing)."""
    suffix = (
        ".parquet.aesgcm"
        if descriptor["mediaType"] == rm.ENCRYPTED_SHARD_MEDIA_TYPE
        else ".parquet"
    )
    return SHARD_KEY_PREFIX + str(descriptor["digest"]).removeprefix("sha256:") + suffix


def _read_exact(task: ShardTask, result: ShardResult) -> bytes | None:
    """The bytes of the exact pinned version (the verifier keeps no cache of its own)."""
    d = task.descriptor
    key = object_key(d)
    store = build_object_store(task.store_config)
    try:
        local = getattr(store, "local_path", None)
        if local is not None:
            return Path(local(key, str(d["objectVersion"]))).read_bytes()
        return store.get(key, str(d["objectVersion"]))
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


def fetch_shard(
    store: Any,
    descriptor: Mapping[str, Any],
    cache_dir: str | os.PathLike[str] | None = None,
    *,
    root: str = "unknown",
) -> tuple[bytes, str]:
    """Shard bytes for a reader (run workers), through an optional local cache.

    A cached copy is used only if its size and SHA-256 match the descriptor; a stale or
    corrupt copy is discarded and the exact pinned version re-read (status ``rejected``).
    Returns ``(bytes, status)`` with status ``off``, ``hit``, ``miss`` or ``rejected``;
    raises IntegrityError if the pinned version itself does not match.
    """
    from relgate.errors import IntegrityError

    want = str(descriptor["digest"])
    status = "off"
    cached: Path | None = None
    if cache_dir is not None:
        cached = Path(cache_dir) / (want.removeprefix("sha256:") + ".shard")
        status = "miss"
        if cached.exists():
            data = cached.read_bytes()
            if len(data) == descriptor["size"] and _sha(data) == want:
                return data, "hit"
            status = "rejected"
            cached.unlink(missing_ok=True)
            from relgate.release.metrics import current

            current().cache_corrupted(root)
    key = object_key(descriptor)
    data = store.get(key, str(descriptor["objectVersion"]))
    actual = _sha(data)
    if actual != want or len(data) != descriptor["size"]:
        raise IntegrityError(
            "pinned shard version does not match its descriptor",
            object=f"{descriptor['id']} {key}@{descriptor['objectVersion']}",
            check="storage-digest",
            digest=want,
            details={"actual": actual, "size": len(data)},
        )
    if cached is not None:
        cached.parent.mkdir(parents=True, exist_ok=True)
        tmp = cached.with_name(f".{cached.name}.{os.getpid()}.part")
        tmp.write_bytes(data)
        os.replace(tmp, cached)
    return data, status


def _sha(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def verify_shard(task: ShardTask) -> ShardResult:
    """Every per-shard check, from the exact object version; never raises on bad data."""
    d = task.descriptor
    result = ShardResult(str(d["id"]), str(d["digest"]), str(d["objectVersion"]))
    started = time.perf_counter()
    data = _read_exact(task, result)
    result.read_seconds = time.perf_counter() - started
    if data is None:
        return result
    result.bytes = len(data)
    if len(data) != d["size"]:
        result.fail(Check.SIZE_MISMATCH, "stored size differs from descriptor", actual=len(data))
    body = ShardResult(result.id, result.digest, result.object_version)
    with ThreadPoolExecutor(max_workers=2) as pool:
        # The storage digest runs beside the decode (hashlib and pyarrow release the GIL);
        # nothing decoded is reported unless the stored bytes are the vouched ones.
        storage = pool.submit(_sha, data)
        _decode_and_check(task, body, data, pool)
        actual = storage.result()
    if actual != d["digest"]:
        result.fail(
            Check.STORAGE_DIGEST_MISMATCH,
            "stored bytes do not hash to descriptor digest",
            actual=actual,
        )
        return result
    result.failures.extend(body.failures)
    result.records, result.tokens = body.records, body.tokens
    result.stored_content_mismatches = body.stored_content_mismatches
    result.schema_seen, result.tuples = body.schema_seen, body.tuples
    result.decrypted, result.decoded_bytes = body.decrypted, body.decoded_bytes
    return result


def _decode_and_check(
    task: ShardTask, result: ShardResult, data: bytes, pool: ThreadPoolExecutor
) -> None:
    d = task.descriptor
    actual = str(d["digest"])
    if d["mediaType"] == rm.ENCRYPTED_SHARD_MEDIA_TYPE:
        if task.key is None or task.key_version is None:
            result.fail(
                Check.KEY_UNAVAILABLE,
                "no key for this key version: this reader cannot open the shard",
                keyVersion=task.key_version,
            )
            return
        aad = crypto.shard_aad(
            snapshot=task.snapshot,
            shard=str(d["id"]),
            logical_digest=str(d["logicalDigest"]),
            record_schema=task.record_schema,
            key_version=task.key_version,
        )
        try:
            data = crypto.decrypt_shard(
                data, task.key, aad, key_version=task.key_version, shard=result.id, digest=actual
            )
        except RelgateError as exc:
            result.fail(Check.DECRYPT_FAILURES, exc.message, failedCheck=exc.check)
            return
        result.decrypted = True
    elif d["mediaType"] != rm.SHARD_MEDIA_TYPE:
        result.fail(Check.FOOTER_UNREADABLE, "unknown media type", mediaType=d["mediaType"])
        return
    try:
        parquet = pq.ParquetFile(pa.BufferReader(data))
        kv = parquet.metadata.metadata or {}
    except Exception as exc:
        result.fail(Check.FOOTER_UNREADABLE, f"parquet footer does not parse: {type(exc).__name__}")
        return
    declared = kv.get(rr.SCHEMA_METADATA_KEY, b"").decode("utf-8", "replace")
    result.schema_seen = declared or None
    try:
        table = parquet.read()
    except Exception as exc:
        result.fail(Check.DECODE_FAILURES, f"records do not decode: {type(exc).__name__}")
        return
    schema = table.schema.remove_metadata()
    if declared != task.record_schema or not schema.equals(rr.SHARD_ARROW_SCHEMA):
        result.fail(
            Check.RECORD_SCHEMA_MISMATCH,
            "shard's record schema is not the root's",
            declared=declared or None,
            columns=schema.names,
        )
        return
    table = table.combine_chunks()
    result.records = table.num_rows
    result.decoded_bytes = int(table.nbytes)
    recount_future = pool.submit(rr.token_counts, table.column("text"))
    content = rr.content_digests(table.column("lang"), table.column("text"))
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
    elif result.tokens != d["tokens"]:
        result.fail(
            Check.TOKEN_COUNT_MISMATCH, "token total differs from descriptor", actual=result.tokens
        )
    if table.num_rows != d["records"]:
        result.fail(
            Check.RECORD_COUNT_MISMATCH,
            "record count differs from descriptor",
            actual=table.num_rows,
        )
    logical = rr.logical_digest(table, content)
    if logical != d["logicalDigest"]:
        result.fail(Check.LOGICAL_DIGEST_MISMATCH, "decoded record stream differs", actual=logical)
    members = rr.member_set_digest(table, task.member_schema, content)
    if members != d["memberSetDigest"]:
        result.fail(Check.MEMBER_SET_DIGEST_MISMATCH, "shard's member set differs", actual=members)
    # The tuple carries the content digest recomputed from the decoded text, not the column.
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


def run_shards(tasks: list[ShardTask], workers: int) -> list[ShardResult]:
    """Verify shards in ``workers`` separate processes (0: in this process, for debugging)."""
    if workers <= 0 or not tasks:
        return [verify_shard(t) for t in tasks]
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["relgate.release.verifier"])
    with ProcessPoolExecutor(
        max_workers=min(workers, len(tasks)), mp_context=ctx, initializer=_worker_init
    ) as pool:
        return list(pool.map(verify_shard, tasks))


# -- the whole release -------------------------------------------------------------------


@dataclass
class VerificationReport:
    root: str
    outcome: str  # VERIFIED | INVALID
    counts: dict[str, int]
    shards: list[dict[str, Any]]
    facts: dict[str, Any]
    problems: list[str]
    report_digest: str | None = None
    report_version: str | None = None
    provenance_digest: str | None = None
    provenance_version: str | None = None
    state: str | None = None
    unavailable: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return self.outcome == "VERIFIED"

    @property
    def failing(self) -> dict[str, int]:
        return {k: v for k, v in self.counts.items() if v}

    def to_json(self) -> dict[str, Any]:
        """The signed payload (digests of the report itself are added by the caller)."""
        return {
            "schema": REPORT_SCHEMA,
            "root": self.root,
            "outcome": self.outcome,
            "counts": self.counts,
            "shards": self.shards,
            "facts": self.facts,
            "problems": self.problems,
            "unavailable": self.unavailable,
        }

    def summary(self) -> dict[str, Any]:
        """What the CLI and Dagster layers print/attach as metadata."""
        return {
            "root": self.root,
            "outcome": self.outcome,
            "state": self.state,
            "reportDigest": self.report_digest,
            "provenanceDigest": self.provenance_digest,
            "failing": self.failing,
            "unavailable": self.unavailable,
            "shards": len(self.shards),
            "shardsVerified": sum(1 for s in self.shards if s["ok"]),
            "records": self.facts.get("records", 0),
            "bytes": self.facts.get("bytes", 0),
        }


def descriptor_problems(shards: Any, total: Any) -> list[str]:
    """Every descriptor must carry every field with the right type, ids well formed."""
    problems: list[str] = []
    if not isinstance(shards, list):
        return ["shards is not a list"]
    seen: set[str] = set()
    for index, d in enumerate(shards):
        if not isinstance(d, dict):
            problems.append(f"descriptor {index} is not an object")
            continue
        missing = [f for f in rm.DESCRIPTOR_FIELDS if f not in d]
        if missing:
            problems.append(f"descriptor {index} lacks {missing}")
            continue
        wrong = [
            f
            for f, t in _DESCRIPTOR_TYPES.items()
            if not isinstance(d[f], t) or (t is int and isinstance(d[f], bool))
        ]
        if wrong:
            problems.append(f"descriptor {index} has mistyped {wrong}")
            continue
        bad_digest = [
            f for f in ("digest", "logicalDigest", "memberSetDigest") if not is_digest(d[f])
        ]
        if bad_digest:
            problems.append(f"descriptor {index} has malformed {bad_digest}")
            continue
        m = _SHARD_ID.match(d["id"])
        if not m or int(m.group(1)) != index or int(m.group(2)) != total:
            problems.append(
                f"descriptor {index} has id {d['id']!r}, expected position {index} of {total}"
            )
        if d["id"] in seen:
            problems.append(f"descriptor id {d['id']!r} repeats")
        seen.add(d["id"])
        if d["mediaType"] not in (rm.SHARD_MEDIA_TYPE, rm.ENCRYPTED_SHARD_MEDIA_TYPE):
            problems.append(f"descriptor {index} has unknown mediaType")
    return problems


def set_diff(release: pl.DataFrame, snapshot: pl.DataFrame) -> dict[Check, int]:
    """Full multiset diff of the decoded tuples against the snapshot's membership."""
    per_id = release.group_by("sampleId").agg(
        pl.len().alias("n"), pl.col("split").n_unique().alias("splits")
    )
    duplicates = int(per_id.filter(pl.col("n") > 1).select((pl.col("n") - 1).sum()).item() or 0)
    split_in_release = per_id.filter(pl.col("splits") > 1).height
    first = release.unique(subset="sampleId", keep="first", maintain_order=True)
    joined = first.join(snapshot, on="sampleId", how="full", suffix="_snap", coalesce=True)
    both = joined.filter(pl.col("sourceId").is_not_null() & pl.col("sourceId_snap").is_not_null())
    return {
        Check.MISSING_MEMBERS: joined.filter(pl.col("sourceId").is_null()).height,
        Check.EXTRA_MEMBERS: joined.filter(pl.col("sourceId_snap").is_null()).height,
        Check.DUPLICATE_MEMBERS: duplicates,
        Check.CONTENT_SUBSTITUTIONS: both.filter(
            pl.col("logicalContentDigest") != pl.col("logicalContentDigest_snap")
        ).height,
        Check.SOURCE_VERSION_SUBSTITUTIONS: both.filter(
            (pl.col("sourceVersion") != pl.col("sourceVersion_snap"))
            | (pl.col("sourceId") != pl.col("sourceId_snap"))
        ).height,
        Check.SPLIT_CONFLICTS: both.filter(pl.col("split") != pl.col("split_snap")).height
        + split_in_release,
    }


_TUPLE_SCHEMA = {
    "sampleId": pl.String,
    "sourceId": pl.String,
    "sourceVersion": pl.String,
    "logicalContentDigest": pl.String,
    "split": pl.String,
}


def _check_release(
    ws: Workspace,
    root: str,
    envelope_version: str,
    *,
    workers: int,
    keys: Mapping[str, bytes],
    counts: dict[str, int],
    facts: dict[str, Any],
    problems: list[str],
) -> tuple[list[ShardResult], dict[str, Any]]:
    release = rm.load(ws.store, ws.trusted_keys, root, envelope_version)
    body = release.body
    snapshot_digest = str(body["datasetSnapshot"])
    facts["snapshot"] = snapshot_digest
    snap_row = get_snapshot(ws.db, snapshot_digest)
    snap = sm.load(ws.store, ws.trusted_keys, snapshot_digest, snap_row["envelope_version"])
    member_schema = str(snap.body["recordSchema"])
    if (int(body["tombstoneWatermark"]), int(body["benchmarkFence"])) != (
        int(snap.body["tombstoneWatermark"]),
        int(snap.body["benchmarkFence"]),
    ):
        counts[Check.WATERMARK_MISMATCH] = 1
        problems.append("root watermarks differ from the snapshot's")
    record_schema = str(body["recordSchema"])
    if record_schema != rr.shard_record_schema_digest():
        counts[Check.MIXED_RECORD_SCHEMAS] += 1
        problems.append("root names a record schema this verifier does not know")
    totals = body["totals"] if isinstance(body["totals"], dict) else {}
    shards = body["shards"]
    listed = descriptor_problems(shards, totals.get("shards"))
    counts[Check.DESCRIPTOR_INCOMPLETE] = len(listed)
    problems.extend(listed)
    key_version = body["writer"].get("keyVersion") if isinstance(body["writer"], dict) else None
    tasks = [
        ShardTask(
            store_config=ws.config["objectStore"],
            descriptor=d,
            snapshot=snapshot_digest,
            record_schema=record_schema,
            member_schema=member_schema,
            key_version=key_version,
            key=keys.get(key_version) if key_version is not None else None,
        )
        for d in (shards if isinstance(shards, list) else [])
        if isinstance(d, dict)
        and all(f in d for f in rm.DESCRIPTOR_FIELDS)
        and all(isinstance(d[f], t) for f, t in _DESCRIPTOR_TYPES.items())
        and is_digest(d["digest"])
    ]
    results = run_shards(tasks, workers)
    _wrong_key_is_unavailable(results, key_version)
    for r in results:
        for failure in r.failures:
            counts[failure["check"]] += 1
        counts[Check.STORED_CONTENT_DIGEST_MISMATCHES] += r.stored_content_mismatches
    schemas = {r.schema_seen for r in results if r.schema_seen is not None}
    if len(schemas) > 1:
        counts[Check.MIXED_RECORD_SCHEMAS] += len(schemas) - 1
        problems.append(f"shards declare {len(schemas)} record schemas")

    tables = [r.tuples for r in results if r.tuples is not None]
    decoded = (
        pl.from_arrow(pa.concat_tables(tables)) if tables else pl.DataFrame(schema=_TUPLE_SCHEMA)
    )
    assert isinstance(decoded, pl.DataFrame)
    members_ref = snap.members_ref
    raw = ws.cas.get(members_ref.digest, members_ref.version_id)  # digest-checked read
    expected = pl.read_parquet(io.BytesIO(raw)).select(list(_TUPLE_SCHEMA))
    counts.update(set_diff(decoded, expected))
    recomputed = tuple_root(decoded.sort("sampleId"), member_schema)
    facts["orderedMemberTupleRoot"] = recomputed
    if recomputed != body["orderedMemberTupleRoot"] or recomputed != snap.tuple_root:
        counts[Check.TUPLE_ROOT_MISMATCH] = 1
    seen = {
        "shards": len(shards) if isinstance(shards, list) else 0,
        "records": sum(r.records for r in results),
        "tokens": sum(r.tokens for r in results),
        "bytes": sum(r.bytes for r in results),
    }
    facts.update(seen)
    facts["expectedMembers"] = expected.height
    mismatched = [k for k in ("shards", "records", "tokens", "bytes") if totals.get(k) != seen[k]]
    if mismatched:
        counts[Check.TOTALS_MISMATCH] = len(mismatched)
        problems.append(f"totals differ from the shards in {mismatched}")
    return results, body


def _wrong_key_is_unavailable(results: list[ShardResult], key_version: str | None) -> None:
    """A key that authenticates *no* shard of the release is the wrong key, not proof.

    Each shard's stored bytes already matched the signed descriptor, so an authentication
    failure means either this reader holds another key or one shard was bound to another
    place (associated data).  When no shard at all opens, the reader's key is the cause:
    that is ``keyUnavailable`` (retry with the right key).  When some shards open and
    others do not, the key is right and the others are proven wrong (``decryptFailures``).
    """
    if key_version is None or any(r.decrypted for r in results):
        return
    for r in results:
        for failure in r.failures:
            if (
                failure["check"] == Check.DECRYPT_FAILURES
                and failure.get("failedCheck") == "decrypt-authenticate"
            ):
                failure["check"] = Check.KEY_UNAVAILABLE.value
                failure["message"] = (
                    f"the key given for keyVersion {key_version} authenticates no shard of"
                    " this release: wrong key"
                )


def outcome_of(counts: Mapping[str, int]) -> tuple[str, list[str]]:
    """``(outcome, unavailable checks)`` from one attempt's counts (rule written once).

    Proof wins over unavailability; unavailability makes the partial set checks
    inconclusive instead of proof.
    """
    unavailable = sorted(
        {UNAVAILABLE_CHECKS[k] for k in UNAVAILABLE_CHECKS if counts.get(k)}
        | {
            k.removeprefix("unavailable:")
            for k, v in counts.items()
            if v and k.startswith("unavailable:")
        }
    )
    ignore = set(UNAVAILABLE_CHECKS) | (INCONCLUSIVE_WHEN_PARTIAL if unavailable else set())
    proven = any(
        v for k, v in counts.items() if k not in ignore and not k.startswith("unavailable:")
    )
    if proven:
        return "INVALID", unavailable
    if unavailable:
        return "UNAVAILABLE", unavailable
    return "VERIFIED", []


def verify_release(
    ws: Workspace,
    root_digest: str,
    *,
    workers: int | None = None,
    keys: Mapping[str, bytes] | None = None,
    actor: str,
) -> VerificationReport:
    """Verify a release from its signed root and exact object versions; record the result.

    ``keys`` is the reader's key ring ``{keyVersion: 32-byte key}`` for encrypted shards.
    ``workers`` separate processes verify shards (default: one per CPU; 0 = in-process).
    The signed report and provenance statement are stored content-addressed; the release
    moves STAGED -> VERIFIED, or to INVALID on any failure (forward only).
    """
    row = get_release(ws.db, root_digest)
    nworkers = workers if workers is not None else max(1, os.cpu_count() or 1)
    counts: dict[str, int] = dict.fromkeys((c.value for c in ZERO_CHECKS), 0)
    facts: dict[str, Any] = {"workers": nworkers}
    problems: list[str] = []
    results: list[ShardResult] = []
    body: dict[str, Any] | None = None
    try:
        results, body = _check_release(
            ws,
            root_digest,
            row["envelope_version"],
            workers=nworkers,
            keys=keys or {},
            counts=counts,
            facts=facts,
            problems=problems,
        )
    except _UNAVAILABLE_ERRORS as exc:  # root, snapshot or membership object not readable
        problems.append(str(exc))
        counts["unavailable:object-unavailable"] = 1
    except RelgateError as exc:
        problems.append(str(exc))
        counts[f"fatal:{exc.check or exc.code}"] = 1
    except (KeyError, TypeError, ValueError) as exc:  # a signed but malformed root
        problems.append(f"malformed root manifest: {type(exc).__name__}")
        counts["fatal:root-shape"] = 1
    outcome, unavailable = outcome_of(counts)
    from relgate.release.metrics import current

    current().observe_verification(
        root_digest,
        counts,
        [r.to_json() for r in results],
        int(facts.get("shards", len(results))),
    )
    report = VerificationReport(
        root=root_digest,
        outcome=outcome,
        counts=counts,
        shards=[r.to_json() for r in results],
        facts=facts,
        problems=problems,
        unavailable=unavailable,
    )
    envelope = sign_envelope(
        REPORT_PAYLOAD_TYPE, canonical_bytes(report.to_json()), ws.key("verifier")
    )
    ref = ws.cas.put(json.dumps(envelope, sort_keys=True).encode())
    report.report_digest, report.report_version = ref.digest, ref.version_id
    provenance = None
    if report.ok and body is not None:
        statement = attest.release_statement(
            root_digest, body, report_digest=ref.digest, verifier_id=attest.VERIFIER_ID
        )
        provenance = ws.cas.put(
            json.dumps(
                attest.sign_statement(statement, ws.key("verifier")), sort_keys=True
            ).encode()
        )
        report.provenance_digest, report.provenance_version = (
            provenance.digest,
            provenance.version_id,
        )
    with ws.db.tx() as conn:
        if provenance is not None:
            record_report(
                conn,
                "release-provenance",
                root_digest,
                provenance.digest,
                provenance.version_id,
                True,
            )
        record_report(conn, "release", root_digest, ref.digest, ref.version_id, report.ok)
        state = current_state(conn, "release", root_digest)
        if report.ok and state == "STAGED":
            transition(
                conn, "release", root_digest, "VERIFIED", actor=actor, reason=f"report {ref.digest}"
            )
            state = "VERIFIED"
        elif outcome == "INVALID" and state in ("STAGED", "VERIFIED", "APPROVED"):
            transition(
                conn,
                "release",
                root_digest,
                "INVALID",
                actor=actor,
                reason=f"report {ref.digest}: {sorted(report.failing)}",
            )
            state = "INVALID"
        # UNAVAILABLE moves nothing: the attempt (and its unpassing report) is recorded.
        record_attempt(
            conn,
            root_digest,
            outcome=outcome,
            state=state,
            checks=unavailable or sorted(report.failing),
            report_digest=ref.digest,
            report_version=ref.version_id,
            actor=actor,
        )
        report.state = state
    return report


def load_report(ws: Workspace, digest: str, version_id: str) -> dict[str, Any]:
    """Open a stored verification report (signature checked against trusted keys)."""
    from relgate.integrity.signing import verify_envelope

    envelope = json.loads(ws.cas.get(digest, version_id))
    payload = verify_envelope(
        envelope, ws.trusted_keys, payload_type=REPORT_PAYLOAD_TYPE, subject=f"report {digest}"
    )
    body: dict[str, Any] = json.loads(payload)
    return body


# -- command line ----------------------------------------------------------------------


def key_ring(specs: Iterable[str]) -> dict[str, bytes]:
    """``VERSION=PATH`` specs -> ``{keyVersion: key bytes}`` (the reader's key ring)."""
    from relgate.integrity.identifiers import validate_id

    ring = {}
    for spec in specs:
        version, sep, path = spec.partition("=")
        if not sep or not version:
            raise UsageError("a key is given as VERSION=PATH", object="--key", check="key-spec")
        version = validate_id(version, kind="key version", where="--key")
        try:
            with open(path, "rb") as fh:
                ring[version] = fh.read(33)
        except OSError as exc:
            raise UsageError(
                f"key file unreadable: {type(exc).__name__}",
                object=f"--key {version}",
                check="key-file",
            ) from None
    return ring


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m relgate.release.verifier")
    parser.add_argument("--home", default=None, help="RELGATE_HOME of the workspace")
    parser.add_argument("--root", required=True, help="root manifest digest")
    parser.add_argument("--shard", action="append", default=[], help="verify only these ids")
    parser.add_argument("--workers", type=int, default=None)
    parser.add_argument("--key", action="append", default=[], help="keyVersion=path/to/key")
    parser.add_argument("--actor", default="verifier")
    args = parser.parse_args(argv)
    ws = Workspace.open(args.home)
    try:
        ring = key_ring(args.key)
        if not args.shard:
            report = verify_release(
                ws, args.root, workers=args.workers, keys=ring, actor=args.actor
            )
            print(json.dumps(report.summary() | {"counts": report.counts}, sort_keys=True))
            return 0 if report.ok else 3
        # A subset: per-shard checks only, no set diff and no state change.
        row = get_release(ws.db, args.root)
        body = rm.load(ws.store, ws.trusted_keys, args.root, row["envelope_version"]).body
        snap_row = get_snapshot(ws.db, body["datasetSnapshot"])
        snap = sm.load(
            ws.store, ws.trusted_keys, body["datasetSnapshot"], snap_row["envelope_version"]
        )
        wanted = set(args.shard)
        kv = body["writer"].get("keyVersion")
        tasks = [
            ShardTask(
                ws.config["objectStore"],
                d,
                body["datasetSnapshot"],
                body["recordSchema"],
                snap.body["recordSchema"],
                kv,
                ring.get(kv) if kv else None,
            )
            for d in body["shards"]
            if d.get("id") in wanted
        ]
        results = run_shards(tasks, args.workers if args.workers is not None else 1)
        unknown = sorted(wanted - {r.id for r in results})
        out = {
            "root": args.root,
            "shards": [r.to_json() for r in results],
            "unknownShards": unknown,
        }
        print(json.dumps(out, sort_keys=True))
        return 0 if all(r.ok for r in results) and not unknown else 3
    except RelgateError as exc:
        print(json.dumps(exc.to_json(), sort_keys=True))
        return exc.exit_code
    except Exception:
        traceback.print_exc(file=sys.stderr)
        return 1
    finally:
        ws.close()


if __name__ == "__main__":
    sys.exit(main())
