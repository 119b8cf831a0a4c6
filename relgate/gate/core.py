"""The linearizable gate.

One record per alias ``(tombstoneWatermark, benchmarkFence, aliasGeneration,
activeDigest)``; the two fences are global (a revoked sample is revoked everywhere), so
they live in one ``fences`` row that every gate transaction reads first.  Activation,
publication, rollback, admission and both fence advances all run inside
:meth:`Database.gate_tx`, so they are totally ordered: whichever commits first wins and
the other sees its effect.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol

from sqlalchemy import Connection

from relgate.catalog.audit import newest_report
from relgate.catalog.db import Database, execute, one, rows, utcnow
from relgate.catalog.states import TABLES, transition
from relgate.errors import (
    ConflictError,
    IntegrityError,
    NotFoundError,
    RejectedError,
    RelgateError,
    UsageError,
)
from relgate.gate.approvals import approval_kind, missing_approval, open_approval
from relgate.integrity.identifiers import validate_ids
from relgate.integrity.signing import TrustedKeys
from relgate.lifecycle.retention import now_utc, retained_versions
from relgate.objects.cas import ContentRef, ContentStore, digest_of_uri
from relgate.objects.versioned import ObjectStore

#: The state a subject must be in to be activated, and the state activation moves it to.
ACTIVATION = {"snapshot": ("APPROVED", "ACTIVE"), "release": ("APPROVED", "PUBLISHED")}


#: Per fence: the watermark column and the statement that appends one entry.
_FENCE_SQL = {
    "tombstone": (
        "tombstone_watermark",
        "INSERT INTO tombstones (seq, sample_id, reason, actor, state, created_at)"
        " VALUES (:s, :v, :note, :a, 'FENCED', :now)",
    ),
    "benchmark": (
        "benchmark_fence",
        "INSERT INTO benchmark_items (seq, content_digest, benchmark, actor, created_at)"
        " VALUES (:s, :v, :note, :a, :now)",
    ),
}


class MemberIndex(Protocol):
    """Answers which of the given sample ids / content digests are members of a version."""

    def hits(
        self, members: ContentRef, sample_ids: set[str], content_digests: set[str]
    ) -> tuple[set[str], set[str]]: ...


class EnvelopeVerifier(Protocol):
    """Re-opens the stored envelope of a catalog row; raises unless it binds to the row."""

    def verify(self, kind: str, row: dict[str, Any]) -> None: ...

    def verify_approval(self, conn: Connection, kind: str, digest: str) -> None: ...


def _bound_fields(kind: str, body: dict[str, Any]) -> dict[str, Any]:
    """The payload fields a catalog row repeats (the binding is checked field by field)."""
    if kind == "snapshot":
        members = body["members"]
        return {
            "digest": body["snapshotId"],
            "tombstone_watermark": int(body["tombstoneWatermark"]),
            "benchmark_fence": int(body["benchmarkFence"]),
            "members_digest": digest_of_uri(str(members["uri"])),
            "members_version": str(members["objectVersion"]),
            "member_count": int(members["count"]),
            "purpose": body["purpose"],
        }
    return {
        "digest": body["rootId"],
        "tombstone_watermark": int(body["tombstoneWatermark"]),
        "benchmark_fence": int(body["benchmarkFence"]),
        "snapshot_digest": body["datasetSnapshot"],
        "shard_count": int(body["totals"]["shards"]),
        "record_count": int(body["totals"]["records"]),
    }


class StoredEnvelopes:
    """The gate's :class:`EnvelopeVerifier`: trusted signature, recomputed digest, the exact
    stored version the row names, and every payload field the row repeats."""

    def __init__(self, store: ObjectStore, trusted: TrustedKeys) -> None:
        self.store = store
        self.trusted = trusted

    def verify(self, kind: str, row: dict[str, Any]) -> None:
        from relgate.release import root as rm
        from relgate.snapshot import manifest as sm

        module = sm if kind == "snapshot" else rm
        digest = str(row["digest"])
        key = module.envelope_key(digest)
        try:
            body = module.load(self.store, self.trusted, digest, str(row["envelope_version"])).body
            bound = _bound_fields(kind, body)
        except RelgateError as exc:
            raise IntegrityError(
                f"stored {kind} envelope refused: {exc.message}",
                object=f"{key}@{row['envelope_version']}",
                check=exc.check or "stored-envelope",
                digest=digest,
                details={"cause": exc.code},
            ) from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise IntegrityError(
                f"stored {kind} envelope lacks a field its catalog row repeats",
                object=f"{key}@{row['envelope_version']}",
                check="envelope-binding",
                digest=digest,
                details={"cause": type(exc).__name__},
            ) from None
        differs = sorted(f for f, v in bound.items() if row.get(f) != v)
        if differs:
            raise IntegrityError(
                f"stored {kind} envelope does not bind to its catalog row",
                object=f"{key}@{row['envelope_version']}",
                check="envelope-binding",
                digest=digest,
                details={"fields": differs},
            )

    def verify_approval(self, conn: Connection, kind: str, digest: str) -> None:
        """The newest signed approval of ``digest``: an approver-role signature naming it.

        An APPROVED state in the catalog is not enough: a row edited to APPROVED, or an
        approval signed by any key but a trusted approver key, moves nothing."""
        row = newest_report(conn, digest, approval_kind(kind))
        if row is None:
            raise missing_approval(kind, digest)
        where = f"approval {row['report_digest']}@{row['report_version']}"
        try:
            envelope = ContentStore(self.store).get(
                str(row["report_digest"]), str(row["report_version"])
            )
            open_approval(envelope, self.trusted, kind, digest, subject=where)
        except RelgateError as exc:
            raise IntegrityError(
                f"signed approval refused: {exc.message}",
                object=where,
                check=exc.check or "approval",
                digest=digest,
                details={"cause": exc.code},
            ) from None


@dataclass(frozen=True)
class Fences:
    tombstone_watermark: int
    benchmark_fence: int


@dataclass(frozen=True)
class AliasState:
    alias: str
    kind: str
    generation: int
    active_digest: str | None
    fences: Fences

    def to_json(self) -> dict[str, Any]:
        return {
            "alias": self.alias,
            "kind": self.kind,
            "generation": self.generation,
            "activeDigest": self.active_digest,
            "tombstoneWatermark": self.fences.tombstone_watermark,
            "benchmarkFence": self.fences.benchmark_fence,
        }


@dataclass(frozen=True)
class FenceAdvance:
    kind: str  # "tombstone" | "benchmark"
    first_seq: int
    watermark: int
    hits: dict[str, list[int]] = field(default_factory=dict)  # subject digest -> fence seqs
    closed_permits: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {
            "fence": self.kind,
            "firstSeq": self.first_seq,
            "watermark": self.watermark,
            "hits": {d: len(s) for d, s in sorted(self.hits.items())},
            "closedPermits": self.closed_permits,
        }


#: Called inside the gate transaction after a fence advance recorded hits; returns the
#: ids of permits it closed.  The release layer registers one to close permits.
HitListener = Callable[[Connection, str, dict[str, list[int]]], list[str]]


def read_fences(conn: Connection) -> Fences:
    row = one(conn, "SELECT tombstone_watermark, benchmark_fence FROM fences WHERE id = 1")
    if row is None:
        raise NotFoundError(
            "gate has no fences row; run `relgate init`", object="fences", check="initialised"
        )
    return Fences(int(row["tombstone_watermark"]), int(row["benchmark_fence"]))


def fenced_entries(conn: Connection, fences: Fences) -> tuple[set[str], set[str]]:
    """Sample ids tombstoned and content digests fenced at or below ``fences``."""
    tombs = rows(
        conn, "SELECT sample_id FROM tombstones WHERE seq <= :w", {"w": fences.tombstone_watermark}
    )
    bench = rows(
        conn,
        "SELECT content_digest FROM benchmark_items WHERE seq <= :w",
        {"w": fences.benchmark_fence},
    )
    return {t["sample_id"] for t in tombs}, {b["content_digest"] for b in bench}


def read_alias(conn: Connection, alias: str, kind: str) -> tuple[int, str | None]:
    row = one(
        conn, "SELECT kind, generation, active_digest FROM aliases WHERE name = :n", {"n": alias}
    )
    if row is None:
        return 0, None
    if row["kind"] != kind:
        raise UsageError(
            f"alias {alias!r} points at a {row['kind']}, not a {kind}",
            object=alias,
            check="alias-kind",
        )
    return int(row["generation"]), row["active_digest"]


class Gate:
    def __init__(
        self, db: Database, members: MemberIndex, *, envelopes: EnvelopeVerifier | None = None
    ) -> None:
        self.db = db
        self.members = members
        self.envelopes = envelopes
        self.listeners: list[HitListener] = []

    # -- reads ---------------------------------------------------------------------------
    def fences(self) -> Fences:
        with self.db.tx() as conn:
            return read_fences(conn)

    def alias(self, alias: str, kind: str = "snapshot") -> AliasState:
        with self.db.tx() as conn:
            generation, digest = read_alias(conn, alias, kind)
            return AliasState(alias, kind, generation, digest, read_fences(conn))

    def alias_history(self, alias: str) -> list[dict[str, Any]]:
        with self.db.tx() as conn:
            return rows(
                conn,
                "SELECT * FROM alias_history WHERE name = :n ORDER BY generation",
                {"n": alias},
            )

    def hits_for(self, digest: str) -> list[dict[str, Any]]:
        with self.db.tx() as conn:
            return rows(
                conn,
                "SELECT fence_kind, fence_seq FROM fence_hits WHERE subject_digest = :d ORDER BY fence_kind, fence_seq",
                {"d": digest},
            )

    # -- activation / publication ----------------------------------------------------------
    def activate(
        self, kind: str, alias: str, digest: str, *, expected_generation: int | None, actor: str
    ) -> dict[str, Any]:
        """CAS the alias from ``expected_generation`` to ``digest``.

        Succeeds only if both fences still equal the version's recorded watermarks, the
        alias generation is unchanged and the version is approved.  A retry of a CAS that
        already committed with the same digest returns the committed result.
        """
        need_state, new_state = ACTIVATION[kind]
        table = TABLES[kind][0]
        with self.db.gate_tx() as conn:
            fences = read_fences(conn)
            generation, active = read_alias(conn, alias, kind)
            if expected_generation is None:
                expected_generation = generation  # CAS against what this transaction read
            subject = one(
                conn,
                f"SELECT state, tombstone_watermark, benchmark_fence FROM {table} WHERE digest = :d",
                {"d": digest},
            )
            if subject is None:
                raise NotFoundError(f"unknown {kind}", object=kind, check="exists", digest=digest)
            if generation == expected_generation + 1 and active == digest:
                last = one(
                    conn,
                    "SELECT action FROM alias_history WHERE name = :n AND generation = :g",
                    {"n": alias, "g": generation},
                )
                if last is not None and last["action"] == "activate":
                    return self._result(alias, kind, generation, digest, fences, idempotent=True)
            if generation != expected_generation:
                raise ConflictError(
                    f"alias {alias!r} is at generation {generation}, not {expected_generation}",
                    object=alias,
                    check="alias-generation",
                    digest=digest,
                    details={"generation": generation, "activeDigest": active},
                )
            wm = (int(subject["tombstone_watermark"]), int(subject["benchmark_fence"]))
            if wm != (fences.tombstone_watermark, fences.benchmark_fence):
                raise ConflictError(
                    "a fence advanced since this version was built; build a new one",
                    object=alias,
                    check="fence-watermarks",
                    digest=digest,
                    details={
                        "manifest": {"tombstoneWatermark": wm[0], "benchmarkFence": wm[1]},
                        "gate": {
                            "tombstoneWatermark": fences.tombstone_watermark,
                            "benchmarkFence": fences.benchmark_fence,
                        },
                    },
                )
            if subject["state"] != need_state:
                raise RejectedError(
                    f"{kind} is {subject['state']}, activation needs {need_state}",
                    object=kind,
                    check="state",
                    digest=digest,
                )
            self._check_no_hits(conn, kind, digest)
            self.verify_envelope(conn, kind, digest)
            self.verify_approval(conn, kind, digest)
            self._set_alias(conn, alias, kind, generation + 1, digest, "activate", actor, fences)
            transition(
                conn,
                kind,
                digest,
                new_state,
                actor=actor,
                reason=f"alias {alias} generation {generation + 1}",
            )
            return self._result(alias, kind, generation + 1, digest, fences, idempotent=False)

    def rollback(
        self, kind: str, alias: str, digest: str, *, expected_generation: int | None, actor: str
    ) -> dict[str, Any]:
        """Append a higher generation pointing at a digest the alias held before."""
        table = TABLES[kind][0]
        with self.db.gate_tx() as conn:
            fences = read_fences(conn)
            generation, active = read_alias(conn, alias, kind)
            if expected_generation is None:
                expected_generation = generation  # CAS against what this transaction read
            if generation == expected_generation + 1 and active == digest:
                last = one(
                    conn,
                    "SELECT action FROM alias_history WHERE name = :n AND generation = :g",
                    {"n": alias, "g": generation},
                )
                if last is not None and last["action"] == "rollback":
                    return self._result(alias, kind, generation, digest, fences, idempotent=True)
            if generation != expected_generation:
                raise ConflictError(
                    f"alias {alias!r} is at generation {generation}, not {expected_generation}",
                    object=alias,
                    check="alias-generation",
                    digest=digest,
                )
            held = one(
                conn,
                "SELECT generation FROM alias_history WHERE name = :n AND digest = :d ORDER BY generation LIMIT 1",
                {"n": alias, "d": digest},
            )
            if held is None:
                raise RejectedError(
                    f"alias {alias!r} never pointed at this digest",
                    object=alias,
                    check="rollback-target",
                    digest=digest,
                )
            if active == digest:
                raise RejectedError(
                    "digest is already active", object=alias, check="rollback-target", digest=digest
                )
            # Garbage collection purged this version once nothing retained it.
            envelope = f"manifests/{kind}s/{digest.removeprefix('sha256:')}.dsse.json"
            if one(conn, "SELECT run_id FROM gc_deletions WHERE object_key = :k", {"k": envelope}):
                raise RejectedError(
                    "garbage collection purged this version (outside the rollback window)",
                    object=envelope,
                    check="rollback-purged",
                    digest=digest,
                )
            subject = one(
                conn,
                f"SELECT tombstone_watermark, benchmark_fence FROM {table} WHERE digest = :d",
                {"d": digest},
            )
            assert subject is not None
            hits = self._hits_since(
                conn,
                kind,
                digest,
                int(subject["tombstone_watermark"]),
                int(subject["benchmark_fence"]),
            )
            if hits:
                raise RejectedError(
                    "fence entries recorded since this version's watermarks hit its members",
                    object=alias,
                    check="rollback-fences",
                    digest=digest,
                    details={k: len(v) for k, v in hits.items()},
                )
            self.verify_envelope(conn, kind, digest)
            self._set_alias(conn, alias, kind, generation + 1, digest, "rollback", actor, fences)
            return self._result(alias, kind, generation + 1, digest, fences, idempotent=False)

    # -- fences ----------------------------------------------------------------------------
    def add_tombstones(self, sample_ids: Iterable[str], *, reason: str, actor: str) -> FenceAdvance:
        ids = sorted(set(validate_ids(sample_ids, kind="tombstone id", where="tombstone")))
        if not ids:
            raise UsageError("no sample ids given", object="tombstone", check="non-empty")
        return self._advance("tombstone", ids, note=reason, actor=actor)

    def add_benchmark_items(
        self, content_digests: Iterable[str], *, benchmark: str, actor: str
    ) -> FenceAdvance:
        digests = sorted(
            set(validate_ids(content_digests, kind="benchmark item", where="benchmark"))
        )
        if not digests:
            raise UsageError("no content digests given", object="benchmark", check="non-empty")
        return self._advance("benchmark", digests, note=benchmark, actor=actor)

    def _advance(
        self, fence_kind: str, values: list[str], *, note: str, actor: str
    ) -> FenceAdvance:
        """Append fence entries, move the watermark, record hits, close hit permits: one txn."""
        column, insert = _FENCE_SQL[fence_kind]
        with self.db.gate_tx() as conn:
            fences = read_fences(conn)
            now = utcnow()
            current = (
                fences.tombstone_watermark if fence_kind == "tombstone" else fences.benchmark_fence
            )
            first = current + 1
            for offset, value in enumerate(values):
                execute(
                    conn,
                    insert,
                    {"s": first + offset, "v": value, "note": note, "a": actor, "now": now},
                )
            watermark = first + len(values) - 1
            execute(
                conn,
                f"UPDATE fences SET {column} = :w, updated_at = :now WHERE id = 1",
                {"w": watermark, "now": now},
            )
            seq_of = {value: first + i for i, value in enumerate(values)}
            fenced = set(values)
            ids, digests = (fenced, set()) if fence_kind == "tombstone" else (set(), fenced)
            hits = self._record_hits(conn, fence_kind, ids, digests, seq_of, now)
            closed = [p for listener in self.listeners for p in listener(conn, fence_kind, hits)]
            return FenceAdvance(fence_kind, first, watermark, hits, closed)

    def tombstones(self, since: int = 0) -> list[dict[str, Any]]:
        with self.db.tx() as conn:
            return rows(conn, "SELECT * FROM tombstones WHERE seq > :s ORDER BY seq", {"s": since})

    def benchmark_items(self, since: int = 0) -> list[dict[str, Any]]:
        with self.db.tx() as conn:
            return rows(
                conn, "SELECT * FROM benchmark_items WHERE seq > :s ORDER BY seq", {"s": since}
            )

    # -- internals -------------------------------------------------------------------------
    def _record_hits(
        self,
        conn: Connection,
        fence_kind: str,
        sample_ids: set[str],
        content_digests: set[str],
        seq_of: dict[str, int],
        now: str,
    ) -> dict[str, list[int]]:
        hits: dict[str, list[int]] = {}
        held = sorted(retained_versions(conn, now_utc()))
        looked_up: dict[tuple[str, str], tuple[set[str], set[str]]] = {}
        for kind, digest in held:
            if kind not in TABLES:
                continue
            row = one(
                conn,
                f"SELECT members_digest, members_version FROM {TABLES[kind][0]} WHERE digest = :d",
                {"d": digest},
            )
            if row is None:
                continue
            members = (str(row["members_digest"]), str(row["members_version"]))
            if members not in looked_up:  # releases of one snapshot share its membership
                ref = ContentRef(members[0], members[1], 0)
                looked_up[members] = self.members.hits(ref, sample_ids, content_digests)
            hit_ids, hit_digests = looked_up[members]
            seqs = sorted({seq_of[x] for x in hit_ids | hit_digests})
            for seq in seqs:
                execute(
                    conn,
                    "INSERT INTO fence_hits (subject_kind, subject_digest, fence_kind, fence_seq, at)"
                    " VALUES (:k, :d, :f, :s, :now)",
                    {"k": kind, "d": digest, "f": fence_kind, "s": seq, "now": now},
                )
            if seqs:
                hits[digest] = seqs
        return hits

    def verify_envelope(self, conn: Connection, kind: str, digest: str) -> dict[str, Any]:
        """Re-open the stored envelope ``digest``'s row names and bind it to the row."""
        row = one(conn, f"SELECT * FROM {TABLES[kind][0]} WHERE digest = :d", {"d": digest})
        if row is None:
            raise NotFoundError(f"unknown {kind}", object=kind, check="exists", digest=digest)
        if self.envelopes is None:  # fail closed: a gate that cannot re-verify moves nothing
            raise RejectedError(
                "this gate has no envelope verifier",
                object=kind,
                check="envelope-verifier",
                digest=digest,
            )
        self.envelopes.verify(kind, row)
        return row

    def verify_approval(self, conn: Connection, kind: str, digest: str) -> None:
        """Re-open the signed approval that ``digest``'s APPROVED state claims."""
        if self.envelopes is None:  # fail closed, as for envelopes
            raise RejectedError(
                "this gate has no envelope verifier",
                object=kind,
                check="envelope-verifier",
                digest=digest,
            )
        self.envelopes.verify_approval(conn, kind, digest)

    def check_root(self, conn: Connection, kind: str, digest: str) -> dict[str, Any]:
        """Admission of an exact root (runs, the barrier): zero hits against the current
        fences, and the stored envelope re-verified.  Returns the catalog row.

        Recorded hits cover every root held when a fence advanced; a root nothing held
        then (retired, not retained) is checked against every fence entry recorded since
        its own watermarks, so both watermarks are compared with the current fences.
        """
        fences = read_fences(conn)
        row = one(conn, f"SELECT * FROM {TABLES[kind][0]} WHERE digest = :d", {"d": digest})
        if row is None:
            raise NotFoundError(f"unknown {kind}", object=kind, check="exists", digest=digest)
        self._check_no_hits(conn, kind, digest)
        marks = (int(row["tombstone_watermark"]), int(row["benchmark_fence"]))
        if marks != (fences.tombstone_watermark, fences.benchmark_fence):
            since = self._hits_since(conn, kind, digest, *marks)
            if since:
                raise RejectedError(
                    "fence entries recorded since this root's watermarks hit its members",
                    object=kind,
                    check="root-watermarks",
                    digest=digest,
                    details={
                        "root": {"tombstoneWatermark": marks[0], "benchmarkFence": marks[1]},
                        "gate": {
                            "tombstoneWatermark": fences.tombstone_watermark,
                            "benchmarkFence": fences.benchmark_fence,
                        },
                        "hits": {k: len(v) for k, v in since.items()},
                    },
                )
        self.verify_envelope(conn, kind, digest)
        return row

    def _check_no_hits(self, conn: Connection, kind: str, digest: str) -> None:
        row = one(
            conn, "SELECT COUNT(*) AS n FROM fence_hits WHERE subject_digest = :d", {"d": digest}
        )
        if row and int(row["n"]):
            raise RejectedError(
                "fence entries hit members of this version",
                object=kind,
                check="fence-hits",
                digest=digest,
            )

    def _hits_since(
        self, conn: Connection, kind: str, digest: str, tomb_wm: int, bench_wm: int
    ) -> dict[str, list[int]]:
        tombs = rows(conn, "SELECT seq, sample_id FROM tombstones WHERE seq > :s", {"s": tomb_wm})
        bench = rows(
            conn, "SELECT seq, content_digest FROM benchmark_items WHERE seq > :s", {"s": bench_wm}
        )
        if not tombs and not bench:
            return {}
        table = TABLES[kind][0]
        row = one(
            conn,
            f"SELECT members_digest, members_version FROM {table} WHERE digest = :d",
            {"d": digest},
        )
        assert row is not None
        ref = ContentRef(row["members_digest"], row["members_version"], 0)
        hit_ids, hit_digests = self.members.hits(
            ref, {t["sample_id"] for t in tombs}, {b["content_digest"] for b in bench}
        )
        out: dict[str, list[int]] = {}
        if hit_ids:
            out["tombstone"] = sorted(int(t["seq"]) for t in tombs if t["sample_id"] in hit_ids)
        if hit_digests:
            out["benchmark"] = sorted(
                int(b["seq"]) for b in bench if b["content_digest"] in hit_digests
            )
        return out

    def _set_alias(
        self,
        conn: Connection,
        alias: str,
        kind: str,
        generation: int,
        digest: str,
        action: str,
        actor: str,
        fences: Fences,
    ) -> None:
        now = utcnow()
        if generation == 1:
            execute(
                conn,
                "INSERT INTO aliases (name, kind, generation, active_digest, updated_at) VALUES (:n, :k, 1, :d, :now)",
                {"n": alias, "k": kind, "d": digest, "now": now},
            )
        else:
            changed = execute(
                conn,
                "UPDATE aliases SET generation = :g, active_digest = :d, updated_at = :now"
                " WHERE name = :n AND generation = :prev",
                {"g": generation, "d": digest, "now": now, "n": alias, "prev": generation - 1},
            )
            if changed != 1:
                raise ConflictError(
                    "alias changed concurrently",
                    object=alias,
                    check="alias-generation",
                    digest=digest,
                )
        execute(
            conn,
            "INSERT INTO alias_history (name, generation, digest, action, actor, tombstone_watermark,"
            " benchmark_fence, at) VALUES (:n, :g, :d, :a, :who, :t, :b, :now)",
            {
                "n": alias,
                "g": generation,
                "d": digest,
                "a": action,
                "who": actor,
                "t": fences.tombstone_watermark,
                "b": fences.benchmark_fence,
                "now": now,
            },
        )

    @staticmethod
    def _result(
        alias: str, kind: str, generation: int, digest: str, fences: Fences, *, idempotent: bool
    ) -> dict[str, Any]:
        return {
            "alias": alias,
            "kind": kind,
            "generation": generation,
            "activeDigest": digest,
            "tombstoneWatermark": fences.tombstone_watermark,
            "benchmarkFence": fences.benchmark_fence,
            "idempotentRetry": idempotent,
        }
