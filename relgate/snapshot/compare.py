"""Diff two snapshots, replay one, and prove (non-)membership of a sample id."""

from __future__ import annotations

import hashlib
from typing import Any

import polars as pl

from relgate.catalog.snapshot_table import get_snapshot
from relgate.errors import RejectedError
from relgate.integrity.merkle import LeafProof, MerkleTree
from relgate.integrity.tuples import MemberTuple
from relgate.snapshot import manifest as mf
from relgate.snapshot.validate import recompute
from relgate.sources.schema import record_schema_digest
from relgate.workspace import Workspace


def load_manifest(ws: Workspace, digest: str) -> mf.SnapshotManifest:
    row = get_snapshot(ws.db, digest)
    return mf.load(ws.store, ws.trusted_keys, digest, row["envelope_version"])


def load_members(ws: Workspace, digest: str) -> pl.DataFrame:
    return ws.membership.read(load_manifest(ws, digest).members_ref)


def _counts(frame: pl.DataFrame, column: str) -> dict[str, int]:
    return {
        str(r[column]): int(r["len"]) for r in frame.group_by(column).len().iter_rows(named=True)
    }


def diff(ws: Workspace, old: str, new: str, *, sample_limit: int = 20) -> dict[str, Any]:
    a = load_members(ws, old)
    b = load_members(ws, new)
    joined = a.join(b, on="sampleId", how="full", suffix="_new", coalesce=True)
    added = joined.filter(pl.col("sourceId").is_null())
    deleted = joined.filter(pl.col("sourceId_new").is_null())
    both = joined.filter(pl.col("sourceId").is_not_null() & pl.col("sourceId_new").is_not_null())
    moved = both.filter(pl.col("split") != pl.col("split_new"))
    changed = both.filter(pl.col("logicalContentDigest") != pl.col("logicalContentDigest_new"))
    migrations = {
        f"{r['split']}->{r['split_new']}": int(r["len"])
        for r in moved.group_by("split", "split_new").len().iter_rows(named=True)
    }

    def delta(column: str) -> dict[str, dict[str, int]]:
        ca, cb = _counts(a, column), _counts(b, column)
        return {
            k: {"old": ca.get(k, 0), "new": cb.get(k, 0), "delta": cb.get(k, 0) - ca.get(k, 0)}
            for k in sorted(set(ca) | set(cb))
        }

    return {
        "old": old,
        "new": new,
        "counts": {"old": a.height, "new": b.height},
        "additions": added.height,
        "deletions": deleted.height,
        "contentChanges": changed.height,
        "splitMigrations": migrations,
        "bySource": delta("sourceId"),
        "bySplit": delta("split"),
        "examples": {
            "added": added["sampleId"].head(sample_limit).to_list(),
            "deleted": deleted["sampleId"].head(sample_limit).to_list(),
        },
    }


def canary_filter(basis_points: int) -> Any:
    """A fixed canary: ids whose SHA-256 bucket is below ``basis_points`` of 10000."""

    def keep(frame: pl.DataFrame) -> pl.DataFrame:
        if basis_points >= 10_000:
            return frame
        ids = frame["sampleId"].to_list()
        mask = [
            int.from_bytes(hashlib.sha256(b"canary\x00" + i.encode()).digest()[:4], "big") % 10_000
            < basis_points
            for i in ids
        ]
        return frame.filter(pl.Series(mask, dtype=pl.Boolean))

    return keep


def replay(ws: Workspace, digest: str, *, canary_bp: int = 10_000) -> dict[str, Any]:
    """Re-run selection from the pinned sources; the member-id set must match exactly."""
    manifest = load_manifest(ws, digest)
    stored = ws.membership.read(manifest.members_ref)
    keep = canary_filter(canary_bp)
    replayed = recompute(ws, manifest, canary=keep)
    expected_ids = (
        set(keep(stored.select("sampleId"))["sampleId"].to_list())
        if canary_bp < 10_000
        else set(stored["sampleId"].to_list())
    )
    got_ids = set(replayed["sampleId"].to_list())
    stored_subset = stored.filter(pl.col("sampleId").is_in(list(expected_ids))).sort("sampleId")
    replay_hash = hashlib.sha256(
        "\n".join(replayed.sort("sampleId")["logicalContentDigest"].to_list()).encode()
    ).hexdigest()
    stored_hash = hashlib.sha256(
        "\n".join(stored_subset["logicalContentDigest"].to_list()).encode()
    ).hexdigest()
    result = {
        "snapshot": digest,
        "canaryBasisPoints": canary_bp,
        "expectedIds": len(expected_ids),
        "replayedIds": len(got_ids),
        "missing": len(expected_ids - got_ids),
        "extra": len(got_ids - expected_ids),
        "transformReplayHash": "sha256:" + replay_hash,
        "storedContentHash": "sha256:" + stored_hash,
    }
    result["identical"] = (
        result["missing"] == 0 and result["extra"] == 0 and replay_hash == stored_hash
    )
    if not result["identical"]:
        raise RejectedError(
            "replay from pinned sources does not reproduce the member set",
            object="snapshot",
            check="replay-identical",
            digest=digest,
            details=result,
        )
    return result


def prove(ws: Workspace, digest: str, sample_id: str) -> dict[str, Any]:
    """An RFC 6962 inclusion proof, or a non-inclusion proof by adjacent neighbours."""
    manifest = load_manifest(ws, digest)
    stored = ws.membership.read(manifest.members_ref)
    schema = manifest.body["recordSchema"]
    tuples = [MemberTuple(r[0], r[1], r[2], r[3], r[4], schema) for r in stored.iter_rows()]
    tree = MerkleTree([t.encode() for t in tuples])
    root = "sha256:" + tree.root.hex()
    if root != manifest.tuple_root:
        raise RejectedError(
            "membership table does not match the manifest's tuple root",
            object="snapshot",
            check="tuple-root",
            digest=digest,
        )
    ids = stored["sampleId"]
    pos = int(ids.search_sorted(sample_id, side="left"))

    def leaf(i: int) -> dict[str, Any]:
        return LeafProof(i, tuples[i], tree.audit_path(i)).to_json()

    if pos < len(tuples) and tuples[pos].sample_id == sample_id:
        kind, leaves = "inclusion", [leaf(pos)]
    else:
        kind = "non-inclusion"
        leaves = [leaf(i) for i in (pos - 1, pos) if 0 <= i < len(tuples)]
    return {
        "kind": kind,
        "sampleId": sample_id,
        "snapshot": digest,
        "root": root,
        "size": len(tuples),
        "schemaDigest": schema if schema else record_schema_digest(),
        "leaves": leaves,
    }
