"""Which versions, pins, permits and runs hold a sample, by membership, never by text.

Each version's signed manifest pins its membership table by content address; the
sampleId is looked up in that table (the same index the gate uses for fence hits), so the
answer is a statement about signed membership, not a scan of sample text.  For a
tombstoned sample the result also says which versions the gate refuses to re-activate
(a fence hit, or a tombstone newer than the version's watermark) and which are still
held, i.e. what garbage collection purges once nothing pins them.
"""

from __future__ import annotations

from typing import Any

from relgate.catalog.db import rows
from relgate.lifecycle.retention import now_utc, retained_versions
from relgate.members_index import CatalogMemberIndex
from relgate.objects.cas import ContentRef
from relgate.workspace import Workspace


def lineage(ws: Workspace, sample_id: str) -> dict[str, Any]:
    index = CatalogMemberIndex(ws.membership)
    memo: dict[tuple[str, str], bool] = {}

    def member(digest: str, version: str) -> bool:
        if (digest, version) not in memo:
            hit, _ = index.hits(ContentRef(digest, version, 0), {sample_id}, set())
            memo[(digest, version)] = bool(hit)
        return memo[(digest, version)]

    with ws.db.tx() as conn:
        tombs = rows(
            conn,
            "SELECT seq, reason, created_at FROM tombstones WHERE sample_id = :s ORDER BY seq",
            {"s": sample_id},
        )
        retained = retained_versions(conn, now_utc())
        versions = []
        for kind, table in (("snapshot", "snapshots"), ("release", "releases")):
            for row in rows(
                conn,
                f"SELECT digest, state, members_digest, members_version, tombstone_watermark"
                f" FROM {table} ORDER BY created_at, digest",
            ):
                if not member(row["members_digest"], row["members_version"]):
                    continue
                hits = rows(
                    conn,
                    "SELECT fence_kind, fence_seq FROM fence_hits WHERE subject_digest = :d",
                    {"d": row["digest"]},
                )
                newer = [t for t in tombs if int(t["seq"]) > int(row["tombstone_watermark"])]
                versions.append(
                    {
                        "kind": kind,
                        "digest": row["digest"],
                        "state": row["state"],
                        "heldBy": sorted(set(retained.get((kind, row["digest"]), []))),
                        "reactivation": "refused" if hits or newer else "allowed",
                    }
                )
        digests = [v["digest"] for v in versions]
        pins, permits, runs = [], [], []
        for digest in digests:
            pins += rows(
                conn,
                "SELECT pin_id, kind, owner, reason, expires_at, digest FROM pins"
                " WHERE digest = :d AND state = 'HELD'",
                {"d": digest},
            )
            permits += rows(
                conn,
                "SELECT permit_id, state, purpose, root_digest FROM permits WHERE root_digest = :d",
                {"d": digest},
            )
            runs += rows(
                conn,
                "SELECT run_id, state, root_digest FROM runs WHERE root_digest = :d",
                {"d": digest},
            )
    return {
        "sampleId": sample_id,
        "tombstoned": bool(tombs),
        "tombstones": [int(t["seq"]) for t in tombs],
        "versions": versions,
        "pins": pins,
        "permits": permits,
        "runs": runs,
        "heldVersions": [v["digest"] for v in versions if v["heldBy"]],
    }
