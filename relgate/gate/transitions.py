"""The linearizable gate: one object that runs every alias move and fence advance.

One record per alias ``(tombstoneWatermark, benchmarkFence, aliasGeneration,
activeDigest)``; the two fences are global (a revoked sample is revoked everywhere), so
they live in one ``fences`` row that every gate transaction reads first.  Activation,
publication, rollback, admission and both fence advances all run inside
:meth:`Database.gate_tx`, so they are totally ordered: whichever commits first wins and
the other sees its effect.  Build it with :meth:`relgate.workspace.Workspace.gate`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from sqlalchemy import Connection

from relgate.catalog import gc_table
from relgate.catalog.alias_table import AliasMove
from relgate.catalog.db import Database, one, utcnow
from relgate.catalog.events import GateOperation, Outcome, record, refusals_recorded
from relgate.catalog.states import transition
from relgate.catalog.versions import VersionRecord, read_release, read_version
from relgate.errors import ConflictError, RejectedError, UsageError
from relgate.gate.aliases import (
    AliasChange,
    AliasHistoryEntry,
    AliasState,
    alias_change,
    alias_history,
    alias_kind,
    committed_retry,
    read_alias,
    set_alias,
    stale_generation,
)
from relgate.gate.envelopes import (
    EnvelopeVerifier,
    StoredEnvelopes,
    verify_envelope,
    verify_signed_approval,
)
from relgate.gate.fences import (
    BenchmarkEntry,
    FenceAdvance,
    Fences,
    TombstoneEntry,
    append_entries,
    entries_after,
    read_fences,
)
from relgate.gate.hits import (
    HitRecord,
    MemberIndex,
    check_no_hits,
    close_hit_permits,
    hits_on,
    hits_since,
    record_hits,
)
from relgate.gate.members import CatalogMemberIndex
from relgate.integrity.identifiers import validate_ids
from relgate.objects.layout import envelope_key
from relgate.workspace import Workspace

#: The state a subject must be in to be activated, and the state activation moves it to.
ACTIVATION = {"snapshot": ("APPROVED", "ACTIVE"), "release": ("APPROVED", "PUBLISHED")}


def _watermark_details(marks: tuple[int, int], fences: Fences, label: str) -> dict[str, object]:
    return {
        label: {"tombstoneWatermark": marks[0], "benchmarkFence": marks[1]},
        "gate": {
            "tombstoneWatermark": fences.tombstone_watermark,
            "benchmarkFence": fences.benchmark_fence,
        },
    }


class Gate:
    """Every alias move, fence advance and root admission, each in one gate transaction."""

    def __init__(self, db: Database, members: MemberIndex, envelopes: EnvelopeVerifier) -> None:
        self.db = db
        self.members = members
        self.envelopes = envelopes

    # -- reads ---------------------------------------------------------------------------
    def fences(self) -> Fences:
        with self.db.tx() as conn:
            return read_fences(conn)

    def alias(self, alias: str, kind: str = "snapshot") -> AliasState:
        with self.db.tx() as conn:
            generation, digest = read_alias(conn, alias, kind)
            fences = read_fences(conn)
        return AliasState(
            alias=alias,
            kind=kind,
            generation=generation,
            active_digest=digest,
            tombstone_watermark=fences.tombstone_watermark,
            benchmark_fence=fences.benchmark_fence,
        )

    def alias_kind(self, alias: str) -> str | None:
        with self.db.tx() as conn:
            return alias_kind(conn, alias)

    def alias_history(self, alias: str) -> list[AliasHistoryEntry]:
        with self.db.tx() as conn:
            return alias_history(conn, alias)

    def hits_for(self, digest: str) -> list[HitRecord]:
        with self.db.tx() as conn:
            return hits_on(conn, digest)

    def tombstones(self, since: int = 0) -> list[TombstoneEntry]:
        with self.db.tx() as conn:
            return [
                e for e in entries_after(conn, "tombstone", since) if isinstance(e, TombstoneEntry)
            ]

    def benchmark_items(self, since: int = 0) -> list[BenchmarkEntry]:
        with self.db.tx() as conn:
            return [
                e for e in entries_after(conn, "benchmark", since) if isinstance(e, BenchmarkEntry)
            ]

    # -- activation / publication / rollback -----------------------------------------------
    def activate(
        self, kind: str, alias: str, digest: str, *, expected_generation: int | None, actor: str
    ) -> AliasChange:
        """CAS the alias from ``expected_generation`` to ``digest``.

        Succeeds only if both fences still equal the version's recorded watermarks, the
        alias generation is unchanged and the version is approved.  A retry of a CAS that
        already committed with the same digest returns the committed result; so does an
        activation of the digest the alias already holds at ``expected_generation`` (a
        re-run on unchanged input), after the same fence, hit and envelope checks.
        """
        move = self._activate
        return self._move(
            GateOperation.ACTIVATE, move, kind, alias, digest, expected_generation, actor
        )

    def _move(
        self,
        operation: GateOperation,
        move: Callable[[Connection, str, str, str, int | None, str], AliasChange],
        kind: str,
        alias: str,
        digest: str,
        expected_generation: int | None,
        actor: str,
    ) -> AliasChange:
        """One alias move in one gate transaction, its outcome recorded (ok or refused)."""
        with refusals_recorded(self.db, operation, alias), self.db.gate_tx() as conn:
            change = move(conn, kind, alias, digest, expected_generation, actor)
            record(conn, operation, Outcome.OK, subject=alias, digest=digest)
            return change

    def _activate(
        self,
        conn: Connection,
        kind: str,
        alias: str,
        digest: str,
        expected_generation: int | None,
        actor: str,
    ) -> AliasChange:
        need_state, new_state = ACTIVATION[kind]
        fences = read_fences(conn)
        generation, active = read_alias(conn, alias, kind)
        expected = generation if expected_generation is None else expected_generation
        subject = read_version(conn, kind, digest)
        if committed_retry(conn, alias, (generation, active), expected, digest, "activate"):
            return alias_change(alias, kind, generation, digest, fences, idempotent=True)
        if generation != expected:
            details: dict[str, object] = {"generation": generation, "activeDigest": active}
            raise stale_generation(alias, generation, expected, digest, details)
        held = active == digest  # already active here: nothing to move
        marks = subject.marks
        if marks != fences.pair():
            raise ConflictError(
                "a fence advanced since this version was built; build a new one",
                object=alias,
                check="fence-watermarks",
                digest=digest,
                details=_watermark_details(marks, fences, "manifest"),
            )
        if subject.state != (new_state if held else need_state):
            raise RejectedError(
                f"{kind} is {subject.state}, activation needs {need_state}"
                f" (alias {alias!r} holds {active})",
                object=kind,
                check="state",
                digest=digest,
            )
        check_no_hits(conn, kind, digest)
        verify_envelope(conn, self.envelopes, kind, digest)
        self.require_approved(conn, kind, digest)
        if held:
            return alias_change(alias, kind, generation, digest, fences, idempotent=True)
        move = AliasMove(
            alias=alias,
            kind=kind,
            generation=generation + 1,
            subject=digest,
            action="activate",
            actor=actor,
            tombstone_watermark=fences.tombstone_watermark,
            benchmark_fence=fences.benchmark_fence,
        )
        set_alias(conn, move)
        reason = f"alias {alias} generation {generation + 1}"
        transition(conn, kind, digest, new_state, actor=actor, reason=reason)
        return alias_change(alias, kind, generation + 1, digest, fences, idempotent=False)

    def rollback(
        self, kind: str, alias: str, digest: str, *, expected_generation: int | None, actor: str
    ) -> AliasChange:
        """Append a higher generation pointing at a digest the alias held before."""
        move = self._rollback
        return self._move(
            GateOperation.ROLLBACK, move, kind, alias, digest, expected_generation, actor
        )

    def _rollback(
        self,
        conn: Connection,
        kind: str,
        alias: str,
        digest: str,
        expected_generation: int | None,
        actor: str,
    ) -> AliasChange:
        fences = read_fences(conn)
        generation, active = read_alias(conn, alias, kind)
        expected = generation if expected_generation is None else expected_generation
        if committed_retry(conn, alias, (generation, active), expected, digest, "rollback"):
            return alias_change(alias, kind, generation, digest, fences, idempotent=True)
        if generation != expected:
            raise stale_generation(alias, generation, expected, digest, None)
        self._check_rollback_target(conn, kind, alias, digest, active)
        verify_envelope(conn, self.envelopes, kind, digest)
        self.require_approved(conn, kind, digest)
        move = AliasMove(
            alias=alias,
            kind=kind,
            generation=generation + 1,
            subject=digest,
            action="rollback",
            actor=actor,
            tombstone_watermark=fences.tombstone_watermark,
            benchmark_fence=fences.benchmark_fence,
        )
        set_alias(conn, move)
        return alias_change(alias, kind, generation + 1, digest, fences, idempotent=False)

    def _check_rollback_target(
        self, conn: Connection, kind: str, alias: str, digest: str, active: str | None
    ) -> None:
        """The alias held ``digest`` before, GC has not purged it, and no fence hits it."""
        held = one(
            conn,
            "SELECT generation FROM alias_history WHERE name = :n AND digest = :d"
            " ORDER BY generation LIMIT 1",
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
        # Garbage collection purged this version once nothing retained it (its bytes; the
        # audit trail, envelope included, is kept: relgate.lifecycle.audit_trail).
        envelope = envelope_key(kind, digest)
        if gc_table.purged(conn, envelope, digest):
            raise RejectedError(
                "garbage collection purged this version (outside the rollback window)",
                object=envelope,
                check="rollback-purged",
                digest=digest,
            )
        hits = hits_since(conn, self.members, kind, digest, read_version(conn, kind, digest).marks)
        if hits:
            raise RejectedError(
                "fence entries recorded since this version's watermarks hit its members",
                object=alias,
                check="rollback-fences",
                digest=digest,
                details={k: len(v) for k, v in hits.items()},
            )

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
        operation = GateOperation(fence_kind)
        with refusals_recorded(self.db, operation, fence_kind), self.db.gate_tx() as conn:
            now = utcnow()
            first, watermark = append_entries(
                conn, fence_kind, values, note=note, actor=actor, now=now
            )
            seq_of = {value: first + i for i, value in enumerate(values)}
            hits = record_hits(conn, self.members, fence_kind, set(values), seq_of, now)
            closed = close_hit_permits(conn, fence_kind, hits)
            record(conn, operation, Outcome.OK, subject=fence_kind)
            return FenceAdvance(
                kind=fence_kind,  # type: ignore[arg-type]  # validated by the model
                first_seq=first,
                watermark=watermark,
                hits=hits,
                closed_permits=closed,
            )

    # -- admission -------------------------------------------------------------------------
    def verify_envelope(self, conn: Connection, kind: str, digest: str) -> VersionRecord:
        """Re-open the stored envelope ``digest``'s row names and bind it to the row."""
        return verify_envelope(conn, self.envelopes, kind, digest)

    def verify_approval(self, conn: Connection, kind: str, digest: str) -> None:
        """Re-open the signed approval that ``digest``'s APPROVED state claims."""
        verify_signed_approval(conn, self.envelopes, kind, digest)

    def require_approved(
        self, conn: Connection, kind: str, digest: str, *, snapshot: str | None = None
    ) -> None:
        """The one approval rule, called inside the gate transaction of every path that
        relies on an approval (release build and approval, publication, rollback,
        admission by alias or by root, the barrier, the reader): a signed approval by a
        trusted approver key naming ``digest``; for a release, its snapshot's too.  A
        catalog state of APPROVED (or ACTIVE, PUBLISHED) alone proves nothing: refused
        with check ``approval``.  ``snapshot``: a release's snapshot digest when its row
        was read already."""
        subjects = [(kind, digest)]
        if kind == "release":
            snapshot = snapshot or read_release(conn, digest).snapshot_digest
            subjects.insert(0, ("snapshot", snapshot))
        self.envelopes.verify_approvals(conn, subjects)

    def check_root(self, conn: Connection, kind: str, digest: str) -> VersionRecord:
        """Admission of an exact root (runs, the barrier): zero hits against the current
        fences, the stored envelope re-verified and the signed approvals re-opened
        (:meth:`require_approved`).  Returns the catalog row.

        Recorded hits cover every root held when a fence advanced; a root nothing held
        then (retired, not retained) is checked against every fence entry recorded since
        its own watermarks, so both watermarks are compared with the current fences.
        """
        fences = read_fences(conn)
        row = read_version(conn, kind, digest)
        check_no_hits(conn, kind, digest)
        self.check_watermarks(conn, kind, digest, row, fences)
        row = self.verify_envelope(conn, kind, digest)
        self.require_approved(conn, kind, digest)
        return row

    def check_watermarks(
        self, conn: Connection, kind: str, digest: str, row: VersionRecord, fences: Fences
    ) -> None:
        """Refuse a root whose members fence entries recorded since its own watermarks hit
        (nothing to check when its watermarks are the current fences)."""
        marks = row.marks
        if marks != fences.pair():
            since = hits_since(conn, self.members, kind, digest, marks)
            if since:
                details = _watermark_details(marks, fences, "root")
                details["hits"] = {k: len(v) for k, v in since.items()}
                raise RejectedError(
                    "fence entries recorded since this root's watermarks hit its members",
                    object=kind,
                    check="root-watermarks",
                    digest=digest,
                    details=details,
                )

    def verify_row(self, kind: str, row: VersionRecord) -> None:
        """Re-open the stored envelope an already-read catalog row names."""
        self.envelopes.verify(kind, row)


def open_gate(ws: Workspace) -> Gate:
    """The gate over ``ws``'s catalog (the one way to build one): membership lookups and
    stored-envelope re-verification; a fence advance closes the permits it hits."""
    return Gate(
        ws.db, CatalogMemberIndex(ws.membership), StoredEnvelopes(ws.store, ws.trusted_keys)
    )
