"""The independent verifier of a shard release.

A separate code path from the writer: it trusts nothing the writer computed except what
the signed root manifest states, and shares only the record-stream definition
(:mod:`relgate.documents.shard_format`).  It never lists a prefix: every object is read by the
key its descriptor's digest names and the exact ``objectVersion`` the descriptor pins.

Per shard, in worker processes (:mod:`relgate.release.verify.worker`), every per-shard
check.  Then, over the whole release: the tuple multiset built from the decoded records is
diffed in full against the snapshot's membership table (:mod:`relgate.release.verify.member_diff`),
the ``orderedMemberTupleRoot`` is recomputed, totals and watermarks are checked.  Every
finding is counted under its :class:`~relgate.release.verify.checks.Check`.  The
``relgate.release.verification.v1`` report (:mod:`relgate.release.verify.report`) is signed (DSSE)
and stored content-addressed, bound to the root digest, together with an in-toto/SLSA
provenance statement; the release moves STAGED -> VERIFIED when every count is zero, else
INVALID.

``relgate release verify ROOT [--shard ID ...] [--workers N]`` verifies a release (or only
the named shards, without a state change) and prints JSON.
"""

from __future__ import annotations

import io
import os
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import polars as pl
import pyarrow as pa
from botocore.exceptions import BotoCoreError
from sqlalchemy import Connection

from relgate.catalog.audit import record_report
from relgate.catalog.release_table import get_release, record_attempt
from relgate.catalog.snapshot_table import get_snapshot
from relgate.catalog.states import current_state, transition
from relgate.documents import release_root as rm
from relgate.documents import shard_format as rr
from relgate.documents import snapshot_manifest as sm
from relgate.documents.membership import tuple_root
from relgate.documents.shard_descriptor import descriptor_problems, well_formed
from relgate.errors import NotFoundError, RelgateError
from relgate.integrity.contract import Contract, JsonObject
from relgate.release.evolution import record_for_root
from relgate.release.metrics import current
from relgate.release.verify.checks import (
    ZERO_CHECKS,
    Check,
    Outcome,
    outcome_of,
)
from relgate.release.verify.member_diff import TUPLE_SCHEMA, set_diff
from relgate.release.verify.report import (
    VerificationReport,
    WireObject,
    store_provenance,
    store_report,
)
from relgate.release.verify.worker import (
    THREAD,
    ShardResult,
    ShardTask,
    run_shards,
    verify_shard,
)
from relgate.snapshot import tokenizer
from relgate.workspace import Workspace

__all__ = ["ShardSubsetReport", "shard_ids", "verify_one_shard", "verify_release", "verify_shards"]

#: A fatal error of one of these types is an unreadable object (missing, or the store not
#: reachable), not a wrong one.
_UNAVAILABLE_ERRORS: tuple[type[BaseException], ...] = (NotFoundError, OSError, BotoCoreError)
#: What :func:`_attempt` turns into a finding: an unreadable object, a refusal, a malformed root.
_FINDING_ERRORS: tuple[type[BaseException], ...] = (
    *_UNAVAILABLE_ERRORS,
    RelgateError,
    KeyError,
    TypeError,
    ValueError,
)


@dataclass
class _Attempt:
    """What one verification attempt has found so far."""

    workers: int
    counts: dict[str, int] = field(default_factory=lambda: {c.value: 0 for c in ZERO_CHECKS})
    facts: JsonObject = field(default_factory=dict)
    problems: list[str] = field(default_factory=list)
    results: list[ShardResult] = field(default_factory=list)
    body: JsonObject | None = None

    def __post_init__(self) -> None:
        self.facts["workers"] = self.workers

    def count(self, check: Check, value: int = 1, problem: str | None = None) -> None:
        self.counts[check] = value
        if problem is not None:
            self.problems.append(problem)


@dataclass(frozen=True)
class _Opened:
    """The signed root and its snapshot, as the checks need them."""

    body: JsonObject
    snapshot: sm.SnapshotManifest
    #: the shard format of the snapshot's record schema (not the root's word for it)
    fmt: rr.ShardFormat
    member_schema: str
    tokenizer: bytes | None


def _open(ws: Workspace, root: str, envelope_version: str, attempt: _Attempt) -> _Opened:
    """Load the signed root and its snapshot; check watermarks, schema and descriptors."""
    body = rm.load_document(ws.store, ws.trusted_keys, root, envelope_version)
    attempt.body = body
    snapshot_digest = str(body["datasetSnapshot"])
    attempt.facts["snapshot"] = snapshot_digest
    snap_row = get_snapshot(ws.db, snapshot_digest)
    snap = sm.load(ws.store, ws.trusted_keys, snapshot_digest, snap_row.envelope_version)
    if (_int(body["tombstoneWatermark"]), _int(body["benchmarkFence"])) != (
        snap.tombstone_watermark,
        snap.benchmark_fence,
    ):
        attempt.count(Check.WATERMARK_MISMATCH, 1, "root watermarks differ from the snapshot's")
    fmt = rr.ShardFormat(snap.record_schema_document)
    _check_schemas(body, snap, fmt, attempt)
    listed = descriptor_problems(body["shards"], _totals(body).get("shards"))
    attempt.counts[Check.DESCRIPTOR_INCOMPLETE] = len(listed)
    attempt.problems.extend(listed)
    return _Opened(body, snap, fmt, snap.record_schema, tokenizer.pinned_bytes(ws, snap))


def _check_schemas(
    body: JsonObject, snap: sm.SnapshotManifest, fmt: rr.ShardFormat, attempt: _Attempt
) -> None:
    """The root's record schema, its document and its member schema are the snapshot's."""
    document = body.get("recordSchemaDocument")
    same = (
        body["recordSchema"] == fmt.digest
        and isinstance(document, dict)
        and document == fmt.document.to_json()
        and body.get("memberSchema") == snap.record_schema
    )
    if not same:
        attempt.counts[Check.MIXED_RECORD_SCHEMAS] += 1
        attempt.problems.append(
            "root's record schema is not the shard format of its snapshot's record schema"
        )


def _int(value: object) -> int:
    if isinstance(value, int | float | str):
        return int(value)
    raise TypeError(f"not an integer: {type(value).__name__}")


def _totals(body: JsonObject) -> JsonObject:
    totals = body["totals"]
    return totals if isinstance(totals, dict) else {}


def _key_version(body: JsonObject) -> str | None:
    writer = body["writer"]
    value = writer.get("keyVersion") if isinstance(writer, dict) else None
    return None if value is None else str(value)


def _tasks(
    ws: Workspace,
    opened: _Opened,
    keys: Mapping[str, bytes],
    wanted: set[str] | None = None,
) -> list[ShardTask]:
    """One task per well-formed descriptor (``wanted``: only those ids)."""
    body = opened.body
    key_version = _key_version(body)
    shards = body["shards"]
    store_config = ws.config["objectStore"]
    return [
        ShardTask(
            store_config=store_config,
            descriptor=rm.ShardDescriptor.parse(d),
            snapshot=str(body["datasetSnapshot"]),
            records=opened.fmt.records,
            member_schema=opened.member_schema,
            tokenizer=opened.tokenizer,
            key_version=key_version,
            key=keys.get(key_version) if key_version is not None else None,
        )
        for d in (shards if isinstance(shards, list) else [])
        if well_formed(d) and (wanted is None or (isinstance(d, dict) and d["id"] in wanted))
    ]


def _count_shards(attempt: _Attempt, key_version: str | None) -> None:
    results = attempt.results
    _wrong_key_is_unavailable(results, key_version)
    for r in results:
        for failure in r.failures:
            attempt.counts[str(failure["check"])] += 1
        attempt.counts[Check.STORED_CONTENT_DIGEST_MISMATCHES] += r.stored_content_mismatches
    schemas = {r.schema_seen for r in results if r.schema_seen is not None}
    if len(schemas) > 1:
        attempt.counts[Check.MIXED_RECORD_SCHEMAS] += len(schemas) - 1
        attempt.problems.append(f"shards declare {len(schemas)} record schemas")


def _diff_members(ws: Workspace, opened: _Opened, attempt: _Attempt) -> None:
    """The decoded tuple multiset against the snapshot's membership, and the tuple root."""
    tables = [r.tuples for r in attempt.results if r.tuples is not None]
    decoded = (
        pl.from_arrow(pa.concat_tables(tables)) if tables else pl.DataFrame(schema=TUPLE_SCHEMA)
    )
    assert isinstance(decoded, pl.DataFrame)  # noqa: S101 - a table converts to a frame
    members_ref = opened.snapshot.members_ref
    # digest-checked, and bounded by the size the signed snapshot manifest records
    raw = ws.cas.get(members_ref.digest, members_ref.version_id, size=members_ref.size)
    expected = pl.read_parquet(io.BytesIO(raw)).select(list(TUPLE_SCHEMA))
    attempt.counts.update({c.value: n for c, n in set_diff(decoded, expected).items()})
    recomputed = tuple_root(decoded.sort("sampleId"), opened.member_schema)
    attempt.facts["orderedMemberTupleRoot"] = recomputed
    claimed = opened.body["orderedMemberTupleRoot"]
    if recomputed != claimed or recomputed != opened.snapshot.tuple_root:
        attempt.counts[Check.TUPLE_ROOT_MISMATCH] = 1
    attempt.facts["expectedMembers"] = expected.height


def _check_totals(opened: _Opened, attempt: _Attempt) -> None:
    shards = opened.body["shards"]
    results = attempt.results
    seen: JsonObject = {
        "shards": len(shards) if isinstance(shards, list) else 0,
        "records": sum(r.records for r in results),
        "tokens": sum(r.tokens for r in results),
        "bytes": sum(r.bytes for r in results),
    }
    attempt.facts.update(seen)
    totals = _totals(opened.body)
    mismatched = [k for k in ("shards", "records", "tokens", "bytes") if totals.get(k) != seen[k]]
    if mismatched:
        attempt.count(
            Check.TOTALS_MISMATCH,
            len(mismatched),
            f"totals differ from the shards in {mismatched}",
        )


def _check_release(
    ws: Workspace,
    root: str,
    envelope_version: str,
    attempt: _Attempt,
    keys: Mapping[str, bytes],
    results: Sequence[ShardResult] | None = None,
) -> None:
    """Open the root, verify every shard (or take ``results``), then reduce over them."""
    opened = _open(ws, root, envelope_version, attempt)
    if results is None:
        attempt.results = run_shards(_tasks(ws, opened, keys), attempt.workers, mode=THREAD)
    else:
        attempt.results = _in_root_order(opened, results)
    _reduce(ws, opened, attempt)


def _in_root_order(opened: _Opened, results: Sequence[ShardResult]) -> list[ShardResult]:
    """Results verified elsewhere, in the root's descriptor order (what ``run_shards`` gives):
    each well-formed descriptor takes the next result of its id (a forged root may list an
    id twice); results no descriptor names stay, at the end."""
    pending: dict[str, list[ShardResult]] = {}
    for result in results:
        pending.setdefault(result.id, []).append(result)
    shards = opened.body["shards"]
    ordered = [
        pending[str(d["id"])].pop(0)
        for d in (shards if isinstance(shards, list) else [])
        if well_formed(d) and isinstance(d, dict) and pending.get(str(d["id"]))
    ]
    return ordered + [r for left in pending.values() for r in left]


def _reduce(ws: Workspace, opened: _Opened, attempt: _Attempt) -> None:
    """Over all shard results: per-shard counts, the multiset diff, the totals."""
    _count_shards(attempt, _key_version(opened.body))
    _diff_members(ws, opened, attempt)
    _check_totals(opened, attempt)


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


def _attempt(
    ws: Workspace,
    root: str,
    envelope_version: str,
    attempt: _Attempt,
    keys: Mapping[str, bytes],
    results: Sequence[ShardResult] | None = None,
) -> None:
    """Run every check; a refusal on the way is a finding (``fatal:``/``unavailable:``)."""
    try:
        _check_release(ws, root, envelope_version, attempt, keys, results)
    except _UNAVAILABLE_ERRORS as exc:  # root, snapshot or membership object not readable
        attempt.problems.append(str(exc))
        attempt.counts["unavailable:object-unavailable"] = 1
    except RelgateError as exc:
        attempt.problems.append(str(exc))
        attempt.counts[f"fatal:{exc.check or exc.code}"] = 1
    except (KeyError, TypeError, ValueError) as exc:  # a signed but malformed root
        attempt.problems.append(f"malformed root manifest: {type(exc).__name__}")
        attempt.counts["fatal:root-shape"] = 1


def verify_release(
    ws: Workspace,
    root_digest: str,
    *,
    workers: int | None = None,
    keys: Mapping[str, bytes] | None = None,
    actor: str,
    results: Sequence[ShardResult] | None = None,
) -> VerificationReport:
    """Verify a release from its signed root and exact object versions; record the result.

    ``keys`` is the reader's key ring ``{keyVersion: 32-byte key}`` for encrypted shards.
    ``workers`` threads verify shards (default: one per CPU; 0 = in this thread).
    ``results``: the shards were verified elsewhere (:func:`verify_one_shard` per id of
    :func:`shard_ids`, e.g. one Dagster step each); only the reduce runs here, the same
    multiset diff, tuple root and totals over them.  The signed report and provenance
    statement are stored content-addressed; the release moves STAGED -> VERIFIED, or to
    INVALID on any failure (forward only).
    """
    row = get_release(ws.db, root_digest)
    attempt = _Attempt(workers if workers is not None else max(1, os.cpu_count() or 1))
    _attempt(ws, root_digest, row.envelope_version, attempt, keys or {}, results)
    outcome, unavailable = outcome_of(attempt.counts)
    shards = [r.to_json() for r in attempt.results]
    shard_total = attempt.facts.get("shards", len(attempt.results))
    current().observe_verification(
        root_digest,
        attempt.counts,
        attempt.results,
        int(shard_total) if isinstance(shard_total, int) else 0,
    )
    report = VerificationReport(
        root=root_digest,
        outcome=outcome,
        counts=attempt.counts,
        shards=shards,
        facts=attempt.facts,
        problems=list(attempt.problems),
        unavailable=unavailable,
    )
    ref = store_report(ws, report, ws.key("verifier"))
    report = report.model_copy(
        update={"report_digest": ref.digest, "report_version": ref.version_id}
    )
    if report.ok and attempt.body is not None:
        provenance = store_provenance(ws, attempt.body, report, ws.key("verifier"))
        report = report.model_copy(
            update={
                "provenance_digest": provenance.digest,
                "provenance_version": provenance.version_id,
            }
        )
    with ws.db.tx() as conn:
        state = _record(conn, report, actor)
    if report.ok:  # the signed schema-evolution report, bound to this root
        record_for_root(ws, root_digest, actor=actor)
    return report.model_copy(update={"state": state})


def _record(conn: Connection, report: VerificationReport, actor: str) -> str:
    """Record the reports and the attempt; move the release state. Returns the new state."""
    root, ref = report.root, str(report.report_digest)
    if report.provenance_digest is not None:
        record_report(
            conn,
            "release-provenance",
            root,
            report.provenance_digest,
            str(report.provenance_version),
            True,
        )
    record_report(conn, "release", root, ref, str(report.report_version), report.ok)
    state = str(current_state(conn, "release", root))
    if report.ok and state == "STAGED":
        transition(conn, "release", root, "VERIFIED", actor=actor, reason=f"report {ref}")
        state = "VERIFIED"
    elif report.outcome == Outcome.INVALID and state in ("STAGED", "VERIFIED", "APPROVED"):
        reason = f"report {ref}: {sorted(report.failing)}"
        transition(conn, "release", root, "INVALID", actor=actor, reason=reason)
        state = "INVALID"
    # UNAVAILABLE moves nothing: the attempt (and its unpassing report) is recorded.
    record_attempt(
        conn,
        root,
        outcome=report.outcome.value,
        state=state,
        checks=list(report.unavailable) or sorted(report.failing),
        report_digest=ref,
        report_version=str(report.report_version),
        actor=actor,
    )
    return state


class ShardSubsetReport(Contract):
    """Per-shard checks of named shards only (no set diff, no state change)."""

    root: str
    shards: tuple[WireObject, ...]
    unknown_shards: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return all(s["ok"] for s in self.shards) and not self.unknown_shards


def verify_shards(
    ws: Workspace,
    root_digest: str,
    shard_ids: Iterable[str],
    *,
    workers: int | None = None,
    keys: Mapping[str, bytes] | None = None,
) -> ShardSubsetReport:
    """The per-shard checks of the named shards of a release; nothing is recorded."""
    row = get_release(ws.db, root_digest)
    wanted = set(shard_ids)
    opened = _open(ws, root_digest, row.envelope_version, _Attempt(0))
    tasks = _tasks(ws, opened, keys or {}, wanted)
    results = run_shards(tasks, workers if workers is not None else 1)
    return ShardSubsetReport(
        root=root_digest,
        shards=tuple(r.to_json() for r in results),
        unknown_shards=tuple(sorted(wanted - {r.id for r in results})),
    )


def shard_ids(ws: Workspace, root_digest: str) -> list[str]:
    """The ids of the root's well-formed shard descriptors, in root order: what to fan out
    (position ``i`` is :func:`verify_one_shard`'s ``index``; a forged root may repeat an id).

    A root that does not open yields none; :func:`verify_release` then records why.
    """
    row = get_release(ws.db, root_digest)
    try:
        opened = _open(ws, root_digest, row.envelope_version, _Attempt(0))
    except _FINDING_ERRORS:
        return []
    return [task.descriptor.id for task in _tasks(ws, opened, {})]


def verify_one_shard(
    ws: Workspace,
    root_digest: str,
    index: int,
    shard_id: str,
    *,
    keys: Mapping[str, bytes] | None = None,
) -> ShardResult:
    """Every per-shard check of the ``index``-th well-formed shard (``shard_id``) of a
    release, nothing recorded: one fan-out step."""
    row = get_release(ws.db, root_digest)
    opened = _open(ws, root_digest, row.envelope_version, _Attempt(0))
    tasks = _tasks(ws, opened, keys or {})
    if not 0 <= index < len(tasks) or tasks[index].descriptor.id != shard_id:
        raise NotFoundError(
            f"release has no well-formed shard {shard_id!r} at position {index}",
            object=shard_id,
            check="shard-id",
            digest=root_digest,
        )
    return verify_shard(tasks[index])
