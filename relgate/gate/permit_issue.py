"""Issuing a permit: admission of one purpose to one exact root at one gate state.

The root is resolved (an alias exactly once, or the digest as given), must be PUBLISHED,
admitted for the purpose, free of fence hits against the current fences, its stored
envelope must re-verify and it and its snapshot must carry signed approvals; then the
permit row is written (:mod:`relgate.catalog.permit_table`), all inside the caller's gate
transaction.
"""

from __future__ import annotations

import uuid
from dataclasses import dataclass

from sqlalchemy import Connection

from relgate.catalog.alias_table import AliasRecord
from relgate.catalog.db import one, utcnow
from relgate.catalog.permit_table import NO_GENERATION, Permit, insert_permit
from relgate.catalog.versions import ReleaseRecord
from relgate.errors import ConflictError, NotFoundError, RejectedError, UsageError
from relgate.gate.aliases import alias_of, stale_generation
from relgate.gate.fences import Fences, read_fences
from relgate.gate.hits import refuse_hits
from relgate.gate.transitions import Gate

#: One read for the gate state an admission starts from: both fences and the alias row.
_STATE_SQL = (
    "SELECT f.tombstone_watermark, f.benchmark_fence, a.kind, a.generation, a.active_digest"
    " FROM fences f LEFT JOIN aliases a ON a.name = :n WHERE f.id = 1"
)
#: One read for the root: its catalog row, its snapshot's purpose, its recorded hits.
_ROOT_SQL = (
    "SELECT r.*, s.purpose AS admitted_purpose_,"
    " (SELECT COUNT(*) FROM fence_hits h WHERE h.subject_digest = r.digest) AS hit_count_"
    " FROM releases r LEFT JOIN snapshots s ON s.digest = r.snapshot_digest WHERE r.digest = :d"
)


def _gate_state(conn: Connection, alias: str | None) -> tuple[Fences, AliasRecord | None]:
    """The fences (NotFoundError without a fences row, as :func:`read_fences`) and the
    alias (None without one, kind None when it is not set), in one statement."""
    row = one(conn, _STATE_SQL, {"n": alias})
    if row is None:
        return read_fences(conn), None  # raises: the gate is not initialised
    fences = Fences(int(row["tombstone_watermark"]), int(row["benchmark_fence"]))
    if alias is None:
        return fences, None
    fields = {k: row[k] for k in ("kind", "generation", "active_digest")}
    return fences, AliasRecord.parse({"name": alias, **fields}, what=f"alias {alias}")


def _admitted_root(
    alias_row: AliasRecord | None,
    alias: str | None,
    root: str | None,
    expected_generation: int | None,
) -> tuple[str, int]:
    """Resolve the alias (exactly once) or take the exact root; (root, generation)."""
    if alias is None:
        if expected_generation is not None:
            raise UsageError(
                "--expect-generation needs --alias", object="run", check="expect-generation"
            )
        if root is None:
            raise UsageError("admit a root digest or an alias", object="run", check="root")
        return root, NO_GENERATION
    generation, active = alias_of(alias_row, "release")
    if expected_generation is not None and generation != expected_generation:
        details: dict[str, object] = {"generation": generation, "activeDigest": active}
        raise stale_generation(alias, generation, expected_generation, active, details)
    if active is None:
        raise RejectedError(
            f"alias {alias!r} has no published release", object=alias, check="alias-active"
        )
    if root is not None and root != active:
        raise ConflictError(
            f"alias {alias!r} points at another root",
            object=alias,
            check="alias-root",
            digest=root,
            details={"activeDigest": active, "generation": generation},
        )
    return active, generation


def _admissible_row(conn: Connection, subject: str, root: str, purpose: str) -> ReleaseRecord:
    """The root is PUBLISHED, its data was admitted for ``purpose`` and no fence entry hit
    it; its catalog row (for the watermark and envelope checks)."""
    release = one(conn, _ROOT_SQL, {"d": root})
    if release is None:
        raise NotFoundError("unknown release", object="release", check="exists", digest=root)
    admitted, hits = release.pop("admitted_purpose_"), int(release.pop("hit_count_") or 0)
    if release["state"] != "PUBLISHED":
        raise RejectedError(
            f"release is {release['state']}; runs are admitted on PUBLISHED roots only",
            object=subject,
            check="release-state",
            digest=root,
        )
    if admitted != purpose:
        raise RejectedError(
            f"purpose {purpose!r} is not what the data was admitted for",
            object=subject,
            check="purpose",
            digest=root,
            details={"admitted": admitted},
        )
    refuse_hits(hits, "release", root)
    return ReleaseRecord.parse(release, what=f"release {root}")


@dataclass(frozen=True)
class Acquired:
    """An issued permit and the release row it was admitted on (read once, in the same
    transaction: the caller needs no second read of the row)."""

    permit: Permit
    release: ReleaseRecord


def acquire(
    conn: Connection,
    gate: Gate,
    *,
    purpose: str,
    alias: str | None = None,
    root: str | None = None,
    expected_generation: int | None = None,
) -> Acquired:
    """Admit ``purpose`` to one exact root and issue a permit (call inside gate_tx).

    With ``alias`` the alias is resolved here, exactly once, and must still be at
    ``expected_generation`` when one is given; with ``root`` the digest is admitted as
    given (a root that was superseded on its alias but is still PUBLISHED is admissible).
    Either way the root must be PUBLISHED, admitted for this purpose, free of fence hits
    against the current fences, its stored envelope must re-verify, and the release and its
    snapshot must each carry a signed approval (:meth:`Gate.require_approved`).
    """
    fences, alias_row = _gate_state(conn, alias)
    root, generation = _admitted_root(alias_row, alias, root, expected_generation)
    row = _admissible_row(conn, alias or root, root, purpose)
    gate.check_watermarks(conn, "release", root, row, fences)
    gate.verify_row("release", row)
    gate.require_approved(conn, "release", root, snapshot=row.snapshot_digest)
    permit = Permit(
        permit_id="permit-" + uuid.uuid4().hex[:16],
        root_digest=root,
        alias=alias or "",
        generation=generation,
        tombstone_watermark=fences.tombstone_watermark,
        benchmark_fence=fences.benchmark_fence,
        purpose=purpose,
        state="OPEN",
        created_at=utcnow(),
    )
    insert_permit(conn, permit)
    return Acquired(permit, row)
