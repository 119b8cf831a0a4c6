"""Gate permits: admission of one purpose to one root at one gate state.

A permit is bound to the root digest, both fence watermarks, the alias generation it was
resolved at, and the purpose.  It is issued inside a gate transaction and closed inside
one: a fence advance that hits a member of a permitted root closes every open permit on
that root before the advance commits.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from sqlalchemy import Connection

from relgate.catalog.db import Database, execute, one, rows, utcnow
from relgate.catalog.states import RUN_LIVE_STATES
from relgate.errors import ConflictError, NotFoundError, RejectedError, UsageError
from relgate.gate.aliases import alias_of, stale_generation
from relgate.gate.fences import Fences, read_fences
from relgate.gate.hits import HitSeqs, refuse_hits
from relgate.gate.transitions import Gate
from relgate.integrity.contract import Contract

#: ``permits.generation`` of a permit admitted by exact digest (no alias was read).
NO_GENERATION = -1


class Permit(Contract):
    """Admission of one purpose to one exact root at one gate state (a ``permits`` row)."""

    permit_id: str
    root_digest: str
    alias: str
    generation: int
    tombstone_watermark: int
    benchmark_fence: int
    purpose: str
    state: str
    created_at: str
    closed_reason: str | None = None
    closed_at: str | None = None


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


def _gate_state(conn: Connection, alias: str | None) -> tuple[Fences, Mapping[str, Any]]:
    """The fences (NotFoundError without a fences row, as :func:`read_fences`) and the
    alias row (kind None when ``alias`` is not set), in one statement."""
    row = one(conn, _STATE_SQL, {"n": alias})
    if row is None:
        return read_fences(conn), {}  # raises: the gate is not initialised
    return Fences(int(row["tombstone_watermark"]), int(row["benchmark_fence"])), row


def _admitted_root(
    alias_row: Mapping[str, Any],
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
    generation, active = alias_of(alias_row, alias, "release")
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


def _admissible_row(conn: Connection, subject: str, root: str, purpose: str) -> dict[str, Any]:
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
    return release


def acquire(
    conn: Connection,
    gate: Gate,
    *,
    purpose: str,
    alias: str | None = None,
    root: str | None = None,
    expected_generation: int | None = None,
) -> Permit:
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
    gate.require_approved(conn, "release", root)
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
    execute(
        conn,
        "INSERT INTO permits (permit_id, root_digest, alias, generation, tombstone_watermark,"
        " benchmark_fence, purpose, state, created_at) VALUES (:permit_id, :root_digest, :alias,"
        " :generation, :tombstone_watermark, :benchmark_fence, :purpose, :state, :created_at)",
        permit.model_dump(exclude={"closed_reason", "closed_at"}),
    )
    return permit


def close_permit(conn: Connection, permit_id: str, reason: str) -> bool:
    """Close one open permit (a run ended); False if it was already closed."""
    changed = execute(
        conn,
        "UPDATE permits SET state = 'CLOSED', closed_reason = :why, closed_at = :now"
        " WHERE permit_id = :p AND state = 'OPEN'",
        {"why": reason, "now": utcnow(), "p": permit_id},
    )
    return changed == 1


def close_hit_permits(conn: Connection, fence_kind: str, hits: HitSeqs) -> list[str]:
    """Gate hit listener: close every open permit on a hit root and revoke its runs.

    Runs in the fence transaction, so a worker's barrier and a reader's next record see
    the closed permit and the REVOKED run as soon as the fence is visible at all.
    """
    closed: list[str] = []
    now = utcnow()
    live = ", ".join(f"'{s}'" for s in RUN_LIVE_STATES)
    revoke = (
        "UPDATE runs SET state = 'REVOKED', failure = :why, end_reason = :why, ended_at = :now,"  # noqa: S608 constant run states
        f" ended_by = 'gate', updated_at = :now WHERE root_digest = :r AND state IN ({live})"
    )
    for root, seqs in sorted(hits.items()):
        why = f"{fence_kind} fence entries {seqs} hit root {root}"
        for row in rows(
            conn,
            "SELECT permit_id FROM permits WHERE root_digest = :r AND state = 'OPEN' ORDER BY permit_id",
            {"r": root},
        ):
            if close_permit(conn, str(row["permit_id"]), why):
                closed.append(str(row["permit_id"]))
        execute(conn, revoke, {"why": why, "now": now, "r": root})
    return closed


def get_permit(db: Database, permit_id: str) -> Permit:
    with db.tx() as conn:
        row = one(conn, "SELECT * FROM permits WHERE permit_id = :p", {"p": permit_id})
    if row is None:
        raise NotFoundError("unknown permit", object=permit_id, check="exists")
    return Permit.model_validate(row)


def list_permits(
    db: Database, *, root: str | None = None, state: str | None = None
) -> list[Permit]:
    sql = "SELECT * FROM permits WHERE 1 = 1"
    params: dict[str, str] = {}
    if root:
        sql += " AND root_digest = :r"
        params["r"] = root
    if state:
        sql += " AND state = :s"
        params["s"] = state
    with db.tx() as conn:
        found = rows(conn, sql + " ORDER BY created_at", params)
    return [Permit.model_validate(r) for r in found]
