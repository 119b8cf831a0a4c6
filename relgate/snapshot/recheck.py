"""Re-check snapshots after a fence advanced (used by the fence sensors)."""

from __future__ import annotations

from typing import Any

from relgate.catalog.db import rows
from relgate.snapshot.catalog import get_snapshot
from relgate.states import transition
from relgate.workspace import Workspace


def hit_snapshots(ws: Workspace, fence_kind: str, after_seq: int) -> list[str]:
    """Digests of snapshots hit by fence entries with seq above ``after_seq``."""
    with ws.db.tx() as conn:
        found = rows(
            conn,
            "SELECT DISTINCT subject_digest FROM fence_hits"
            " WHERE subject_kind = 'snapshot' AND fence_kind = :k AND fence_seq > :s ORDER BY subject_digest",
            {"k": fence_kind, "s": after_seq},
        )
    return [str(r["subject_digest"]) for r in found]


def recheck(ws: Workspace, digest: str, *, actor: str) -> dict[str, Any]:
    """Report a snapshot's fence hits; a hit candidate that is not yet active is REJECTED.

    An ACTIVE snapshot keeps its state (its history is immutable, and pinned runs keep
    their input); the gate already refuses rolling back to it.
    """
    row = get_snapshot(ws.db, digest)
    with ws.db.tx() as conn:
        hits = rows(
            conn,
            "SELECT fence_kind, fence_seq FROM fence_hits WHERE subject_digest = :d ORDER BY fence_kind, fence_seq",
            {"d": digest},
        )
        state = row["state"]
        if hits and state in ("BUILDING", "VALIDATED", "APPROVED"):
            transition(
                conn, "snapshot", digest, "REJECTED", actor=actor, reason=f"{len(hits)} fence hits"
            )
            state = "REJECTED"
    by_kind: dict[str, int] = {}
    for hit in hits:
        by_kind[hit["fence_kind"]] = by_kind.get(hit["fence_kind"], 0) + 1
    return {"snapshot": digest, "state": state, "hits": by_kind, "reactivatable": not hits}
