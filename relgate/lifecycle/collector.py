"""Fail-closed garbage collection: plan (the default) and sweep (explicit).

Mark
    The required set is every object referenced by every retained version (see
    :mod:`relgate.holds.retention` and :mod:`relgate.holds.refs`).  A retained
    manifest that is missing or does not verify, or a referenced object that is not
    stored, fails the whole plan, naming it.

Candidates
    Stored object versions under the managed prefixes, minus the required set (compared
    by canonical key, so two spellings of one key are one object), minus every key a name
    points at (:mod:`relgate.lifecycle.names`), minus versions the
    collector first saw less than the grace period ago, minus keys leased by in-progress
    publishers, minus versions held by reader leases (those are retained versions), minus
    everything a manifest without a catalog row references (its publication outcome is
    unknown), minus stored keys that are another spelling of a required key.

Sweep
    Plans, then takes each batch of candidates through :meth:`Database.gate_tx`: inside
    the gate it re-reads the retained set (new versions, pins, leases), the names
    (a tag or registration since the plan) and the audit policy, re-marks anything
    newly retained, re-checks the grace period and the leases, records the deletion and
    its reason in ``gc_deletions`` and deletes that exact object version.  A pin that
    commits before the batch is honoured; one that commits after sees the record.
"""

from __future__ import annotations

import datetime as dt
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, Literal

import pyarrow as pa
import pyarrow.compute as pc
from relgate_trust.digests import sha256_digest
from sqlalchemy import Connection

from relgate.catalog import gc_table
from relgate.catalog.db import rows, utcnow
from relgate.catalog.versions import record_verified
from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.documents.verified_bytes import verify_stored
from relgate.errors import IntegrityError, NotFoundError, RejectedError, RelgateError, UsageError
from relgate.heap import collector_paused
from relgate.holds.pins import leased_keys
from relgate.holds.refs import (
    MANAGED_PREFIXES,
    ROW_CHUNK,
    Ref,
    Verified,
    VersionRow,
    descriptor_key,
    refs_of,
    version_refs,
    version_rows,
)
from relgate.holds.retention import (
    Holders,
    RetainedVersion,
    erased_versions,
    format_time,
    holders_of,
    now_utc,
    parse_time,
    raw_sources_kept,
    retained_versions,
)
from relgate.integrity.contract import Contract
from relgate.lifecycle.audit_trail import AuditKept, AuditPolicy, audit_refs, get_audit_policy
from relgate.lifecycle.inventory import (
    Exclusions,
    candidate_table,
    classify,
    excluded_counts,
    first_absent,
    listing_batches,
    owners_table,
    pairs_table,
    seen_index,
    seen_table,
    stored_table,
    unseen,
)
from relgate.lifecycle.names import NamedObject, Names, name_roots, named_objects
from relgate.objects.layout import canonical_key, digest_named_by, envelope_subject
from relgate.progress import task, track
from relgate.workspace import Workspace

DEFAULT_GRACE_SECONDS = 6 * 3600
SWEEP_BATCH = 256
_SEEN_CHUNK = 500


class Candidate(Contract):
    """A stored object version a sweep would delete, and why."""

    key: str
    version_id: str
    size: int
    first_seen: str
    reason: str


class PlanReport(Contract):
    """The wire form of a :class:`Plan` (``relgate gc plan --json``)."""

    mode: Literal["plan"] = "plan"
    at: str
    grace_seconds: int
    retained: list[RetainedVersion]
    #: stored object versions under the managed prefixes that retained versions reference
    #: (never more than ``stored_objects``)
    required_objects: int
    #: referenced objects outside the managed prefixes (raw sources): kept, never listed
    raw_source_objects: int
    stored_objects: int
    stored_bytes: int
    candidate_count: int
    candidate_bytes: int
    candidates: list[Candidate]
    excluded: dict[str, int]
    unknown_outcome: list[str]
    raw_source_gaps: list[str]
    #: keys names point at (registered transforms and tokenizers, tags, the workspace
    #: config): kept whole whatever references them
    named: list[NamedObject] = []
    #: the audit retention policy (``keepDays`` null: forever)
    audit_policy: AuditPolicy = AuditPolicy()
    #: stored object versions kept only as a collected version's audit trail
    audit_objects: int = 0
    #: versions no longer retained whose audit trail is kept (up to the listing limit)
    audit_versions: int = 0
    audit_kept: list[AuditKept] = []
    #: retained versions a tombstone hit: only these holders keep the erased bytes
    #: (``relgate fence show TOMBSTONE --propagation`` for one sample)
    erasure_held: list[RetainedVersion] = []


@dataclass(frozen=True)
class Plan:
    """A dry run.  Holds the required set and the candidates as Arrow tables (a
    million rows are columns, not Python objects); :attr:`candidates` materializes the
    typed rows on first use, :meth:`report` only the ones it shows."""

    now: str
    grace_seconds: int
    retained: Holders
    required_table: pa.Table  # canonical, version_id (unique)
    stored: int
    stored_bytes: int
    candidate_table: pa.Table  # key, version_id, size, first_seen, reason
    excluded: dict[str, int] = field(default_factory=dict)
    unknown_outcome: list[str] = field(default_factory=list)
    raw_source_gaps: list[str] = field(default_factory=list)
    names: Names = field(default_factory=dict)
    audit_policy: AuditPolicy = field(default_factory=AuditPolicy)
    audit_kept: list[AuditKept] = field(default_factory=list)
    #: canonical key -> versions no longer retained whose bytes it is
    users: Users = field(default_factory=dict)
    erased: set[str] = field(default_factory=set)

    @property
    def required(self) -> set[tuple[str, str]]:
        table = self.required_table
        return set(
            zip(table["canonical"].to_pylist(), table["version_id"].to_pylist(), strict=True)
        )

    @property
    def required_keys(self) -> set[str]:
        return set(self.required_table["canonical"].to_pylist())

    @property
    def candidate_count(self) -> int:
        return int(self.candidate_table.num_rows)

    @cached_property
    def required_managed(self) -> int:
        """Required (key, version) pairs under the managed prefixes: every one is a stored
        object (the mark fails closed otherwise), so this never exceeds :attr:`stored`."""
        keys = self.required_table["canonical"]
        under = [pc.starts_with(keys, prefix) for prefix in MANAGED_PREFIXES]
        mask = under[0]
        for other in under[1:]:
            mask = pc.or_(mask, other)
        return int(pc.sum(pc.cast(mask, pa.int64())).as_py() or 0)

    def candidate_rows(self, start: int = 0, stop: int | None = None) -> list[Candidate]:
        """Candidates ``start`` to ``stop`` (listing order) as typed rows."""
        length = None if stop is None else max(0, stop - start)
        return [Candidate(**row) for row in self.candidate_table.slice(start, length).to_pylist()]

    @cached_property
    def candidates(self) -> list[Candidate]:
        return self.candidate_rows()

    def report(self, *, limit: int | None = None) -> PlanReport:
        return PlanReport(
            at=self.now,
            grace_seconds=self.grace_seconds,
            retained=holders_of(self.retained),
            required_objects=self.required_managed,
            raw_source_objects=self.required_table.num_rows - self.required_managed,
            stored_objects=self.stored,
            stored_bytes=self.stored_bytes,
            candidate_count=self.candidate_count,
            candidate_bytes=int(pc.sum(self.candidate_table["size"]).as_py() or 0),
            candidates=self.candidate_rows(0, limit),
            excluded=dict(sorted(self.excluded.items())),
            unknown_outcome=self.unknown_outcome,
            raw_source_gaps=self.raw_source_gaps,
            named=named_objects(self.names),
            audit_policy=self.audit_policy,
            audit_objects=self.excluded.get("audit-trail", 0),
            audit_versions=len(self.audit_kept),
            audit_kept=self.audit_kept[:limit],
            erasure_held=[v for v in holders_of(self.retained) if v.subject in self.erased],
        )

    def to_json(self, *, limit: int | None = None) -> dict[str, Any]:
        return self.report(limit=limit).to_json()


class Deletion(Contract):
    """One object version a sweep deleted."""

    key: str
    version_id: str
    size: int
    reason: str


class SweepSummary(Contract):
    """What a sweep did (stored as the run's summary in ``gc_runs``)."""

    mode: Literal["sweep"] = "sweep"
    gc_run: str
    grace_seconds: int
    retained: int
    candidates: int
    deleted_count: int
    deleted_bytes: int
    skipped: dict[str, int]
    excluded: dict[str, int]


class SweepResult(SweepSummary):
    """The summary plus every deletion."""

    deleted: list[Deletion]


class DeletionRecord(Contract):
    """One ``gc_deletions`` row: which run deleted which exact object version, and why."""

    run_id: str
    object_key: str
    version_id: str
    size: int
    reason: str
    at: str


class RetainedCheck(Contract):
    """How many retained versions and referenced objects were verified end to end."""

    versions: int
    objects: int


def list_stored(ws: Workspace) -> pa.Table:
    """Every stored version under the managed prefixes, streamed into Arrow batches."""
    listed = (v for prefix in MANAGED_PREFIXES for v in ws.store.list_versions(prefix))
    return stored_table(listing_batches(track(listed, "list stored objects")))


def _row_batches(
    ws: Workspace, versions: Iterable[tuple[str, str]]
) -> Iterator[list[tuple[str, str, VersionRow | None]]]:
    """Sorted versions in chunks with their catalog rows, one short transaction per
    chunk and none held while the caller opens manifests (on SQLite every transaction
    holds the writer lock)."""
    ordered = sorted(versions)
    for start in range(0, len(ordered), ROW_CHUNK):
        chunk = ordered[start : start + ROW_CHUNK]
        with ws.db.tx() as conn:
            found = {
                kind: version_rows(conn, kind, [d for k, d in chunk if k == kind])
                for kind in ("snapshot", "release")
            }
        yield [(kind, digest, found.get(kind, {}).get(digest)) for kind, digest in chunk]


def mark(
    ws: Workspace, conn: Connection, retained: Iterable[tuple[str, str]], *, raw_sources: bool
) -> Iterator[Ref]:
    """Stream the references of every retained version (one version in memory at a time)."""
    for kind, digest in sorted(retained):
        yield from version_refs(ws, conn, kind, digest, raw_sources=raw_sources)


def mark_each(
    ws: Workspace, retained: Iterable[tuple[str, str]], *, raw_sources: bool
) -> Iterator[Ref]:
    """Like :func:`mark`, the catalog rows read in short transactions of many versions,
    none held while the caller consumes."""
    versions = list(retained)
    with task("mark retained versions", total=len(versions)) as marking:
        for chunk in _row_batches(ws, versions):
            verified: Verified = []
            for kind, digest, row in chunk:
                yield from refs_of(
                    ws, kind, digest, row, raw_sources=raw_sources, verified=verified
                )
                marking.advance()
            _record_verified(ws, verified)


def _record_verified(ws: Workspace, verified: Verified) -> None:
    """Keep the bytes of the envelopes just verified in full on their rows, so the next
    plan recognises them by hash (one short transaction per chunk of versions)."""
    if verified:
        with ws.db.tx() as conn:
            record_verified(conn, verified)


def _missing(ref: Ref) -> RejectedError:
    return RejectedError(
        f"{ref.role} referenced by a retained version is missing; garbage collection fails closed",
        object=ref.name,
        check="retained-object-present",
        digest=ref.subject,
    )


def known_digests(conn: Connection) -> set[str]:
    known = {r["digest"] for r in rows(conn, "SELECT digest FROM snapshots")}
    return known | {r["digest"] for r in rows(conn, "SELECT digest FROM releases")}


def _envelope_refs(ws: Workspace, kind: str, digest: str, version: str) -> set[tuple[str, str]]:
    """What an uncatalogued envelope references (nothing if it does not open)."""
    out: set[tuple[str, str]] = set()
    try:
        if kind == "release":
            for d in rm.wire_shards(rm.load_document(ws.store, ws.trusted_keys, digest, version)):
                try:
                    out.add((descriptor_key(d), str(d["objectVersion"])))
                except (KeyError, TypeError, RelgateError):
                    continue  # a malformed descriptor of a signed root names no object
            return out
        members = sm.load(ws.store, ws.trusted_keys, digest, version).members
    except RelgateError:
        return out  # unreadable: keep the envelope, nothing else can be attributed
    out.add((canonical_key(members.uri), members.object_version))
    return out


def _unknown_outcome(
    ws: Workspace, known: set[str], stored: pa.Table
) -> tuple[set[tuple[str, str]], set[str], list[str]]:
    """Manifests stored without a catalog row: their publication outcome is unknown, so
    the envelope and everything it references are left alone."""
    protected: set[tuple[str, str]] = set()
    names: list[str] = []
    subject = stored["subject"]
    unknown = pc.and_(
        pc.is_valid(subject),
        pc.invert(pc.is_in(subject, value_set=pa.array(sorted(known), pa.large_string()))),
    )
    envelopes = stored.filter(unknown).sort_by("row")
    listed = (envelopes[c].to_pylist() for c in ("key", "version_id", "canonical"))
    for key, version, canonical in zip(*listed, strict=True):
        subject = envelope_subject(canonical)
        if subject is None:
            continue
        names.append(f"{key}@{version}")
        protected.add((canonical, version))
        protected |= _envelope_refs(ws, subject[0], subject[1], version)
    return protected, {key for key, _ in protected}, sorted(names)


def _seen(
    conn: Connection, stored: pa.Table, now: str, *, record: bool
) -> tuple[pa.Table, pa.ChunkedArray]:
    """``gc_seen`` as a table and each stored version's row in it; with ``record``, the
    versions never seen are stamped now."""
    seen = seen_table(conn)
    at = seen_index(stored, seen)
    if record:
        new = unseen(stored, at)
        if new.num_rows:
            gc_table.stamp_seen(conn, zip(*new.to_pydict().values(), strict=True), now)
    return seen, at


#: Roles that belong to a version's audit trail, not to its bytes (kept under the audit
#: retention policy; deleting one does not make the version collected).
AUDIT_ROLES = frozenset({"manifest", "members", "report", "provenance", "approval"})
#: canonical key -> the versions (no longer retained) whose bytes it is
Users = dict[str, set[tuple[str, str]]]


def former_owners(ws: Workspace, retained: Holders) -> tuple[dict[str, str], Users]:
    """(canonical key -> one version no longer retained that referenced it, canonical key
    -> every such version it holds bytes of).  Best effort: a retired version whose
    manifest is already gone attributes nothing.  The first map has one entry per key;
    the second one per (byte object, version) pair, so a sweep can record which versions
    it collected."""
    owners: dict[str, str] = {}
    users: Users = defaultdict(set)
    with ws.db.tx() as conn:
        versions = [
            (kind, row["digest"], row["state"])
            for kind, table in (("snapshot", "snapshots"), ("release", "releases"))
            for row in rows(conn, f"SELECT digest, state FROM {table} ORDER BY digest")  # noqa: S608 constant table names
            if (kind, row["digest"]) not in retained
        ]
    states = {(kind, digest): state for kind, digest, state in versions}
    for chunk in _row_batches(ws, states):
        verified: Verified = []
        for kind, digest, row in chunk:
            try:
                refs = refs_of(ws, kind, digest, row, verified=verified)
            except RelgateError:
                continue
            label = f"{kind} {digest} ({states[(kind, digest)]}, not retained)"
            for ref in refs:
                owners.setdefault(ref.key, label)
                if ref.role not in AUDIT_ROLES:
                    users[ref.key].add((kind, digest))
        _record_verified(ws, verified)
    return owners, dict(users)


@dataclass
class _Required:
    """The mark phase's result: every (key, version) retained versions reference."""

    pairs: set[tuple[str, str]] = field(default_factory=set)
    keys: set[str] = field(default_factory=set)
    gaps: set[str] = field(default_factory=set)

    def add(self, refs: Iterable[Ref]) -> None:
        for ref in refs:
            self.pairs.add((ref.key, ref.version_id))
            self.keys.add(ref.key)

    def holds(self, key: str, version_id: str) -> bool:
        """Required, or another spelling of a required key (never delete either)."""
        ck = canonical_key(key)
        return (ck, version_id) in self.pairs or (ck != key and ck in self.keys)


def _mark_required(
    ws: Workspace, retained: Holders, stored: pa.Table, *, raw_sources: bool
) -> tuple[pa.Table, set[str]]:
    """(the required pairs, missing raw-source objects).  Fails closed, naming the first
    missing managed object in mark order, before an unreadable manifest marked later."""
    refs: list[Ref] = []
    gaps: set[str] = set()
    failure: RelgateError | None = None
    try:
        for ref in mark_each(ws, retained, raw_sources=raw_sources):
            refs.append(ref)
            if not ref.managed and ref.role == "raw-source":
                try:
                    ws.store.head(ref.key, ref.version_id)
                except RelgateError:
                    gaps.add(ref.name)
    except RelgateError as exc:
        failure = exc
    managed = [(i, r) for i, r in enumerate(refs) if r.managed]
    wanted = pa.table(
        {
            "order": pa.array([i for i, _ in managed], pa.int64()),
            "canonical": pa.array([r.key for _, r in managed], pa.large_string()),
            "version_id": pa.array([r.version_id for _, r in managed], pa.large_string()),
        }
    )
    absent = first_absent(wanted, stored)
    if absent is not None:
        raise _missing(refs[absent])
    if failure is not None:
        raise failure
    return pairs_table((r.key, r.version_id) for r in refs), gaps


@collector_paused()
def plan_gc(
    ws: Workspace,
    *,
    grace_seconds: int = DEFAULT_GRACE_SECONDS,
    now: dt.datetime | None = None,
    record: bool = True,
) -> Plan:
    """Dry run: what a sweep would delete now, and why; raises when a retained version is
    incomplete.  ``record`` remembers when each object version was first seen (the grace
    period counts from there); it never deletes anything.  Runs with the cyclic collector
    paused (:mod:`relgate.heap`: a million listed rows would otherwise cost it seconds)."""
    if grace_seconds < 0:
        raise UsageError("grace period must be >= 0", object="gc", check="grace")
    moment = now or now_utc()
    stamp = format_time(moment)
    stored = list_stored(ws)
    with ws.db.tx() as conn:
        retained = retained_versions(conn, moment)
        raw = raw_sources_kept(conn)
        leased = leased_keys(conn, moment)
        known = known_digests(conn)
        names = name_roots(ws, conn)
        erased = erased_versions(conn)
        audit_policy = get_audit_policy(conn)
        trail, audit_kept = audit_refs(conn, retained, moment, audit_policy)
    required, gaps = _mark_required(ws, retained, stored, raw_sources=raw)
    protected, protected_keys, unknown = _unknown_outcome(ws, known, stored)
    with ws.db.tx() as conn:
        seen, at = _seen(conn, stored, stamp, record=record)
    cutoff = format_time(moment - dt.timedelta(seconds=grace_seconds))
    exclusions = Exclusions(
        required,
        pairs_table(protected),
        sorted(protected_keys),
        sorted(leased),
        sorted(names),
        pairs_table((r.key, r.version_id) for r in trail),
    )
    classified = classify(stored, exclusions, seen, stamp, cutoff, at)
    former, users = former_owners(ws, retained)
    owners = owners_table(former)
    return Plan(
        now=stamp,
        grace_seconds=grace_seconds,
        retained=retained,
        required_table=required,
        stored=stored.num_rows,
        stored_bytes=int(pc.sum(stored["size"]).as_py() or 0),
        candidate_table=candidate_table(classified, owners),
        excluded=excluded_counts(classified),
        unknown_outcome=unknown,
        raw_source_gaps=sorted(gaps),
        names=names,
        audit_policy=audit_policy,
        audit_kept=audit_kept,
        users=users,
        erased=erased,
    )


def _record_run(
    ws: Workspace, run_id: str, mode: str, actor: str, grace: int, started: str
) -> None:
    with ws.db.tx() as conn:
        gc_table.start_run(
            conn, run_id=run_id, mode=mode, actor=actor, grace_seconds=grace, now=started
        )


def _finish_run(ws: Workspace, run_id: str, outcome: str, summary: dict[str, object]) -> None:
    with ws.db.tx() as conn:
        gc_table.finish_run(conn, run_id, outcome, summary)


@dataclass
class _Sweep:
    """A sweep in progress: what is marked so far, what was deleted, what was skipped."""

    ws: Workspace
    run_id: str
    grace_seconds: int
    marked: set[tuple[str, str]]
    required: _Required
    audit_policy: AuditPolicy = field(default_factory=AuditPolicy)
    audit: set[tuple[str, str]] = field(default_factory=set)
    users: Users = field(default_factory=dict)
    deleted: list[Deletion] = field(default_factory=list)
    skipped: dict[str, int] = field(default_factory=lambda: defaultdict(int))

    def remark(self, conn: Connection, moment: dt.datetime) -> None:
        """Re-referenced since the plan (a new version, pin or reader lease): mark it now;
        a missing object of a now-retained version fails closed."""
        fresh = set(retained_versions(conn, moment)) - self.marked
        if fresh:
            self.required.add(list(mark(self.ws, conn, fresh, raw_sources=False)))
            self.marked |= fresh

    def reaudit(self, conn: Connection, moment: dt.datetime) -> None:
        """The audit policy changed since the plan: what it keeps now, read in the gate."""
        policy = get_audit_policy(conn)
        if policy != self.audit_policy:
            refs, _ = audit_refs(conn, retained_versions(conn, moment), moment, policy)
            self.audit = {(r.key, r.version_id) for r in refs}
            self.audit_policy = policy

    def batch(self, batch: list[Candidate]) -> None:
        """One batch, inside the gate: re-mark, re-check leases and grace, delete."""
        with self.ws.db.gate_tx() as conn:
            moment = now_utc()
            self.remark(conn, moment)
            named = name_roots(self.ws, conn)
            self.reaudit(conn, moment)
            leased = leased_keys(conn, moment)
            cutoff = format_time(moment - dt.timedelta(seconds=self.grace_seconds))
            seen = _seen_in(conn, batch)
            for cand in batch:
                if self.required.holds(cand.key, cand.version_id):
                    self.skipped["re-referenced"] += 1
                elif canonical_key(cand.key) in named:
                    self.skipped["named"] += 1
                elif (canonical_key(cand.key), cand.version_id) in self.audit:
                    self.skipped["audit-trail"] += 1
                elif canonical_key(cand.key) in leased:
                    self.skipped["publisher-lease"] += 1
                elif (first := seen.get((cand.key, cand.version_id))) is None or first > cutoff:
                    self.skipped["younger-than-grace"] += 1
                else:
                    self.delete(conn, cand, format_time(moment))

    def delete(self, conn: Connection, cand: Candidate, at: str) -> None:
        """Record the deletion and its reason, then delete that exact object version."""
        gc_table.record_deletion(
            conn,
            run_id=self.run_id,
            object_key=canonical_key(cand.key),
            version_id=cand.version_id,
            size=cand.size,
            reason=cand.reason,
            now=at,
        )
        try:
            self.ws.store.delete_version(cand.key, cand.version_id)
        except NotFoundError:
            self.skipped["already-gone"] += 1
            return
        self.deleted.append(
            Deletion(key=cand.key, version_id=cand.version_id, size=cand.size, reason=cand.reason)
        )
        for kind, digest in sorted(self.users.get(canonical_key(cand.key), ())):
            gc_table.record_collected(conn, kind=kind, digest=digest, run_id=self.run_id, now=at)


def sweep(
    ws: Workspace,
    *,
    actor: str,
    grace_seconds: int = DEFAULT_GRACE_SECONDS,
    batch_size: int = SWEEP_BATCH,
    plan: Plan | None = None,
) -> SweepResult:
    """Delete the plan's candidates, each re-checked inside the gate after the grace period.

    ``plan`` is an earlier dry run to act on (default: plan now); whatever changed since
    it was made is caught by the in-gate recheck, never trusted from the plan.
    """
    run_id = "gc-" + uuid.uuid4().hex[:12]
    _record_run(ws, run_id, "sweep", actor, grace_seconds, utcnow())
    state: _Sweep | None = None
    try:
        if plan is None:
            plan = plan_gc(ws, grace_seconds=grace_seconds)
        required = _Required(plan.required, plan.required_keys)
        state = _Sweep(
            ws,
            run_id,
            grace_seconds,
            set(plan.retained),
            required,
            plan.audit_policy,
            users=plan.users,
        )
        starts = range(0, plan.candidate_count, batch_size)
        for start in track(starts, "sweep batches", total=len(starts)):
            state.batch(plan.candidate_rows(start, start + batch_size))
    except RelgateError as exc:
        done = len(state.deleted) if state else 0
        _finish_run(ws, run_id, "FAILED", {"error": exc.to_json(), "deleted": done})
        raise
    summary = SweepSummary(
        gc_run=run_id,
        grace_seconds=grace_seconds,
        retained=len(state.marked),
        candidates=plan.candidate_count,
        deleted_count=len(state.deleted),
        deleted_bytes=sum(d.size for d in state.deleted),
        skipped=dict(sorted(state.skipped.items())),
        excluded=dict(sorted(plan.excluded.items())),
    )
    _finish_run(ws, run_id, "DONE", summary.to_json())
    return SweepResult(**dict(summary), deleted=state.deleted)


def _seen_in(conn: Connection, batch: list[Candidate]) -> dict[tuple[str, str], str]:
    wanted = {(c.key, c.version_id) for c in batch}
    out = {}
    keys = sorted({k for k, _ in wanted})
    for start in range(0, len(keys), _SEEN_CHUNK):
        chunk = keys[start : start + _SEEN_CHUNK]
        marks = ", ".join(f":k{i}" for i in range(len(chunk)))
        for row in rows(
            conn,
            f"SELECT object_key, version_id, first_seen FROM gc_seen WHERE object_key IN ({marks})",  # noqa: S608 bind-parameter names only
            {f"k{i}": k for i, k in enumerate(chunk)},
        ):
            if (row["object_key"], row["version_id"]) in wanted:
                out[(row["object_key"], row["version_id"])] = row["first_seen"]
    return out


def deletions(ws: Workspace, run_id: str | None = None) -> list[DeletionRecord]:
    sql = "SELECT run_id, object_key, version_id, size, reason, at FROM gc_deletions"
    params: dict[str, str] = {}
    if run_id:
        sql += " WHERE run_id = :r"
        params["r"] = run_id
    with ws.db.tx() as conn:
        found = rows(conn, sql + " ORDER BY id", params)
    return [DeletionRecord.model_validate(r) for r in found]


def verify_retained(ws: Workspace) -> RetainedCheck:
    """Every retained version end to end: signed manifest, then every referenced object
    read from its exact version and hashed against the digest its key names."""
    checked = 0
    with ws.db.tx() as conn:
        retained = retained_versions(conn, now_utc())
    for ref in mark_each(ws, retained, raw_sources=False):
        if ref.role == "manifest":  # recognised by mark(); verified in full here
            verify_stored(ws.store, ws.trusted_keys, *_kind_of(ref), ref.version_id)
            continue
        try:
            data = ws.store.get(ref.key, ref.version_id)
        except RelgateError:
            raise RejectedError(
                f"{ref.role} of a retained version is missing",
                object=ref.name,
                check="retained-object-present",
                digest=ref.subject,
            ) from None
        expected = digest_named_by(ref.key)
        if expected is not None and sha256_digest(data) != expected:
            raise IntegrityError(
                f"{ref.role} of a retained version does not match its content address",
                object=ref.name,
                check="storage-digest",
                digest=ref.subject,
            )
        checked += 1
    return RetainedCheck(versions=len(retained), objects=checked)


def _kind_of(ref: Ref) -> tuple[str, str]:
    """(kind, digest) of a manifest reference."""
    subject = envelope_subject(ref.key)
    if subject is None:
        raise UsageError("not a manifest key", object=ref.name, check="manifest-key")
    return subject


def parse_duration(text: str) -> int:
    """``90``, ``90s``, ``15m``, ``6h``, ``7d`` -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600, "d": 86400}
    value = text.strip().lower()
    try:
        if value and value[-1] in units:
            return int(value[:-1]) * units[value[-1]]
        return int(value)
    except ValueError:
        raise UsageError(
            "duration must look like 90s, 15m, 6h or 7d", object=text, check="duration"
        ) from None


__all__ = [
    "Candidate",
    "Deletion",
    "DeletionRecord",
    "Plan",
    "PlanReport",
    "RetainedCheck",
    "SweepResult",
    "SweepSummary",
    "deletions",
    "parse_duration",
    "parse_time",
    "plan_gc",
    "sweep",
    "verify_retained",
]
