"""Build a snapshot: freeze the boundary, select members, write, sign, record.

Freeze order (seed 002): the fence watermarks are read first, then each source is
pinned, then selection and transform run against exactly those pins.  Anything that
arrives afterwards belongs to the next snapshot.
"""

from __future__ import annotations

import datetime as dt
import uuid
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import polars as pl

from relgate import __version__
from relgate.catalog.snapshot_table import insert_snapshot, record_build_failure
from relgate.errors import RelgateError
from relgate.gate.core import Fences, fenced_entries, read_fences
from relgate.integrity.digests import sha256_digest
from relgate.objects.cas import key_for
from relgate.snapshot import manifest as mf
from relgate.snapshot.membership import membership_parquet, tuple_root
from relgate.snapshot.policy import SelectionPolicy, SplitPolicy, TransformRef
from relgate.snapshot.selection import Fenced, select_members
from relgate.snapshot.transforms import resolve_transform
from relgate.sources.schema import record_schema_digest
from relgate.sources.source import Source, source_from_config
from relgate.workspace import Workspace

if TYPE_CHECKING:
    from relgate.lifecycle.pins import PublisherLease


@dataclass
class BuildSpec:
    purpose: str
    transform: str
    selection: SelectionPolicy = field(default_factory=SelectionPolicy)
    split: SplitPolicy = field(default_factory=SplitPolicy)
    parents: list[str] = field(default_factory=list)
    source_ids: list[str] | None = None  # default: every configured source

    @classmethod
    def from_config(cls, config: dict[str, Any]) -> BuildSpec:
        snap = config.get("snapshot", {})
        return cls(
            purpose=snap.get("purpose", "training"),
            transform=snap.get("transform", "registry.local/normalize:v1"),
            selection=SelectionPolicy.from_json(snap["selection"])
            if "selection" in snap
            else SelectionPolicy(),
            split=SplitPolicy.from_json(snap["split"]) if "split" in snap else SplitPolicy(),
        )


@dataclass
class BuildResult:
    digest: str
    manifest: mf.SnapshotManifest
    counts: dict[str, int]


def fenced_at(ws: Workspace, fences: Fences) -> Fenced:
    with ws.db.tx() as conn:
        tombs, bench = fenced_entries(conn, fences)
    return Fenced(frozenset(tombs), frozenset(bench))


def configured_sources(ws: Workspace, only: list[str] | None = None) -> dict[str, Source]:
    out = {}
    for cfg in ws.config.get("sources", []):
        if only is None or cfg["id"] in only:
            out[cfg["id"]] = source_from_config(cfg, ws.cas)
    return out


@dataclass(frozen=True)
class Frozen:
    """The consistent boundary: fences read first, then every source's pin."""

    build_id: str
    started: str
    fences: Fences
    entries: list[dict[str, Any]]
    transform: str  # repository/name@sha256:... resolved from the tag once

    def to_json(self) -> dict[str, Any]:
        return {
            "buildId": self.build_id,
            "tombstoneWatermark": self.fences.tombstone_watermark,
            "benchmarkFence": self.fences.benchmark_fence,
            "sources": self.entries,
            "transformImage": self.transform,
        }


def _failed(ws: Workspace, build_id: str, exc: RelgateError) -> RelgateError:
    state = "INCOMPLETE" if exc.check in ("cdc-contiguous", "source-consistent") else "REJECTED"
    record_build_failure(ws.db, build_id, state, str(exc), exc.to_json())
    exc.details.setdefault("build", {"id": build_id, "state": state})
    return exc


def freeze(ws: Workspace, spec: BuildSpec) -> Frozen:
    """Fence watermarks first, then each source's pin, then the transform digest."""
    build_id = uuid.uuid4().hex
    started = dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    try:
        with ws.db.tx() as conn:
            fences = read_fences(conn)
        sources = configured_sources(ws, spec.source_ids)
        entries = [source.pin().entry for source in sources.values()]
        transform_ref = resolve_transform(ws.db, spec.transform)
    except RelgateError as exc:
        raise _failed(ws, build_id, exc) from None
    return Frozen(build_id, started, fences, entries, str(transform_ref))


def build_snapshot(
    ws: Workspace, spec: BuildSpec, *, actor: str, frozen: Frozen | None = None
) -> BuildResult:
    """Select members against a frozen boundary (made now unless given), sign, record."""
    frozen = frozen or freeze(ws, spec)
    from relgate.lifecycle.pins import publisher_lease, source_pin_keys

    # Held from selection to the catalog row: the source pin documents freeze() wrote and
    # everything staged here are unreferenced until the row commits.
    with publisher_lease(ws, holder=f"snapshot-builder:{actor}:{frozen.build_id}") as lease:
        lease.cover(*source_pin_keys(frozen.entries))
        try:
            transform_ref = TransformRef.parse(frozen.transform)
            sources = configured_sources(ws, [e["id"] for e in frozen.entries])
            result = select_members(
                sources,
                frozen.entries,
                transform=transform_ref.resolve(),
                selection=spec.selection,
                split=spec.split,
                fenced=fenced_at(ws, frozen.fences),
            )
        except RelgateError as exc:
            raise _failed(ws, frozen.build_id, exc) from None
        return _write_snapshot(ws, spec, frozen, result, transform_ref, actor=actor, lease=lease)


def _write_snapshot(
    ws: Workspace,
    spec: BuildSpec,
    frozen: Frozen,
    result: Any,
    transform_ref: TransformRef,
    *,
    actor: str,
    lease: PublisherLease,
) -> BuildResult:
    """Stage membership and the signed manifest under a publisher lease, then the row."""
    fences, entries, build_id, started = (
        frozen.fences,
        frozen.entries,
        frozen.build_id,
        frozen.started,
    )
    members = result.members
    schema_digest = record_schema_digest()
    data = membership_parquet(members.to_arrow())
    lease.cover(key_for(sha256_digest(data)))  # leased before it exists
    members_ref = ws.cas.put(data)
    split_counts = members.group_by("split").len().sort("split")
    per_source = members.group_by("sourceId").len().sort("sourceId")
    body: dict[str, Any] = {
        "schema": mf.SCHEMA,
        "parents": list(spec.parents),
        "sources": entries,
        "tombstoneWatermark": fences.tombstone_watermark,
        "benchmarkFence": fences.benchmark_fence,
        "recordSchema": schema_digest,
        "selectionPolicy": spec.selection.digest,
        "transformImage": str(transform_ref),
        "members": {
            "uri": members_ref.uri,
            "objectVersion": members_ref.version_id,
            "size": members_ref.size,
            "count": members.height,
            "tupleRoot": tuple_root(members, schema_digest),
            "mediaType": "application/vnd.apache.parquet",
        },
        "splitPolicy": spec.split.digest,
        "purpose": spec.purpose,
        "splits": {row["split"]: row["len"] for row in split_counts.iter_rows(named=True)},
        "memberCountsBySource": {
            row["sourceId"]: row["len"] for row in per_source.iter_rows(named=True)
        },
        "policies": {"selection": spec.selection.to_json(), "split": spec.split.to_json()},
        "provenance": {
            "wasDerivedFrom": [
                *({"entity": e["id"], "kind": e["kind"]} for e in entries),
                *({"entity": p, "kind": "snapshot"} for p in spec.parents),
            ],
            "wasGeneratedBy": {
                "activity": "relgate.snapshot.build",
                "buildId": build_id,
                "transform": str(transform_ref),
                "startedAtTime": started,
                "endedAtTime": dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
            },
            "wasAssociatedWith": {
                "agent": actor,
                "builder": f"relgate {__version__}",
                "keyid": ws.signing_key.keyid,
            },
        },
    }
    sealed = mf.seal(body)
    envelope = mf.sign(sealed, ws.signing_key)
    lease.cover(mf.envelope_key(sealed.digest))
    version = mf.store_envelope(ws.store, sealed, envelope)
    with ws.db.tx() as conn:
        insert_snapshot(conn, sealed, version, actor=actor)
    return BuildResult(sealed.digest, sealed, result.counts)


def members_frame(ws: Workspace, manifest: mf.SnapshotManifest) -> pl.DataFrame:
    return ws.membership.read(manifest.members_ref)
