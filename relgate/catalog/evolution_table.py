"""Schema-evolution reports in the catalog: which signed report vouches for which root.

Rows of ``schema_evolution_reports`` (migration 8), written by the verifier after a
VERIFIED verification and read by the publication path; the newest row of a root wins.
A row only points at the signed document: the reader re-opens and checks it.
"""

from __future__ import annotations

from collections.abc import Sequence

from relgate.catalog.audit import record_report
from relgate.catalog.db import Database, execute, one, rows, utcnow
from relgate.integrity.contract import Record
from relgate.objects.cas import ContentRef

#: The ``reports`` subject kind of a schema-evolution report.
REPORT_KIND = "release-schema-evolution"


def record(
    db: Database,
    *,
    root: str,
    old_root: str | None,
    ref: ContentRef,
    compatible: bool,
    actor: str,
) -> None:
    with db.tx() as conn:
        # Also a report of the root, so garbage collection keeps the signed document as
        # long as it keeps the root (relgate.holds.refs reads ``reports``).
        record_report(conn, REPORT_KIND, root, ref.digest, ref.version_id, compatible)
        execute(
            conn,
            "INSERT INTO schema_evolution_reports (root_digest, old_root, report_digest,"
            " report_version, compatible, actor, at) VALUES (:r, :o, :d, :v, :c, :a, :now)",
            {
                "r": root,
                "o": old_root,
                "d": ref.digest,
                "v": ref.version_id,
                "c": 1 if compatible else 0,
                "a": actor,
                "now": utcnow(),
            },
        )


class EvolutionRecord(Record):
    """A ``schema_evolution_reports`` row: the signed report stored for one verified root."""

    id: int
    root_digest: str
    old_root: str | None
    report_digest: str
    report_version: str
    compatible: int
    actor: str
    at: str


def newest(db: Database, root: str) -> EvolutionRecord | None:
    """The newest report row bound to ``root``."""
    with db.tx() as conn:
        row = one(
            conn,
            "SELECT * FROM schema_evolution_reports WHERE root_digest = :r ORDER BY id DESC LIMIT 1",
            {"r": root},
        )
    return None if row is None else EvolutionRecord.parse(row, what=f"evolution report of {root}")


def releases_of_snapshot(db: Database, snapshot: str, states: Sequence[str]) -> list[str]:
    """Releases cut from ``snapshot`` in one of ``states``: PUBLISHED first, then newest."""
    names = {f"s{i}": s for i, s in enumerate(states)}
    wanted = ", ".join(f":{n}" for n in names)
    with db.tx() as conn:
        found = rows(
            conn,
            f"SELECT digest FROM releases WHERE snapshot_digest = :snap AND state IN ({wanted})"  # noqa: S608 placeholders only
            " ORDER BY CASE WHEN state = 'PUBLISHED' THEN 0 ELSE 1 END, created_at DESC, digest",
            {"snap": snapshot, **names},
        )
    return [str(r["digest"]) for r in found]
