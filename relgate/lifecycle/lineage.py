"""Which versions, pins, permits and runs hold a sample, by membership, never by text.

Each version's signed manifest pins its membership table by content address; the
sampleId is looked up in that table (the same index the gate uses for fence hits) and
every hit is confirmed by an RFC 6962 inclusion proof against the signed snapshot's
tuple root (a release's root reproduces its snapshot's), so the answer is a proof about
signed membership, not a scan of sample text.  For a
tombstoned sample the result also says which versions the gate refuses to re-activate
(a fence hit, or a tombstone newer than the version's watermark) and which are still
held, i.e. what garbage collection purges once nothing pins them.
"""

from __future__ import annotations

from typing import Any

from relgate.catalog.db import rows
from relgate.gate.members import CatalogMemberIndex
from relgate.lifecycle.retention import now_utc, retained_versions
from relgate.objects.cas import ContentRef
from relgate.workspace import Workspace


def lineage(ws: Workspace, sample_id: str) -> dict[str, Any]:
    index = CatalogMemberIndex(ws.membership)
    memo: dict[tuple[str, str], bool] = {}
    proofs: dict[str, dict[str, Any]] = {}

    def member(digest: str, version: str) -> bool:
        if (digest, version) not in memo:
            hit, _ = index.hits(ContentRef(digest, version, 0), {sample_id}, set())
            memo[(digest, version)] = bool(hit)
        return memo[(digest, version)]

    # Catalog facts first, in one short transaction; proofs read manifests and membership
    # outside it (on SQLite a transaction holds the writer lock).
    with ws.db.tx() as conn:
        tombs = rows(
            conn,
            "SELECT seq, reason, created_at FROM tombstones WHERE sample_id = :s ORDER BY seq",
            {"s": sample_id},
        )
        retained = retained_versions(conn, now_utc())
        candidates = []
        for kind, table in (("snapshot", "snapshots"), ("release", "releases")):
            snap_col = "digest" if kind == "snapshot" else "snapshot_digest"
            for row in rows(
                conn,
                f"SELECT digest, state, members_digest, members_version, tombstone_watermark,"
                f" {snap_col} AS snapshot FROM {table} ORDER BY created_at, digest",
            ):
                hits = rows(
                    conn,
                    "SELECT fence_kind, fence_seq FROM fence_hits WHERE subject_digest = :d",
                    {"d": row["digest"]},
                )
                candidates.append((kind, row, bool(hits)))
    versions = []
    for kind, row, hit in candidates:
        if not member(row["members_digest"], row["members_version"]):
            continue
        proof = proofs.get(row["snapshot"])
        if proof is None:
            proof = proofs[row["snapshot"]] = _inclusion(ws, row["snapshot"], sample_id)
        if not proof.get("verified"):
            continue
        newer = [t for t in tombs if int(t["seq"]) > int(row["tombstone_watermark"])]
        versions.append(
            {
                "kind": kind,
                "digest": row["digest"],
                "state": row["state"],
                "heldBy": sorted(set(retained.get((kind, row["digest"]), []))),
                "reactivation": "refused" if hit or newer else "allowed",
                "proof": proof,
            }
        )
    pins: list[dict[str, Any]] = []
    permits: list[dict[str, Any]] = []
    runs: list[dict[str, Any]] = []
    with ws.db.tx() as conn:
        for digest in [v["digest"] for v in versions]:
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


def _inclusion(ws: Workspace, snapshot: str, sample_id: str) -> dict[str, Any]:
    """An RFC 6962 inclusion proof against the signed snapshot's tuple root, checked."""
    from relgate.errors import RelgateError
    from relgate.integrity.merkle import check_proof
    from relgate.snapshot.compare import prove

    try:
        proof = prove(ws, snapshot, sample_id).to_json()
    except RelgateError as exc:
        return {"verified": False, "error": exc.check or exc.code, "snapshot": snapshot}
    verified = proof["kind"] == "inclusion" and check_proof(proof)
    return {
        "kind": proof["kind"],
        "verified": verified,
        "snapshot": snapshot,
        "root": proof["root"],
        "leafIndex": proof["leaves"][0]["index"] if verified else None,
    }
