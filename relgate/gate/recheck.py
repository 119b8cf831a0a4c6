"""Re-check versions after a fence advanced (used by the fence sensors).

The gate already recorded the hits and closed the permits on hit roots inside the fence
transaction; this marks hit candidates so they can never be activated: a snapshot that is
not yet active becomes REJECTED, a release that is not yet published becomes INVALID.
Active and published versions keep their state (history is immutable; pinned runs keep
their input), and the gate refuses rolling back to them.
"""

from __future__ import annotations

from pydantic import Field

from relgate.catalog.db import rows
from relgate.catalog.states import TABLES, current_state, transition
from relgate.gate.fences import read_fences
from relgate.gate.hits import hits_on
from relgate.integrity.contract import Contract
from relgate.workspace import Workspace

REFUSE = {
    "snapshot": ("REJECTED", ("BUILDING", "VALIDATED", "APPROVED")),
    "release": ("INVALID", ("STAGED", "VERIFIED", "APPROVED")),
}


class RecheckResult(Contract):
    """A version after its re-check: its state, hits per fence, permits closed on it."""

    kind: str
    subject: str = Field(validation_alias="digest", serialization_alias="digest")
    state: str
    hits: dict[str, int]
    reactivatable: bool
    closed_permits: list[str]


def current_watermark(ws: Workspace, fence_kind: str) -> int:
    """The current watermark of one fence (what the fence sensors compare with)."""
    with ws.db.tx() as conn:
        return read_fences(conn).of(fence_kind)


def hit_subjects(ws: Workspace, fence_kind: str, after_seq: int) -> list[tuple[str, str]]:
    """(kind, digest) of every version hit by fence entries with seq above ``after_seq``."""
    with ws.db.tx() as conn:
        found = rows(
            conn,
            "SELECT DISTINCT subject_kind, subject_digest FROM fence_hits"
            " WHERE fence_kind = :k AND fence_seq > :s ORDER BY subject_kind, subject_digest",
            {"k": fence_kind, "s": after_seq},
        )
    return [(str(r["subject_kind"]), str(r["subject_digest"])) for r in found]


def recheck(ws: Workspace, kind: str, digest: str, *, actor: str) -> RecheckResult:
    """Mark a hit candidate REJECTED / INVALID; report the version's hits and permits."""
    if kind not in TABLES:
        raise KeyError(kind)
    with ws.db.tx() as conn:
        hits = hits_on(conn, digest)
        state = current_state(conn, kind, digest)
        refused, candidates = REFUSE[kind]
        if hits and state in candidates:
            transition(conn, kind, digest, refused, actor=actor, reason=f"{len(hits)} fence hits")
            state = refused
        permits = rows(
            conn, "SELECT permit_id, state FROM permits WHERE root_digest = :d", {"d": digest}
        )
    by_kind: dict[str, int] = {}
    for hit in hits:
        by_kind[hit.fence_kind] = by_kind.get(hit.fence_kind, 0) + 1
    return RecheckResult(
        kind=kind,
        subject=digest,
        state=state,
        hits=by_kind,
        reactivatable=not hits,
        closed_permits=[str(p["permit_id"]) for p in permits if p["state"] == "CLOSED"],
    )
