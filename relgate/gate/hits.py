"""Fence hits: which held versions a fence entry names a member of, recorded in the gate.

A fence advance records one ``fence_hits`` row per (held version, hitting entry) inside
its own gate transaction; admission and rollback refuse a version with hits, and a
version nothing held when the fence moved is checked against every entry recorded since
its own watermarks.
"""

from __future__ import annotations

from typing import Protocol

from sqlalchemy import Connection

from relgate.catalog import hit_table, run_table
from relgate.catalog.db import one, rows, utcnow
from relgate.catalog.permit_table import close_permit
from relgate.catalog.states import TABLES
from relgate.errors import RejectedError
from relgate.holds.retention import now_utc, retained_versions
from relgate.integrity.contract import Contract
from relgate.objects.cas import ContentRef

#: Subject digest (or fence kind) -> the fence seqs that hit it.
HitSeqs = dict[str, list[int]]

_MEMBERS_SQL = {
    kind: f"SELECT members_digest, members_version FROM {table} WHERE digest = :d"  # noqa: S608 constant table names
    for kind, (table, _, _) in TABLES.items()
}


class MemberIndex(Protocol):
    """Answers which of the given sample ids / content digests are members of a version."""

    def hits(
        self, members: ContentRef, sample_ids: set[str], content_digests: set[str]
    ) -> tuple[set[str], set[str]]: ...


class HitRecord(Contract):
    """One recorded hit on a version: the fence and the entry's sequence number."""

    fence_kind: str
    fence_seq: int


def members_of(conn: Connection, kind: str, digest: str) -> ContentRef | None:
    """The membership table a version's catalog row names."""
    row = one(conn, _MEMBERS_SQL[kind], {"d": digest})
    if row is None:
        return None
    return ContentRef(str(row["members_digest"]), str(row["members_version"]), 0)


def record_hits(
    conn: Connection,
    index: MemberIndex,
    fence_kind: str,
    values: set[str],
    seq_of: dict[str, int],
    now: str,
) -> HitSeqs:
    """Record a hit on every retained version that has one of ``values`` as a member."""
    ids, digests = (values, set()) if fence_kind == "tombstone" else (set(), values)
    hits: HitSeqs = {}
    looked_up: dict[ContentRef, tuple[set[str], set[str]]] = {}
    for kind, digest in sorted(retained_versions(conn, now_utc())):
        ref = members_of(conn, kind, digest) if kind in TABLES else None
        if ref is None:
            continue
        if ref not in looked_up:  # releases of one snapshot share its membership
            looked_up[ref] = index.hits(ref, ids, digests)
        hit_ids, hit_digests = looked_up[ref]
        seqs = sorted({seq_of[x] for x in hit_ids | hit_digests})
        for seq in seqs:
            hit_table.record_hit(
                conn, kind=kind, digest=digest, fence_kind=fence_kind, seq=seq, now=now
            )
        if seqs:
            hits[digest] = seqs
    return hits


def hits_on(conn: Connection, digest: str) -> list[HitRecord]:
    """Every recorded hit on ``digest``, in fence order."""
    found = rows(
        conn,
        "SELECT fence_kind, fence_seq FROM fence_hits WHERE subject_digest = :d"
        " ORDER BY fence_kind, fence_seq",
        {"d": digest},
    )
    return [
        HitRecord(fence_kind=str(r["fence_kind"]), fence_seq=int(r["fence_seq"])) for r in found
    ]


def check_no_hits(conn: Connection, kind: str, digest: str) -> None:
    """Refuse a version with any recorded hit."""
    row = one(conn, "SELECT COUNT(*) AS n FROM fence_hits WHERE subject_digest = :d", {"d": digest})
    refuse_hits(int(row["n"]) if row else 0, kind, digest)


def refuse_hits(count: int, kind: str, digest: str) -> None:
    """Refuse a version with ``count`` recorded hits, if any."""
    if count:
        raise RejectedError(
            "fence entries hit members of this version",
            object=kind,
            check="fence-hits",
            digest=digest,
        )


def hits_since(
    conn: Connection, index: MemberIndex, kind: str, digest: str, marks: tuple[int, int]
) -> HitSeqs:
    """Fence kind -> seqs of entries above ``marks`` (tombstone, benchmark) that hit it."""
    tombs = rows(conn, "SELECT seq, sample_id FROM tombstones WHERE seq > :s", {"s": marks[0]})
    bench = rows(
        conn, "SELECT seq, content_digest FROM benchmark_items WHERE seq > :s", {"s": marks[1]}
    )
    if not tombs and not bench:
        return {}
    ref = members_of(conn, kind, digest)
    if ref is None:
        raise RejectedError(f"unknown {kind}", object=kind, check="exists", digest=digest)
    hit_ids, hit_digests = index.hits(
        ref, {t["sample_id"] for t in tombs}, {b["content_digest"] for b in bench}
    )
    out: HitSeqs = {}
    if hit_ids:
        out["tombstone"] = sorted(int(t["seq"]) for t in tombs if t["sample_id"] in hit_ids)
    if hit_digests:
        out["benchmark"] = sorted(
            int(b["seq"]) for b in bench if b["content_digest"] in hit_digests
        )
    return out


def close_hit_permits(conn: Connection, fence_kind: str, hits: HitSeqs) -> list[str]:
    """Close every open permit on a hit root and revoke its runs.

    Runs in the fence transaction, so a worker's barrier and a reader's next record see
    the closed permit and the REVOKED run as soon as the fence is visible at all.
    """
    closed: list[str] = []
    now = utcnow()
    for root, seqs in sorted(hits.items()):
        why = f"{fence_kind} fence entries {seqs} hit root {root}"
        for row in rows(
            conn,
            "SELECT permit_id FROM permits WHERE root_digest = :r AND state = 'OPEN' ORDER BY permit_id",
            {"r": root},
        ):
            if close_permit(conn, str(row["permit_id"]), why):
                closed.append(str(row["permit_id"]))
        run_table.revoke_on_root(conn, root, reason=why, now=now)
    return closed
