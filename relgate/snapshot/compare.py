"""Diff two snapshots, replay one, and prove (non-)membership of a sample id."""

from __future__ import annotations

import hashlib
from typing import Literal

import numpy as np
import polars as pl
from pydantic import Field, StrictBool, StrictInt, StrictStr

from relgate.catalog.snapshot_table import get_snapshot
from relgate.errors import RejectedError
from relgate.integrity.contract import Contract
from relgate.integrity.hashing import sha256_rows
from relgate.integrity.merkle import LeafProof, MerkleTree
from relgate.integrity.tuples import MemberTuple
from relgate.snapshot import manifest as mf
from relgate.snapshot.policy import BASIS_POINTS
from relgate.snapshot.validate import Canary, recompute
from relgate.workspace import Workspace


class OldNew(Contract):
    old: StrictInt
    new: StrictInt


class CountDelta(OldNew):
    delta: StrictInt


class DiffExamples(Contract):
    added: tuple[StrictStr, ...]
    deleted: tuple[StrictStr, ...]


class SnapshotDiff(Contract):
    """What changed between two snapshots' member tables."""

    old: StrictStr
    new: StrictStr
    counts: OldNew
    additions: StrictInt
    deletions: StrictInt
    content_changes: StrictInt
    split_migrations: dict[StrictStr, StrictInt]
    by_source: dict[StrictStr, CountDelta]
    by_split: dict[StrictStr, CountDelta]
    examples: DiffExamples


class ReplayResult(Contract):
    """A replay from the pinned sources that reproduced the member set."""

    snapshot: StrictStr
    canary_basis_points: StrictInt
    expected_ids: StrictInt
    replayed_ids: StrictInt
    missing: StrictInt
    extra: StrictInt
    transform_replay_hash: StrictStr
    stored_content_hash: StrictStr
    identical: StrictBool


class ProvenLeaf(Contract):
    """One leaf of a proof: its index, the member tuple and the audit path (hex)."""

    index: StrictInt
    member: MemberTuple = Field(alias="tuple")
    path: tuple[StrictStr, ...]


class MembershipProof(Contract):
    """An RFC 6962 inclusion proof, or non-inclusion by the two adjacent neighbours;
    :func:`relgate.integrity.merkle.check_proof` verifies its JSON."""

    kind: Literal["inclusion", "non-inclusion"]
    sample_id: StrictStr
    snapshot: StrictStr
    root: StrictStr
    size: StrictInt
    schema_digest: StrictStr
    leaves: tuple[ProvenLeaf, ...]


def load_manifest(ws: Workspace, digest: str) -> mf.SnapshotManifest:
    """The verified manifest of a catalogued snapshot (at the envelope version its row names)."""
    row = get_snapshot(ws.db, digest)
    return mf.load(ws.store, ws.trusted_keys, digest, row["envelope_version"])


def load_members(ws: Workspace, digest: str) -> pl.DataFrame:
    return ws.membership.read(load_manifest(ws, digest).members_ref)


def _counts(frame: pl.DataFrame, column: str) -> dict[str, int]:
    return {
        str(r[column]): int(r["len"]) for r in frame.group_by(column).len().iter_rows(named=True)
    }


def _delta(a: pl.DataFrame, b: pl.DataFrame, column: str) -> dict[str, CountDelta]:
    ca, cb = _counts(a, column), _counts(b, column)
    return {
        k: CountDelta(old=ca.get(k, 0), new=cb.get(k, 0), delta=cb.get(k, 0) - ca.get(k, 0))
        for k in sorted(set(ca) | set(cb))
    }


def diff(ws: Workspace, old: str, new: str, *, sample_limit: int = 20) -> SnapshotDiff:
    """Additions, deletions, content changes, split migrations, per-source/split deltas."""
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
    return SnapshotDiff(
        old=old,
        new=new,
        counts=OldNew(old=a.height, new=b.height),
        additions=added.height,
        deletions=deleted.height,
        content_changes=changed.height,
        split_migrations=migrations,
        by_source=_delta(a, b, "sourceId"),
        by_split=_delta(a, b, "split"),
        examples=DiffExamples(
            added=tuple(added["sampleId"].head(sample_limit).to_list()),
            deleted=tuple(deleted["sampleId"].head(sample_limit).to_list()),
        ),
    )


def shadow_diff(ws: Workspace, alias: str, new: str) -> SnapshotDiff | None:
    """The diff of ``new`` against the alias's active snapshot (None when there is none,
    or it is ``new`` itself)."""
    active = ws.gate().alias(alias, "snapshot").active_digest
    if active is None or active == new:
        return None
    return diff(ws, active, new)


def canary_filter(basis_points: int) -> Canary:
    """A fixed canary: ids whose SHA-256 bucket is below ``basis_points`` of 10000."""

    def keep(frame: pl.DataFrame) -> pl.DataFrame:
        if basis_points >= BASIS_POINTS:
            return frame
        raw = sha256_rows(frame["sampleId"].to_arrow(), prefix=b"canary\x00")
        words = np.frombuffer(raw, dtype=">u4").reshape(-1, 8)[:, 0].astype(np.int64)
        return frame.filter(pl.Series(words % BASIS_POINTS < basis_points, dtype=pl.Boolean))

    return keep


def _content_hash(digests: list[str]) -> str:
    return "sha256:" + hashlib.sha256("\n".join(digests).encode()).hexdigest()


def replay(ws: Workspace, digest: str, *, canary_bp: int = BASIS_POINTS) -> ReplayResult:
    """Re-run selection from the pinned sources; the member-id set must match exactly."""
    manifest = load_manifest(ws, digest)
    stored = ws.membership.read(manifest.members_ref)
    keep = canary_filter(canary_bp)
    replayed = recompute(ws, manifest, canary=keep)
    expected_ids = (
        set(keep(stored.select("sampleId"))["sampleId"].to_list())
        if canary_bp < BASIS_POINTS
        else set(stored["sampleId"].to_list())
    )
    got_ids = set(replayed["sampleId"].to_list())
    stored_subset = stored.filter(pl.col("sampleId").is_in(list(expected_ids))).sort("sampleId")
    replay_hash = _content_hash(replayed.sort("sampleId")["logicalContentDigest"].to_list())
    stored_hash = _content_hash(stored_subset["logicalContentDigest"].to_list())
    missing, extra = len(expected_ids - got_ids), len(got_ids - expected_ids)
    result = ReplayResult(
        snapshot=digest,
        canary_basis_points=canary_bp,
        expected_ids=len(expected_ids),
        replayed_ids=len(got_ids),
        missing=missing,
        extra=extra,
        transform_replay_hash=replay_hash,
        stored_content_hash=stored_hash,
        identical=missing == 0 and extra == 0 and replay_hash == stored_hash,
    )
    if not result.identical:
        raise RejectedError(
            "replay from pinned sources does not reproduce the member set",
            object="snapshot",
            check="replay-identical",
            digest=digest,
            details=result.to_json(),
        )
    return result


def prove(ws: Workspace, digest: str, sample_id: str) -> MembershipProof:
    """An RFC 6962 inclusion proof, or a non-inclusion proof by adjacent neighbours."""
    manifest = load_manifest(ws, digest)
    stored = ws.membership.read(manifest.members_ref)
    schema = manifest.record_schema
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
    pos = int(stored["sampleId"].search_sorted(sample_id, side="left"))

    def leaf(i: int) -> ProvenLeaf:
        return ProvenLeaf.parse(LeafProof(i, tuples[i], tree.audit_path(i)).to_json())

    included = pos < len(tuples) and tuples[pos].sample_id == sample_id
    leaves: tuple[ProvenLeaf, ...]
    if included:
        leaves = (leaf(pos),)
    else:
        leaves = tuple(leaf(i) for i in (pos - 1, pos) if 0 <= i < len(tuples))
    return MembershipProof(
        kind="inclusion" if included else "non-inclusion",
        sample_id=sample_id,
        snapshot=digest,
        root=root,
        size=len(tuples),
        schema_digest=schema,
        leaves=leaves,
    )
