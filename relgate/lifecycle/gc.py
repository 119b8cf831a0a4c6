"""Fail-closed garbage collection: plan (the default) and sweep (explicit).

Mark
    The required set is every object referenced by every retained version (see
    :mod:`relgate.lifecycle.retention` and :mod:`relgate.lifecycle.refs`).  A retained
    manifest that is missing or does not verify, or a referenced object that is not
    stored, fails the whole plan, naming it.

Candidates
    Stored object versions under the managed prefixes, minus the required set (compared
    by canonical key, so two spellings of one key are one object), minus versions the
    collector first saw less than the grace period ago, minus keys leased by in-progress
    publishers, minus versions held by reader leases (those are retained versions), minus
    everything a manifest without a catalog row references (its publication outcome is
    unknown), minus stored keys that are another spelling of a required key.

Sweep
    Plans, then takes each batch of candidates through :meth:`Database.gate_tx`: inside
    the gate it re-reads the retained set (new versions, pins, leases), re-marks anything
    newly retained, re-checks the grace period and the leases, records the deletion and
    its reason in ``gc_deletions`` and deletes that exact object version.  A pin that
    commits before the batch is honoured; one that commits after sees the record.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, text

from relgate.catalog.db import execute, rows, utcnow
from relgate.errors import IntegrityError, NotFoundError, RejectedError, RelgateError, UsageError
from relgate.integrity.digests import sha256_digest
from relgate.lifecycle.pins import leased_keys
from relgate.lifecycle.refs import MANAGED_PREFIXES, Ref, version_refs
from relgate.lifecycle.retention import (
    Holders,
    format_time,
    now_utc,
    parse_time,
    raw_sources_kept,
    retained_versions,
)
from relgate.objects.layout import canonical_key
from relgate.release import root as rm
from relgate.snapshot import manifest as sm
from relgate.workspace import Workspace

DEFAULT_GRACE_SECONDS = 6 * 3600
SWEEP_BATCH = 256


@dataclass(frozen=True, slots=True)
class Stored:
    key: str  # exactly as the store lists it
    version_id: str
    size: int
    canonical: str


@dataclass(frozen=True, slots=True)
class Candidate:
    key: str
    version_id: str
    size: int
    first_seen: str
    reason: str

    def to_json(self) -> dict[str, Any]:
        return {
            "key": self.key,
            "versionId": self.version_id,
            "size": self.size,
            "firstSeen": self.first_seen,
            "reason": self.reason,
        }


@dataclass
class Plan:
    now: str
    grace_seconds: int
    retained: Holders
    required: set[tuple[str, str]]
    required_keys: set[str]
    stored: int
    stored_bytes: int
    candidates: list[Candidate]
    excluded: dict[str, int] = field(default_factory=dict)
    unknown_outcome: list[str] = field(default_factory=list)
    raw_source_gaps: list[str] = field(default_factory=list)

    def to_json(self, *, limit: int | None = None) -> dict[str, Any]:
        shown = self.candidates if limit is None else self.candidates[:limit]
        return {
            "mode": "plan",
            "at": self.now,
            "graceSeconds": self.grace_seconds,
            "retained": [
                {"kind": k, "digest": d, "heldBy": sorted(set(r))}
                for (k, d), r in sorted(self.retained.items())
            ],
            "requiredObjects": len(self.required),
            "storedObjects": self.stored,
            "storedBytes": self.stored_bytes,
            "candidateCount": len(self.candidates),
            "candidateBytes": sum(c.size for c in self.candidates),
            "candidates": [c.to_json() for c in shown],
            "excluded": dict(sorted(self.excluded.items())),
            "unknownOutcome": self.unknown_outcome,
            "rawSourceGaps": self.raw_source_gaps,
        }


def list_stored(ws: Workspace) -> Iterator[Stored]:
    for prefix in MANAGED_PREFIXES:
        for version in ws.store.list_versions(prefix):
            yield Stored(version.key, version.version_id, version.size, canonical_key(version.key))


def mark(
    ws: Workspace, conn: Connection, retained: Iterable[tuple[str, str]], *, raw_sources: bool
) -> Iterator[Ref]:
    """Stream the references of every retained version (one version in memory at a time)."""
    for kind, digest in sorted(retained):
        yield from version_refs(ws, conn, kind, digest, raw_sources=raw_sources)


def mark_each(
    ws: Workspace, retained: Iterable[tuple[str, str]], *, raw_sources: bool
) -> Iterator[Ref]:
    """Like :func:`mark`, one short catalog transaction per version, none held while the
    caller consumes (on SQLite every transaction holds the writer lock)."""
    for kind, digest in sorted(retained):
        with ws.db.tx() as conn:
            refs = version_refs(ws, conn, kind, digest, raw_sources=raw_sources)
        yield from refs


def _check_present(ref: Ref, stored_index: set[tuple[str, str]], ws: Workspace) -> str | None:
    """Fail closed on a missing managed object; return a missing raw-source object."""
    if ref.managed:
        if (ref.key, ref.version_id) not in stored_index:
            raise RejectedError(
                f"{ref.role} referenced by a retained version is missing; garbage"
                " collection fails closed",
                object=ref.name,
                check="retained-object-present",
                digest=ref.subject,
            )
    elif ref.role == "raw-source":
        try:
            ws.store.head(ref.key, ref.version_id)
        except RelgateError:
            return ref.name
    return None


def known_digests(conn: Connection) -> set[str]:
    known = {r["digest"] for r in rows(conn, "SELECT digest FROM snapshots")}
    return known | {r["digest"] for r in rows(conn, "SELECT digest FROM releases")}


def _unknown_outcome(
    ws: Workspace, known: set[str], stored: list[Stored]
) -> tuple[set[tuple[str, str]], set[str], list[str]]:
    """Manifests stored without a catalog row: their publication outcome is unknown, so
    the envelope and everything it references are left alone."""
    protected: set[tuple[str, str]] = set()
    keys: set[str] = set()
    names: list[str] = []
    for obj in stored:
        ck = obj.canonical
        for prefix, module in ((sm.MANIFEST_PREFIX, sm), (rm.MANIFEST_PREFIX, rm)):
            if not ck.startswith(prefix) or not ck.endswith(".dsse.json"):
                continue
            digest = "sha256:" + ck[len(prefix) : -len(".dsse.json")]
            if digest in known:
                continue
            names.append(f"{obj.key}@{obj.version_id}")
            protected.add((ck, obj.version_id))
            try:
                manifest = module.load(ws.store, ws.trusted_keys, digest, obj.version_id)
            except RelgateError:
                continue  # unreadable: keep the envelope, nothing else can be attributed
            body = manifest.body
            if module is rm:
                from relgate.release.verifier import object_key

                for d in body.get("shards", []):
                    try:
                        protected.add((canonical_key(object_key(d)), str(d["objectVersion"])))
                    except (KeyError, TypeError):
                        continue
            else:
                members = body.get("members", {})
                if isinstance(members, dict) and "uri" in members:
                    protected.add(
                        (canonical_key(members["uri"]), str(members.get("objectVersion")))
                    )
    for key, _ in protected:
        keys.add(key)
    return protected, keys, sorted(names)


def _seen(
    conn: Connection, stored: list[Stored], now: str, *, record: bool
) -> dict[tuple[str, str], str]:
    stamps: dict[str, str] = {}  # one string per distinct timestamp, not per row
    first: dict[tuple[str, str], str] = {
        (key, version): stamps.setdefault(seen, seen)
        for key, version, seen in conn.execute(
            text("SELECT object_key, version_id, first_seen FROM gc_seen")
        )
    }
    new = [s for s in stored if (s.key, s.version_id) not in first]
    for s in new:
        first[(s.key, s.version_id)] = now
    if record and new:
        conn.execute(
            text("INSERT INTO gc_seen (object_key, version_id, first_seen) VALUES (:k, :v, :t)"),
            [{"k": s.key, "v": s.version_id, "t": now} for s in new],
        )
    return first


def former_owners(ws: Workspace, retained: Holders) -> dict[str, str]:
    """Canonical key -> one version no longer retained that referenced it (best effort: a
    retired version whose manifest is already gone attributes nothing).  One entry per
    key, so memory follows the object count, not the version count."""
    owners: dict[str, str] = {}
    with ws.db.tx() as conn:
        versions = [
            (kind, row["digest"], row["state"])
            for kind, table in (("snapshot", "snapshots"), ("release", "releases"))
            for row in rows(conn, f"SELECT digest, state FROM {table} ORDER BY digest")
            if (kind, row["digest"]) not in retained
        ]
    for kind, digest, state in versions:
        try:
            with ws.db.tx() as conn:
                refs = version_refs(ws, conn, kind, digest)
        except RelgateError:
            continue
        label = f"{kind} {digest} ({state}, not retained)"
        for ref in refs:
            owners.setdefault(ref.key, label)
    return owners


def plan_gc(
    ws: Workspace,
    *,
    grace_seconds: int = DEFAULT_GRACE_SECONDS,
    now: dt.datetime | None = None,
    record: bool = True,
) -> Plan:
    """Dry run: what a sweep would delete now, and why; raises when a retained version is
    incomplete.  ``record`` remembers when each object version was first seen (the grace
    period counts from there); it never deletes anything."""
    if grace_seconds < 0:
        raise UsageError("grace period must be >= 0", object="gc", check="grace")
    moment = now or now_utc()
    stamp = format_time(moment)
    stored = list(list_stored(ws))
    index = {(obj.canonical, obj.version_id) for obj in stored}
    with ws.db.tx() as conn:
        retained = retained_versions(conn, moment)
        raw = raw_sources_kept(conn)
        leased = leased_keys(conn, moment)
        known = known_digests(conn)
    required: set[tuple[str, str]] = set()
    required_keys: set[str] = set()
    gaps: list[str] = []
    for ref in mark_each(ws, retained, raw_sources=raw):
        gap = _check_present(ref, index, ws)
        if gap:
            gaps.append(gap)
        required.add((ref.key, ref.version_id))
        required_keys.add(ref.key)
    protected, protected_keys, unknown = _unknown_outcome(ws, known, stored)
    with ws.db.tx() as conn:
        first_seen = _seen(conn, stored, stamp, record=record)
    owners = former_owners(ws, retained)
    cutoff = format_time(moment - dt.timedelta(seconds=grace_seconds))
    excluded: dict[str, int] = defaultdict(int)
    candidates: list[Candidate] = []
    reasons: dict[str | None, str] = {}
    for obj in stored:
        ck = obj.canonical
        if ck != obj.key and ck in required_keys:
            excluded["other-spelling-of-required-key"] += 1
            continue
        if (ck, obj.version_id) in required:
            excluded["required"] += 1
            continue
        if (ck, obj.version_id) in protected or (ck in protected_keys and ck != obj.key):
            excluded["unknown-publication-outcome"] += 1
            continue
        if ck in leased:
            excluded["publisher-lease"] += 1
            continue
        seen = first_seen[(obj.key, obj.version_id)]
        if seen > cutoff:
            excluded["younger-than-grace"] += 1
            continue
        why = owners.get(ck)
        if why not in reasons:  # one string per former owner, not per candidate
            reasons[why] = (
                f"referenced only by versions no longer retained, e.g. {why}"
                if why
                else "referenced by no catalog version (orphan)"
            )
        reason = reasons[why]
        candidates.append(Candidate(obj.key, obj.version_id, obj.size, seen, reason))
    return Plan(
        now=stamp,
        grace_seconds=grace_seconds,
        retained=retained,
        required=required,
        required_keys=required_keys,
        stored=len(stored),
        stored_bytes=sum(s.size for s in stored),
        candidates=candidates,
        excluded=dict(excluded),
        unknown_outcome=unknown,
        raw_source_gaps=sorted(set(gaps)),
    )


def _record_run(
    ws: Workspace, run_id: str, mode: str, actor: str, grace: int, started: str
) -> None:
    with ws.db.tx() as conn:
        execute(
            conn,
            "INSERT INTO gc_runs (run_id, mode, actor, grace_seconds, outcome, summary, started_at)"
            " VALUES (:r, :m, :a, :g, 'RUNNING', '{}', :t)",
            {"r": run_id, "m": mode, "a": actor, "g": grace, "t": started},
        )


def _finish_run(ws: Workspace, run_id: str, outcome: str, summary: dict[str, Any]) -> None:
    with ws.db.tx() as conn:
        execute(
            conn,
            "UPDATE gc_runs SET outcome = :o, summary = :s, finished_at = :t WHERE run_id = :r",
            {"o": outcome, "s": json.dumps(summary, sort_keys=True), "t": utcnow(), "r": run_id},
        )


def sweep(
    ws: Workspace,
    *,
    actor: str,
    grace_seconds: int = DEFAULT_GRACE_SECONDS,
    batch_size: int = SWEEP_BATCH,
    plan: Plan | None = None,
) -> dict[str, Any]:
    """Delete the plan's candidates, each re-checked inside the gate after the grace period.

    ``plan`` is an earlier dry run to act on (default: plan now); whatever changed since
    it was made is caught by the in-gate recheck, never trusted from the plan.
    """
    run_id = "gc-" + uuid.uuid4().hex[:12]
    started = utcnow()
    _record_run(ws, run_id, "sweep", actor, grace_seconds, started)
    deleted: list[dict[str, Any]] = []
    skipped: dict[str, int] = defaultdict(int)
    try:
        if plan is None:
            plan = plan_gc(ws, grace_seconds=grace_seconds)
        marked = set(plan.retained)
        required, required_keys = set(plan.required), set(plan.required_keys)
        for start in range(0, len(plan.candidates), batch_size):
            batch = plan.candidates[start : start + batch_size]
            with ws.db.gate_tx() as conn:
                moment = now_utc()
                retained = retained_versions(conn, moment)
                fresh = set(retained) - marked
                if fresh:
                    # Re-referenced since the plan (a new version, pin or reader lease):
                    # mark it now; a missing object of a now-retained version fails closed.
                    extra = list(mark(ws, conn, fresh, raw_sources=False))
                    required |= {(r.key, r.version_id) for r in extra}
                    required_keys |= {r.key for r in extra}
                    marked |= fresh
                leased = leased_keys(conn, moment)
                cutoff = format_time(moment - dt.timedelta(seconds=grace_seconds))
                seen = _seen_in(conn, batch)
                for cand in batch:
                    ck = canonical_key(cand.key)
                    if (ck, cand.version_id) in required or (
                        ck != cand.key and ck in required_keys
                    ):
                        skipped["re-referenced"] += 1
                        continue
                    if ck in leased:
                        skipped["publisher-lease"] += 1
                        continue
                    first = seen.get((cand.key, cand.version_id))
                    if first is None or first > cutoff:
                        skipped["younger-than-grace"] += 1
                        continue
                    record = {
                        "r": run_id,
                        "k": ck,
                        "v": cand.version_id,
                        "s": cand.size,
                        "why": cand.reason,
                        "t": format_time(moment),
                    }
                    execute(
                        conn,
                        "INSERT INTO gc_deletions (run_id, object_key, version_id, size, reason, at)"
                        " VALUES (:r, :k, :v, :s, :why, :t)",
                        record,
                    )
                    try:
                        ws.store.delete_version(cand.key, cand.version_id)
                    except NotFoundError:
                        skipped["already-gone"] += 1
                        continue
                    deleted.append(
                        {
                            "key": cand.key,
                            "versionId": cand.version_id,
                            "size": cand.size,
                            "reason": cand.reason,
                        }
                    )
    except RelgateError as exc:
        _finish_run(ws, run_id, "FAILED", {"error": exc.to_json(), "deleted": len(deleted)})
        raise
    summary = {
        "mode": "sweep",
        "gcRun": run_id,
        "graceSeconds": grace_seconds,
        "retained": len(marked),
        "candidates": len(plan.candidates),
        "deletedCount": len(deleted),
        "deletedBytes": sum(d["size"] for d in deleted),
        "skipped": dict(sorted(skipped.items())),
        "excluded": dict(sorted(plan.excluded.items())),
    }
    _finish_run(ws, run_id, "DONE", summary)
    return {**summary, "deleted": deleted}


def _seen_in(conn: Connection, batch: list[Candidate]) -> dict[tuple[str, str], str]:
    wanted = {(c.key, c.version_id) for c in batch}
    out = {}
    keys = sorted({k for k, _ in wanted})
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        marks = ", ".join(f":k{i}" for i in range(len(chunk)))
        for row in rows(
            conn,
            f"SELECT object_key, version_id, first_seen FROM gc_seen WHERE object_key IN ({marks})",
            {f"k{i}": k for i, k in enumerate(chunk)},
        ):
            if (row["object_key"], row["version_id"]) in wanted:
                out[(row["object_key"], row["version_id"])] = row["first_seen"]
    return out


def deletions(ws: Workspace, run_id: str | None = None) -> list[dict[str, Any]]:
    sql = "SELECT run_id, object_key, version_id, size, reason, at FROM gc_deletions"
    params: dict[str, Any] = {}
    if run_id:
        sql += " WHERE run_id = :r"
        params["r"] = run_id
    with ws.db.tx() as conn:
        return rows(conn, sql + " ORDER BY id", params)


def verify_retained(ws: Workspace) -> dict[str, Any]:
    """Every retained version end to end: signed manifest, then every referenced object
    read from its exact version and hashed against the digest its key names."""
    checked = 0
    with ws.db.tx() as conn:
        retained = retained_versions(conn, now_utc())
    for ref in mark_each(ws, retained, raw_sources=False):
        if ref.role == "manifest":
            continue  # opened and signature-checked by mark()
        try:
            data = ws.store.get(ref.key, ref.version_id)
        except RelgateError:
            raise RejectedError(
                f"{ref.role} of a retained version is missing",
                object=ref.name,
                check="retained-object-present",
                digest=ref.subject,
            ) from None
        expected = _digest_named_by(ref.key)
        if expected is not None and sha256_digest(data) != expected:
            raise IntegrityError(
                f"{ref.role} of a retained version does not match its content address",
                object=ref.name,
                check="storage-digest",
                digest=ref.subject,
            )
        checked += 1
    return {"versions": len(retained), "objects": checked}


def _digest_named_by(key: str) -> str | None:
    name = key.rsplit("/", 1)[-1]
    if key.startswith(("cas/sha256/", "shards/sha256/")):
        return "sha256:" + name.split(".", 1)[0]
    return None


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
    "Plan",
    "deletions",
    "parse_duration",
    "parse_time",
    "plan_gc",
    "sweep",
    "verify_retained",
]
