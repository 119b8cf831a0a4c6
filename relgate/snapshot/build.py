"""Build a snapshot: freeze the boundary, select members, write, sign, record.

Freeze order (seed 002): the fence watermarks are read first, then each source is
pinned, then selection and transform run against exactly those pins.  Anything that
arrives afterwards belongs to the next snapshot.
"""

from __future__ import annotations

import datetime as dt
import tempfile
import uuid
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

from pydantic import StrictInt, StrictStr

from relgate import __version__
from relgate.catalog.snapshot_table import insert_snapshot, record_build_failure
from relgate.documents import snapshot_manifest as mf
from relgate.documents.membership import MembershipWriter, Tally
from relgate.documents.policy import (
    PredicatePolicy,
    SelectionPolicy,
    SplitPolicy,
    selection_from_json,
)
from relgate.documents.source_pins import SourceEntry
from relgate.documents.transform_spec import TransformSpec
from relgate.documents.verified_bytes import verify_stored
from relgate.errors import RejectedError, RelgateError
from relgate.gate.fences import Fences, fenced_entries, read_fences
from relgate.gate.transitions import open_gate
from relgate.holds.pins import PublisherLease, publisher_lease, source_pin_keys
from relgate.integrity.contract import Contract
from relgate.integrity.digests import require_digest
from relgate.objects.layout import statistics_key
from relgate.progress import track
from relgate.records.record_schema import TEXT_SCHEMA, RecordSchema
from relgate.snapshot import statistics, tokenizer
from relgate.snapshot.external_sort import SortedRuns
from relgate.snapshot.provenance import record_statement, store_statement
from relgate.snapshot.reuse import BuildInputs, built_from
from relgate.snapshot.selection import MEMBER_FRAME_SCHEMA, Fenced, Selector
from relgate.snapshot.transform_tags import (
    TransformRef,
    resolve_transform,
    transform_artifacts,
    transform_timeout,
)
from relgate.sources.factory import source_from_config
from relgate.sources.source import Source
from relgate.transforms.launcher import TransformRunner
from relgate.workspace import Workspace

#: Policies a workspace config that names none builds with (immutable models).
DEFAULT_SELECTION = SelectionPolicy()
DEFAULT_SPLIT = SplitPolicy()
#: Build failures that mean "try again later" rather than "this input is wrong".
_INCOMPLETE_CHECKS = ("cdc-contiguous", "source-consistent")
#: A build named a source id the workspace config does not declare.
SOURCE_UNKNOWN = "source-unknown"
#: A build would select no member (refused unless the spec allows an empty snapshot).
EMPTY_SELECTION = "empty-selection"


@dataclass
class BuildSpec:
    """What to build (a request, not a document: the CLI fills it in from its flags)."""

    purpose: str
    transform: str
    selection: SelectionPolicy | PredicatePolicy = DEFAULT_SELECTION
    split: SplitPolicy = DEFAULT_SPLIT
    records: RecordSchema = TEXT_SCHEMA
    parents: list[str] = field(default_factory=list)
    source_ids: list[str] | None = None  # default: every configured source
    #: build a snapshot with no member instead of refusing it (``empty-selection``)
    allow_empty: bool = False

    @classmethod
    def from_config(cls, config: Mapping[str, object]) -> BuildSpec:
        """The ``snapshot:`` section of a workspace config (defaults for what it omits)."""
        snap = config.get("snapshot", {})
        if not isinstance(snap, Mapping):
            snap = {}
        return cls(
            purpose=str(snap.get("purpose", "training")),
            transform=str(snap.get("transform", "registry.local/normalize:v1")),
            selection=selection_from_json(snap["selection"])
            if "selection" in snap
            else DEFAULT_SELECTION,
            split=SplitPolicy.from_json(snap["split"]) if "split" in snap else DEFAULT_SPLIT,
            records=RecordSchema.from_config(snap["recordSchema"])
            if "recordSchema" in snap
            else TEXT_SCHEMA,
            allow_empty=snap.get("allowEmpty") is True,
        )


class BuildResult(Contract):
    """A built snapshot: its sealed manifest and the selection counters.  ``existing``: a
    re-run on unchanged input that reports the snapshot already built (no counters)."""

    manifest: mf.SnapshotManifest
    counts: dict[StrictStr, StrictInt]
    existing: bool = False

    @property
    def digest(self) -> str:  # type: ignore[override]  # a build's digest is its snapshotId
        return self.manifest.snapshot_id


class Frozen(Contract):
    """The consistent boundary: fences read first, then every source's pin."""

    build_id: StrictStr
    started: StrictStr
    tombstone_watermark: StrictInt
    benchmark_fence: StrictInt
    sources: tuple[SourceEntry, ...]
    #: repository/name@sha256:... resolved from the tag once
    transform_image: StrictStr
    #: what that digest pins
    transform_pin: TransformSpec

    @property
    def fences(self) -> Fences:
        return Fences(self.tombstone_watermark, self.benchmark_fence)

    @property
    def entries(self) -> tuple[SourceEntry, ...]:
        return self.sources

    @property
    def transform(self) -> str:
        return self.transform_image


def fenced_at(ws: Workspace, fences: Fences) -> Fenced:
    """The fence entries at or below ``fences`` (what a snapshot at them must exclude)."""
    with ws.db.tx() as conn:
        tombs, bench = fenced_entries(conn, fences)
    return Fenced(frozenset(tombs), frozenset(bench))


def source_configs(ws: Workspace) -> dict[str, Mapping[str, object]]:
    """The workspace's ``sources:`` config entries by id."""
    return {str(cfg["id"]): cfg for cfg in ws.config.get("sources", [])}


def configured_sources(
    ws: Workspace, only: Sequence[str] | None = None, records: RecordSchema = TEXT_SCHEMA
) -> dict[str, Source]:
    """The configured sources (all, or those named in ``only``), ready to pin or read
    records of ``records``."""
    return {
        source_id: source_from_config(cfg, ws.cas, records)
        for source_id, cfg in source_configs(ws).items()
        if only is None or source_id in only
    }


def selected_sources(ws: Workspace, spec: BuildSpec) -> list[str]:
    """The source ids a build reads: refused when one is not configured (``source-unknown``)
    or when there is none to read and the spec does not allow an empty snapshot."""
    known = source_configs(ws)
    for source_id in spec.source_ids or ():
        if source_id not in known:
            raise RejectedError(
                f"no configured source has this id (configured: {sorted(known) or 'none'})",
                object=f"source {source_id!r}",
                check=SOURCE_UNKNOWN,
                details={"configured": sorted(known)},
            )
    chosen = [s for s in known if spec.source_ids is None or s in spec.source_ids]
    if not chosen and not spec.allow_empty:
        raise RejectedError(
            "the build selects no source; configure one or pass --allow-empty",
            object="sources",
            check=EMPTY_SELECTION,
        )
    return chosen


def _refuse_empty(spec: BuildSpec, staged: _Staged) -> None:
    if staged.tally.rows == 0 and not spec.allow_empty:
        raise RejectedError(
            "the selection is empty: no source row became a member; pass --allow-empty"
            " to build an empty snapshot",
            object="selection",
            check=EMPTY_SELECTION,
            details={"counts": staged.counts},
        )


def pinned_sources(
    ws: Workspace, entries: Sequence[SourceEntry], digest: str, records: RecordSchema
) -> dict[str, Source]:
    """The sources a manifest's entries name, reading its record schema; refused when
    this workspace lacks one."""
    configs = source_configs(ws)
    for entry in entries:
        if entry.id not in configs:
            raise RejectedError(
                "manifest names a source this workspace does not know",
                object=entry.id,
                check="source-known",
                digest=digest,
            )
    return {e.id: source_from_config(configs[e.id], ws.cas, records) for e in entries}


def _now() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _failed(ws: Workspace, build_id: str, exc: RelgateError) -> RelgateError:
    state = "INCOMPLETE" if exc.check in _INCOMPLETE_CHECKS else "REJECTED"
    record_build_failure(ws.db, build_id, state, str(exc), exc.to_json())
    exc.details.setdefault("build", {"id": build_id, "state": state})
    return exc


def freeze(ws: Workspace, spec: BuildSpec) -> Frozen:
    """Fence watermarks first, then each source's pin, then the transform digest."""
    chosen = selected_sources(ws, spec)  # a typo or nothing to read: refused, nothing recorded
    build_id = uuid.uuid4().hex
    started = _now()
    try:
        with ws.db.tx() as conn:
            fences = read_fences(conn)
        sources = configured_sources(ws, chosen, spec.records)
        entries = tuple(source.pin().entry for source in sources.values())
        transform_ref = resolve_transform(ws.db, spec.transform, ws.cas)
    except RelgateError as exc:
        raise _failed(ws, build_id, exc) from None
    return Frozen(
        build_id=build_id,
        started=started,
        tombstone_watermark=fences.tombstone_watermark,
        benchmark_fence=fences.benchmark_fence,
        sources=entries,
        transform_image=str(transform_ref),
        transform_pin=transform_ref.pin(),
    )


def build_snapshot(
    ws: Workspace,
    spec: BuildSpec,
    *,
    actor: str,
    frozen: Frozen | None = None,
    runner: TransformRunner | None = None,
) -> BuildResult:
    """Select members against a frozen boundary (made now unless given), sign, record."""
    frozen = frozen or freeze(ws, spec)
    # Held from selection to the catalog row: the source pin documents freeze() wrote and
    # everything staged here are unreferenced until the row commits.
    with (
        publisher_lease(ws, holder=f"snapshot-builder:{actor}:{frozen.build_id}") as lease,
        tempfile.TemporaryDirectory(prefix="relgate-build-") as tmp,
    ):
        lease.cover(*source_pin_keys(e.to_json() for e in frozen.sources))
        path = Path(tmp) / "members.parquet"
        try:
            staged = _stage_members(ws, spec, frozen, path, runner)
            _refuse_empty(spec, staged)
        except RelgateError as exc:
            raise _failed(ws, frozen.build_id, exc) from None
        return _write_snapshot(ws, spec, frozen, staged, actor=actor, lease=lease)


@dataclass(frozen=True)
class _Staged:
    """The membership table written to ``path``, its tally and the selection counters."""

    path: Path
    tally: Tally
    counts: dict[str, int]
    artifacts: tuple[mf.ArtifactRef, ...] = ()
    stats: statistics.SnapshotStatistics | None = None


def _stage_members(
    ws: Workspace, spec: BuildSpec, frozen: Frozen, path: Path, runner: TransformRunner | None
) -> _Staged:
    """The transform once over every source row, then selection streamed through an
    out-of-core sort into the membership parquet (statistics observed on the way)."""
    ref = TransformRef.parse(frozen.transform_image, frozen.transform_pin)
    token_artifacts = tokenizer.artifacts(ws, spec.records)
    observer = statistics.StatisticsObserver(
        spec.records, statistics.artifact_fetch(ws, token_artifacts)
    )
    sources = configured_sources(ws, [e.id for e in frozen.sources], spec.records)
    tally = Tally(spec.records.digest())
    with (
        ref.resolve(ws.cas, runner=runner, timeout_s=transform_timeout(ws)) as transform,
        transform.staged(sources, frozen.sources) as staged,
        SortedRuns(MEMBER_FRAME_SCHEMA) as runs,
    ):
        selector = Selector(
            observer=observer,
            transform=staged.transform,
            records=spec.records,
            selection=spec.selection,
            split=spec.split,
            fenced=fenced_at(ws, frozen.fences),
        )
        for batch in track(selector.batches(staged.sources, frozen.sources), "select members"):
            runs.add(batch)
        writer = MembershipWriter(path)
        for chunk in runs.merged():
            writer.write(chunk)
            tally.add(chunk)
        writer.close()
    counts = dict(selector.counts)
    if staged.facts is not None:  # selection read the transform's output, not the sources
        counts["sourceRows"] = staged.facts.rows_in
        counts["transformOutputRows"] = staged.facts.rows_out
        counts["excludedByTransform"] += staged.facts.rows_in - staged.facts.rows_out
    counts["members"] = tally.rows
    artifacts = (*token_artifacts, *transform_artifacts(ref.pin()))
    return _Staged(path, tally, counts, artifacts, observer.document())


def build_for_alias(
    ws: Workspace,
    frozen: Frozen,
    *,
    alias: str,
    actor: str,
    purpose: str = "",
    runner: TransformRunner | None = None,
) -> BuildResult:
    """Build from the workspace's spec with the alias's active snapshot as parent; when
    that snapshot was built from exactly this input, report it instead (``existing``)."""
    spec = BuildSpec.from_config(ws.config)
    active = open_gate(ws).alias(alias, "snapshot").active_digest
    spec = replace(spec, purpose=purpose or spec.purpose, parents=[active] if active else [])
    if active is not None:
        built = built_from(ws, active, _inputs(spec, frozen))
        if built is not None:
            return BuildResult(manifest=built, counts={}, existing=True)
    return build_snapshot(ws, spec, actor=actor, frozen=frozen, runner=runner)


def _inputs(spec: BuildSpec, frozen: Frozen) -> BuildInputs:
    return BuildInputs(
        sources=tuple(frozen.sources),
        tombstone_watermark=frozen.tombstone_watermark,
        benchmark_fence=frozen.benchmark_fence,
        transform_image=frozen.transform_image,
        transform=frozen.transform_pin,
        record_schema_document=spec.records,
        selection_policy=spec.selection.digest(),
        split_policy=spec.split.digest(),
        purpose=spec.purpose,
    )


def _provenance(ws: Workspace, spec: BuildSpec, frozen: Frozen, *, actor: str) -> mf.Provenance:
    """PROV lineage whose edges are digests: each source by its canonical entry's digest
    (which covers its snapshot id, pin list or metadata-file digest), parents by snapshotId.
    The SLSA statement (:mod:`relgate.snapshot.provenance`) lists the materials themselves."""
    derived = [mf.Derivation(entity=e.digest(), kind=e.kind) for e in frozen.sources]
    derived += [
        mf.Derivation(entity=require_digest(p, what="parent snapshot"), kind="snapshot")
        for p in spec.parents
    ]
    return mf.Provenance(
        was_derived_from=tuple(derived),
        was_generated_by=mf.Generation(
            activity="relgate.snapshot.build",
            build_id=frozen.build_id,
            transform=frozen.transform_image,
            started_at_time=frozen.started,
            ended_at_time=_now(),
        ),
        was_associated_with=mf.Association(
            agent=actor, builder=f"relgate {__version__}", keyid=ws.signing_key.keyid
        ),
    )


def _write_snapshot(
    ws: Workspace,
    spec: BuildSpec,
    frozen: Frozen,
    staged: _Staged,
    *,
    actor: str,
    lease: PublisherLease,
) -> BuildResult:
    """Stage membership and the signed manifest under a publisher lease, then the row."""
    tally = staged.tally
    # streamed (50M members are gigabytes), hashed once, leased before it exists
    members_ref = ws.cas.put_file(staged.path, before_store=lease.cover)
    stats_ref = None
    if staged.stats is not None:
        lease.cover(statistics_key(staged.stats.digest()))
        stats_ref = statistics.store(ws, staged.stats)
    body = _inputs(spec, frozen).body(
        parents=tuple(spec.parents),
        record_schema=tally.schema_digest,
        members=mf.MembersRef(
            uri=members_ref.uri,
            object_version=members_ref.version_id,
            size=members_ref.size,
            count=tally.rows,
            tuple_root=tally.tuple_root,
            media_type=mf.MEMBERS_MEDIA_TYPE,
        ),
        splits=tally.splits,
        member_counts_by_source=tally.by_source,
        policies=mf.EmbeddedPolicies(selection=spec.selection, split=spec.split),
        provenance=_provenance(ws, spec, frozen, actor=actor),
        artifacts=staged.artifacts or None,
        statistics=stats_ref,
    )
    sealed = mf.seal(body)
    envelope = mf.sign(sealed, ws.signing_key)
    lease.cover(mf.envelope_key(sealed.digest))
    version = mf.store_envelope(ws.store, sealed, envelope)
    statement = store_statement(ws, sealed, lease)
    verified = verify_stored(ws.store, ws.trusted_keys, "snapshot", sealed.digest, version)
    with ws.db.tx() as conn:
        insert_snapshot(conn, sealed, version, actor=actor, verified=verified)
        record_statement(conn, sealed, statement)
    return BuildResult(manifest=sealed, counts=staged.counts)
