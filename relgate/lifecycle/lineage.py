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

from pydantic import Field
from sqlalchemy import Connection

from relgate.catalog.db import rows
from relgate.errors import RelgateError
from relgate.gate.members import CatalogMemberIndex
from relgate.holds.retention import Holders, now_utc, retained_versions
from relgate.integrity.contract import Contract, Record
from relgate.integrity.merkle import check_proof
from relgate.objects.cas import ContentRef
from relgate.snapshot.diff import prove
from relgate.workspace import Workspace


class InclusionCheck(Contract):
    """An RFC 6962 inclusion proof of the sample against a signed snapshot, checked."""

    verified: bool
    snapshot: str
    kind: str | None = None
    root: str | None = None
    leaf_index: int | None = None
    error: str | None = None

    def to_json(self, *, exclude_none: bool = True) -> dict[str, Any]:
        return super().to_json(exclude_none=exclude_none)


class LineageVersion(Contract):
    """One version that has the sample as a member, proven."""

    kind: str
    subject: str = Field(validation_alias="digest", serialization_alias="digest")
    state: str
    held_by: list[str]
    reactivation: str
    proof: InclusionCheck


class LineagePin(Contract):
    pin_id: str
    kind: str
    owner: str
    reason: str
    expires_at: str | None
    subject: str = Field(validation_alias="digest", serialization_alias="digest")


class LineagePermit(Contract):
    permit_id: str
    state: str
    purpose: str
    root_digest: str


class LineageRun(Contract):
    run_id: str
    state: str
    root_digest: str


class Lineage(Contract):
    """Everything that holds one sample (``relgate lineage``)."""

    sample_id: str
    tombstoned: bool
    tombstones: list[int]
    versions: list[LineageVersion]
    pins: list[LineagePin]
    permits: list[LineagePermit]
    runs: list[LineageRun]
    held_versions: list[str]


class _Candidate(Record):
    """A snapshot or release row as lineage weighs it, with whether a fence hit it."""

    kind: str
    digest: str
    state: str
    members_digest: str
    members_version: str
    tombstone_watermark: int
    snapshot: str
    hit: bool


def _catalog_facts(conn: Connection, sample_id: str) -> tuple[list[int], Holders, list[_Candidate]]:
    """Tombstone entries of the sample, the retained set, and every version."""
    tombs = [
        int(row["seq"])
        for row in rows(
            conn, "SELECT seq FROM tombstones WHERE sample_id = :s ORDER BY seq", {"s": sample_id}
        )
    ]
    retained = retained_versions(conn, now_utc())
    candidates = []
    for kind, table in (("snapshot", "snapshots"), ("release", "releases")):
        snap_col = "digest" if kind == "snapshot" else "snapshot_digest"
        for row in rows(
            conn,
            f"SELECT digest, state, members_digest, members_version, tombstone_watermark,"  # noqa: S608 constant table and column names
            f" {snap_col} AS snapshot FROM {table} ORDER BY created_at, digest",
        ):
            hits = rows(
                conn,
                "SELECT fence_kind, fence_seq FROM fence_hits WHERE subject_digest = :d",
                {"d": row["digest"]},
            )
            candidates.append(_Candidate.parse({**row, "kind": kind, "hit": bool(hits)}, what=kind))
    return tombs, retained, candidates


class _Membership:
    """Membership answers for one sample, one lookup per membership table."""

    def __init__(self, ws: Workspace, sample_id: str) -> None:
        self.ws = ws
        self.sample_id = sample_id
        self.index = CatalogMemberIndex(ws.membership)
        self.memo: dict[tuple[str, str], bool] = {}
        self.proofs: dict[str, InclusionCheck] = {}

    def member(self, version: _Candidate) -> bool:
        key = (version.members_digest, version.members_version)
        if key not in self.memo:
            hit, _ = self.index.hits(ContentRef(key[0], key[1], 0), {self.sample_id}, set())
            self.memo[key] = bool(hit)
        return self.memo[key]

    def proof(self, snapshot: str) -> InclusionCheck:
        if snapshot not in self.proofs:
            self.proofs[snapshot] = _inclusion(self.ws, snapshot, self.sample_id)
        return self.proofs[snapshot]


def lineage(ws: Workspace, sample_id: str) -> Lineage:
    # Catalog facts first, in one short transaction; proofs read manifests and membership
    # outside it (on SQLite a transaction holds the writer lock).
    with ws.db.tx() as conn:
        tombs, retained, candidates = _catalog_facts(conn, sample_id)
    membership = _Membership(ws, sample_id)
    versions = []
    for version in candidates:
        if not membership.member(version):
            continue
        proof = membership.proof(version.snapshot)
        if not proof.verified:
            continue
        newer = [seq for seq in tombs if seq > version.tombstone_watermark]
        versions.append(
            LineageVersion(
                kind=version.kind,
                subject=version.digest,
                state=version.state,
                held_by=sorted(set(retained.get((version.kind, version.digest), []))),
                reactivation="refused" if version.hit or newer else "allowed",
                proof=proof,
            )
        )
    pins, permits, runs = _holders(ws, [v.subject for v in versions])
    return Lineage(
        sample_id=sample_id,
        tombstoned=bool(tombs),
        tombstones=tombs,
        versions=versions,
        pins=pins,
        permits=permits,
        runs=runs,
        held_versions=[v.subject for v in versions if v.held_by],
    )


def _holders(
    ws: Workspace, digests: list[str]
) -> tuple[list[LineagePin], list[LineagePermit], list[LineageRun]]:
    pins: list[LineagePin] = []
    permits: list[LineagePermit] = []
    runs: list[LineageRun] = []
    with ws.db.tx() as conn:
        for digest in digests:
            pins += [
                LineagePin.model_validate(r)
                for r in rows(
                    conn,
                    "SELECT pin_id, kind, owner, reason, expires_at, digest FROM pins"
                    " WHERE digest = :d AND state = 'HELD'",
                    {"d": digest},
                )
            ]
            permits += [
                LineagePermit.model_validate(r)
                for r in rows(
                    conn,
                    "SELECT permit_id, state, purpose, root_digest FROM permits"
                    " WHERE root_digest = :d",
                    {"d": digest},
                )
            ]
            runs += [
                LineageRun.model_validate(r)
                for r in rows(
                    conn,
                    "SELECT run_id, state, root_digest FROM runs WHERE root_digest = :d",
                    {"d": digest},
                )
            ]
    return pins, permits, runs


def _inclusion(ws: Workspace, snapshot: str, sample_id: str) -> InclusionCheck:
    """An RFC 6962 inclusion proof against the signed snapshot's tuple root, checked."""
    try:
        proof = prove(ws, snapshot, sample_id).to_json()
    except RelgateError as exc:
        return InclusionCheck(verified=False, error=exc.check or exc.code, snapshot=snapshot)
    verified = proof["kind"] == "inclusion" and check_proof(proof)
    return InclusionCheck(
        kind=proof["kind"],
        verified=verified,
        snapshot=snapshot,
        root=proof["root"],
        leaf_index=proof["leaves"][0]["index"] if verified else None,
    )
