"""Validate a snapshot by recomputing everything from its pinned sources.

Nothing the builder computed is trusted: the envelope's signature and digest are checked,
the membership table is re-read from the exact stored version and re-hashed (the local
cache is never trusted: a damaged copy is rebuilt and is no finding), selection is re-run from the
pinned source versions, and the two multisets are diffed in full.  The report counts each
check; the snapshot moves to VALIDATED only when every count that must be zero is zero
(among them :data:`ORPHAN_IDS` and :data:`UNEXPLAINED_ROWS`).  A late CDC event sends it
to INCOMPLETE instead of REJECTED.  The signed ``relgate.snapshot.validation.v2`` report
also carries source-watermark coverage, unversioned objects and lineage
(:mod:`relgate.snapshot.coverage`), set differences with example ids, replay hashes,
build latency, per-source row accounting and tombstone matches.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping, Sequence
from functools import partial
from typing import Final, Literal

import polars as pl
from pydantic import Field, StrictInt, StrictStr

from relgate.catalog.snapshot_table import SnapshotReportRow, get_snapshot, record_snapshot_report
from relgate.catalog.states import transition
from relgate.documents import snapshot_manifest as mf
from relgate.documents.membership import Tally
from relgate.documents.source_pins import ObjectPrefixPin, SourceEntry
from relgate.errors import IntegrityError, RelgateError
from relgate.gate.fences import Fences
from relgate.integrity.contract import Contract
from relgate.progress import track
from relgate.snapshot import reports
from relgate.snapshot.build import fenced_at, pinned_sources, source_configs
from relgate.snapshot.comparator import ContentHasher, ReplayHashes
from relgate.snapshot.coverage import (
    BuildLatency,
    Lineage,
    LineageIndex,
    SourceCoverage,
    build_latency,
    lineage,
    source_coverage,
)
from relgate.snapshot.external_sort import SortedRuns, aligned
from relgate.snapshot.selection import MEMBER_FRAME_SCHEMA, Fenced, Selector
from relgate.snapshot.transform_tags import pinned_transform
from relgate.sources.factory import source_from_config
from relgate.sources.source import Source
from relgate.workspace import Workspace

REPORT_SCHEMA: Final = "relgate.snapshot.validation.v2"
REPORT_PAYLOAD_TYPE = reports.VALIDATION_PAYLOAD_TYPE
#: Members not produced by the recompute or not traceable to a pinned source version.
ORPHAN_IDS: Final = "orphanIds"
#: Source rows not accounted for by members + selection drops + fence exclusions.
UNEXPLAINED_ROWS: Final = "unexplainedRows"
#: Sample ids a set difference names per kind (ids only, never content).
EXAMPLE_LIMIT = 5

#: Checks whose count must be zero.
ZERO_CHECKS = (
    "duplicateIds",
    "idsInSeveralSplits",
    "unknownSplits",
    "unknownOrigins",
    "tombstoneHits",
    "benchmarkHits",
    "unreadableSources",
    "lateEvents",
    "missingMembers",
    "extraMembers",
    "contentMismatches",
    "splitMismatches",
    "sourceVersionMismatches",
    ORPHAN_IDS,
    UNEXPLAINED_ROWS,
)


def _absent(value: object) -> bool:
    return value is None


Outcome = Literal["VALIDATED", "REJECTED", "INCOMPLETE"]
#: A member-table filter applied to every source batch before selection (replay canaries).
Canary = Callable[[pl.DataFrame], pl.DataFrame]


class ValidationFacts(Contract):
    """What validation measured (a fact is absent when a fatal refusal came first)."""

    members: StrictInt | None = Field(default=None, exclude_if=_absent)
    manifest_members: StrictInt | None = Field(default=None, exclude_if=_absent)
    tuple_root: StrictStr | None = Field(default=None, exclude_if=_absent)
    splits: dict[StrictStr, StrictInt] | None = Field(default=None, exclude_if=_absent)


class SetExamples(Contract):
    """Up to :data:`EXAMPLE_LIMIT` sampleIds per kind of set difference."""

    missing: tuple[StrictStr, ...] = ()
    extra: tuple[StrictStr, ...] = ()
    content_substitutions: tuple[StrictStr, ...] = ()
    split_conflicts: tuple[StrictStr, ...] = ()


class SetDifferences(Contract):
    """Stored against recomputed: ids only one side has, content under the same id that
    differs, ids whose split differs (or that sit in several splits)."""

    missing: StrictInt
    extra: StrictInt
    content_substitutions: StrictInt
    split_conflicts: StrictInt
    examples: SetExamples


class SourceRows(Contract):
    """One source's rows as selection accounted for them; ``unexplained`` must be 0."""

    source: StrictStr
    source_rows: StrictInt
    dropped_by_selection: StrictInt
    excluded_tombstoned: StrictInt
    excluded_benchmark: StrictInt
    members: StrictInt
    unexplained: StrictInt


class Tombstones(Contract):
    """Tombstoned ids found among the members (must be 0) and excluded at selection."""

    matches_in_members: StrictInt
    excluded_at_selection: StrictInt


class ValidationReport(Contract):
    """The signed ``relgate.snapshot.validation.v2`` report; ``report_digest`` (the CAS
    digest of its envelope) is known only after signing and is not part of the payload.
    A section is absent when a fatal refusal came before it was measured."""

    schema_name: Literal["relgate.snapshot.validation.v2"] = Field(
        default=REPORT_SCHEMA, alias="schema"
    )
    snapshot: StrictStr
    outcome: Outcome
    checks: dict[StrictStr, StrictInt]
    facts: ValidationFacts
    problems: tuple[StrictStr, ...]
    coverage: tuple[SourceCoverage, ...] = ()
    lineage: Lineage | None = Field(default=None, exclude_if=_absent)
    set_differences: SetDifferences | None = Field(default=None, exclude_if=_absent)
    replay_hashes: ReplayHashes | None = Field(default=None, exclude_if=_absent)
    build_latency: BuildLatency | None = Field(default=None, exclude_if=_absent)
    row_accounting: tuple[SourceRows, ...] = ()
    tombstones: Tombstones | None = Field(default=None, exclude_if=_absent)
    report_digest: StrictStr | None = Field(default=None, exclude=True)
    report_version: StrictStr | None = Field(default=None, exclude=True)

    @property
    def ok(self) -> bool:
        return self.outcome == "VALIDATED"

    @property
    def failing(self) -> dict[str, int]:
        return {k: v for k, v in self.checks.items() if v}

    @property
    def primary_check(self) -> str | None:
        """The failing check a refusal names: orphans and unexplained rows first (they mean
        the table holds what no pinned source explains), then the first by name."""
        failing = self.failing
        for name in (ORPHAN_IDS, UNEXPLAINED_ROWS):
            if failing.get(name):
                return name
        return min(failing, default=None)


def _joined(stored: pl.DataFrame, expected: pl.DataFrame) -> pl.DataFrame:
    """Stored (first row per id) full-joined with expected on sampleId (``_exp`` suffix)."""
    stored_first = stored.unique(subset="sampleId", keep="first")
    return stored_first.join(expected, on="sampleId", how="full", suffix="_exp", coalesce=True)


def multiset_diff(stored: pl.DataFrame, expected: pl.DataFrame) -> dict[str, int]:
    """Full diff of two member tables keyed by sampleId (streaming-friendly polars plan)."""
    dup = stored.group_by("sampleId").len().filter(pl.col("len") > 1)
    joined = _joined(stored, expected)
    missing = joined.filter(pl.col("sourceId").is_null()).height
    extra = joined.filter(pl.col("sourceId_exp").is_null()).height
    both = joined.filter(pl.col("sourceId").is_not_null() & pl.col("sourceId_exp").is_not_null())
    return {
        "duplicateIds": int(dup["len"].sum() - dup.height) if dup.height else 0,
        "missingMembers": missing,
        "extraMembers": extra,
        "contentMismatches": both.filter(
            pl.col("logicalContentDigest") != pl.col("logicalContentDigest_exp")
        ).height,
        "splitMismatches": both.filter(pl.col("split") != pl.col("split_exp")).height,
        "sourceVersionMismatches": both.filter(
            (pl.col("sourceVersion") != pl.col("sourceVersion_exp"))
            | (pl.col("sourceId") != pl.col("sourceId_exp"))
        ).height,
    }


def _fenced(ws: Workspace, manifest: mf.SnapshotManifest) -> Fenced:
    return fenced_at(ws, Fences(manifest.tombstone_watermark, manifest.benchmark_fence))


def _selector(
    ws: Workspace, manifest: mf.SnapshotManifest, canary: Canary | None, *, keep_content: bool
) -> tuple[Selector, dict[str, Source]]:
    """Selection as the manifest pins it (pins, policies, transform digest, fences)."""
    records = manifest.record_schema_document
    sources = pinned_sources(ws, manifest.sources, manifest.digest, records)
    transform = pinned_transform(ws, manifest)
    policies = manifest.policies
    if (
        policies.selection.digest() != manifest.selection_policy
        or policies.split.digest() != manifest.split_policy
    ):
        raise IntegrityError(
            "embedded policy text does not match its digest",
            object="policies",
            check="policy-digest",
            digest=manifest.digest,
        )
    selector = Selector(
        transform=transform,
        records=records,
        selection=policies.selection,
        split=policies.split,
        fenced=_fenced(ws, manifest),
        canary=canary,
        keep_content=keep_content,
    )
    return selector, sources


def recompute(
    ws: Workspace,
    manifest: mf.SnapshotManifest,
    canary: Canary | None = None,
    *,
    keep_content: bool = False,
) -> pl.DataFrame:
    """Selection re-run from the manifest alone, sorted by sampleId, in memory."""
    selector, sources = _selector(ws, manifest, canary, keep_content=keep_content)
    return selector.members(sources, manifest.sources)


class _Findings:
    """Counts, facts, problems and report sections gathered while checking one snapshot."""

    def __init__(self) -> None:
        self.checks: dict[str, int] = dict.fromkeys(ZERO_CHECKS, 0)
        self.facts: dict[str, object] = {}
        self.problems: list[str] = []
        self.sections: dict[str, object] = {}
        self.coverage: list[SourceCoverage] = []


_EMPTY = pl.DataFrame(schema=MEMBER_FRAME_SCHEMA)
#: Multiset-diff counts, summed over the aligned key ranges of stored and recomputed.
_DIFF_CHECKS = (
    "duplicateIds",
    "missingMembers",
    "extraMembers",
    "contentMismatches",
    "splitMismatches",
    "sourceVersionMismatches",
)
Frames = Callable[[], Iterator[pl.DataFrame]]
#: The diff counts whose ranges are searched for set-difference examples.
_EXAMPLE_CHECKS = ("missingMembers", "extraMembers", "contentMismatches", "splitMismatches")


class _StoredScan:
    """One pass over the stored table in its own order: the tally, the order-free
    structure checks, lineage, and whether it is sorted by sampleId."""

    def __init__(self, manifest: mf.SnapshotManifest, fenced: Fenced, index: LineageIndex) -> None:
        self.tally = Tally(manifest.record_schema)
        self.index = index
        self.traced = 0
        self.split_names = pl.Series([n for n, _ in manifest.policies.split.buckets])
        self.source_ids = pl.Series([e.id for e in manifest.sources], dtype=pl.String)
        self.tombs = pl.Series(sorted(fenced.sample_ids), dtype=pl.String)
        self.benchmarks = pl.Series(sorted(fenced.content_digests), dtype=pl.String)
        self.checks = dict.fromkeys(
            ("unknownSplits", "unknownOrigins", "tombstoneHits", "benchmarkHits"), 0
        )
        self.sorted = True
        self._last: str | None = None

    def add(self, chunk: pl.DataFrame) -> None:
        if not chunk.height:
            return
        self.tally.add(chunk)
        self.traced += int(self.index.traced(chunk).sum())
        checks = self.checks
        checks["unknownSplits"] += int((~chunk["split"].is_in(self.split_names.implode())).sum())
        checks["unknownOrigins"] += int((~chunk["sourceId"].is_in(self.source_ids.implode())).sum())
        checks["tombstoneHits"] += int(chunk["sampleId"].is_in(self.tombs.implode()).sum())
        checks["benchmarkHits"] += int(
            chunk["logicalContentDigest"].is_in(self.benchmarks.implode()).sum()
        )
        ids = chunk["sampleId"]
        first = str(ids[0])
        if not ids.is_sorted() or (self._last is not None and first < self._last):
            self.sorted = False
        self._last = str(ids[-1])


def _several_splits(chunk: pl.DataFrame) -> int:
    per_id = chunk.group_by("sampleId").agg(pl.col("split").n_unique().alias("n"))
    return per_id.filter(pl.col("n") > 1).height


def _key_local(stored: Frames) -> tuple[int, int]:
    """Ids in several splits and duplicate rows, over the sorted stored table alone."""
    several = duplicates = 0
    for (chunk,) in aligned([stored()], [_EMPTY]):
        several += _several_splits(chunk)
        duplicates += chunk.height - chunk["sampleId"].n_unique()
    return several, duplicates


class _Diff:
    """Diff counts, set-difference examples, replay hashes and orphans over aligned
    ranges of the stored (``got``) and recomputed (``want``) tables."""

    def __init__(self, index: LineageIndex) -> None:
        self.index = index
        self.totals = dict.fromkeys(_DIFF_CHECKS, 0)
        self.several = 0
        self.orphans = 0
        self.expected, self.replayed = ContentHasher(), ContentHasher()
        self.examples: dict[str, list[str]] = {
            "missing": [],
            "extra": [],
            "contentSubstitutions": [],
            "splitConflicts": [],
        }

    def add(self, got: pl.DataFrame, want: pl.DataFrame) -> None:
        several = _several_splits(got)
        self.several += several
        counts = multiset_diff(got, want)
        for name, count in counts.items():
            self.totals[name] += count
        self.expected.add_series(got["logicalContentDigest"])
        self.replayed.add_series(want["logicalContentDigest"])
        orphan = ~self.index.traced(got) | ~got["sampleId"].is_in(want["sampleId"].implode())
        self.orphans += got.filter(orphan)["sampleId"].n_unique()
        differs = several or any(counts[k] for k in _EXAMPLE_CHECKS)
        if differs and any(len(v) < EXAMPLE_LIMIT for v in self.examples.values()):
            for name, ids in _difference_ids(got, want).items():
                held = self.examples[name]
                held.extend(ids[: EXAMPLE_LIMIT - len(held)])

    def differences(self) -> SetDifferences:
        totals, ex = self.totals, self.examples
        return SetDifferences(
            missing=totals["missingMembers"],
            extra=totals["extraMembers"],
            content_substitutions=totals["contentMismatches"],
            split_conflicts=totals["splitMismatches"] + self.several,
            examples=SetExamples.model_validate({k: tuple(v) for k, v in ex.items()}),
        )


def _difference_ids(got: pl.DataFrame, want: pl.DataFrame) -> dict[str, list[str]]:
    """Up to :data:`EXAMPLE_LIMIT` sampleIds of each set difference in one range."""
    joined = _joined(got, want)
    both = pl.col("sourceId").is_not_null() & pl.col("sourceId_exp").is_not_null()
    kinds = {
        "missing": pl.col("sourceId").is_null(),
        "extra": pl.col("sourceId_exp").is_null(),
        "contentSubstitutions": both
        & (pl.col("logicalContentDigest") != pl.col("logicalContentDigest_exp")),
        "splitConflicts": both & (pl.col("split") != pl.col("split_exp")),
    }
    return {
        name: joined.filter(rule)["sampleId"].head(EXAMPLE_LIMIT).to_list()
        for name, rule in kinds.items()
    }


def _source_rows(entry_id: str, counts: Mapping[str, int], members: int) -> SourceRows:
    dropped = counts["excludedByTransform"] + counts["excludedBySelection"]
    tombs, bench = counts["excludedTombstoned"], counts["excludedBenchmark"]
    return SourceRows(
        source=entry_id,
        source_rows=counts["sourceRows"],
        dropped_by_selection=dropped,
        excluded_tombstoned=tombs,
        excluded_benchmark=bench,
        members=members,
        unexplained=counts["sourceRows"] - dropped - tombs - bench - members,
    )


def _select_per_source(
    selector: Selector,
    sources: Mapping[str, Source],
    entries: Sequence[SourceEntry],
    runs: SortedRuns,
    stored_by_source: Mapping[str, int],
) -> list[SourceRows]:
    """Selection source by source into ``runs``, with each source's row accounting."""
    accounting = []
    for entry in track(entries, "recompute sources", total=len(entries)):
        before = dict(selector.counts)
        for batch in selector.batches(sources, [entry]):
            runs.add(batch)
        delta = {k: v - before[k] for k, v in selector.counts.items()}
        accounting.append(_source_rows(entry.id, delta, stored_by_source.get(entry.id, 0)))
    return accounting


def _diff_recomputed(
    ws: Workspace,
    manifest: mf.SnapshotManifest,
    stored: Frames,
    scan: _StoredScan,
    found: _Findings,
) -> None:
    """Selection re-run into an out-of-core sort, then diffed range by range."""
    checks = found.checks
    with SortedRuns(MEMBER_FRAME_SCHEMA) as runs:
        try:
            selector, sources = _selector(ws, manifest, None, keep_content=False)
            rows = _select_per_source(
                selector, sources, manifest.sources, runs, scan.tally.by_source
            )
        except RelgateError:
            checks["idsInSeveralSplits"] = _key_local(stored)[0]  # counted before the refusal
            raise
        diff = _Diff(scan.index)
        for got, want in aligned([stored(), runs.merged()], [_EMPTY, _EMPTY]):
            diff.add(got, want)
    checks["idsInSeveralSplits"] = diff.several
    checks.update(diff.totals)
    checks[ORPHAN_IDS] = diff.orphans
    checks[UNEXPLAINED_ROWS] = sum(abs(r.unexplained) for r in rows)
    found.sections["rowAccounting"] = tuple(rows)
    found.sections["setDifferences"] = diff.differences()
    found.sections["replayHashes"] = ReplayHashes(
        expected=diff.expected.hexdigest, replayed=diff.replayed.hexdigest
    )
    found.sections["tombstones"] = Tombstones(
        matches_in_members=checks["tombstoneHits"],
        excluded_at_selection=sum(r.excluded_tombstoned for r in rows),
    )


def _readability(
    ws: Workspace, manifest: mf.SnapshotManifest, found: _Findings, index: LineageIndex
) -> None:
    """Readability, late events and watermark coverage, source by source."""
    checks = found.checks
    configs = source_configs(ws)
    for entry in manifest.sources:
        if entry.id not in configs:
            found.problems.append(f"source {entry.id} is not configured here")
            checks["unreadableSources"] += 1
            found.coverage.append(
                SourceCoverage(
                    source=entry.id,
                    kind=entry.kind,
                    pinned=entry.label,
                    late_events=0,
                    covered=False,
                )
            )
            continue
        source = source_from_config(configs[entry.id], ws.cas, manifest.record_schema_document)
        unreadable = source.check_readable(entry)
        found.problems.extend(unreadable)
        checks["unreadableSources"] += len(unreadable)
        late = source.late_events(entry)
        checks["lateEvents"] += late
        listing = (
            sum(1 for _ in ws.store.list(entry.prefix))
            if isinstance(entry, ObjectPrefixPin)
            else None
        )
        found.coverage.append(
            source_coverage(
                source,
                entry,
                late=late,
                readable=not unreadable,
                listing=listing,
                unversioned=index.unversioned,
            )
        )


def _check_stored(ws: Workspace, manifest: mf.SnapshotManifest, found: _Findings) -> None:
    """Structure checks on the stored table, then readability, then the full recompute;
    every pass streams (the stored table is sorted out of core if it is not sorted)."""
    checks = found.checks
    ref = manifest.members_ref
    # The exact stored version, re-read and hashed now (never the local cache's word): a
    # stored object that fails its digest is a finding; a damaged cache is only rebuilt.
    ws.membership.path(ref, from_store=True)
    found.sections["buildLatency"] = build_latency(manifest)
    index = LineageIndex(ws.cas, manifest.sources)
    scan = _StoredScan(manifest, _fenced(ws, manifest), index)
    for chunk in ws.membership.frames(ref):
        scan.add(chunk)
    found.facts["members"] = scan.tally.rows
    found.facts["manifestMembers"] = manifest.member_count
    found.sections["lineage"] = lineage(scan.tally.rows, scan.traced)
    checks.update(scan.checks)
    with SortedRuns(MEMBER_FRAME_SCHEMA) as resorted:
        stored: Frames = partial(ws.membership.frames, ref)
        if not scan.sorted:
            for chunk in ws.membership.frames(ref):
                resorted.add(chunk)
            stored = resorted.merged
        _readability(ws, manifest, found, index)
        if checks["unreadableSources"] == 0:
            _diff_recomputed(ws, manifest, stored, scan, found)
        else:
            checks["idsInSeveralSplits"], checks["duplicateIds"] = _key_local(stored)
            checks[ORPHAN_IDS] = scan.tally.rows - scan.traced
    root = scan.tally.tuple_root
    found.facts["tupleRoot"] = root
    checks["tupleRootMismatch"] = int(root != manifest.tuple_root)
    checks["memberCountMismatch"] = int(scan.tally.rows != manifest.member_count)
    split_counts = scan.tally.splits
    checks["splitCountMismatch"] = int(split_counts != manifest.splits)
    found.facts["splits"] = split_counts


def _outcome(failing: Mapping[str, int]) -> Outcome:
    if not failing:
        return "VALIDATED"
    if set(failing) == {"lateEvents"}:
        return "INCOMPLETE"
    return "REJECTED"


def _record(ws: Workspace, report: ValidationReport, state: str, *, actor: str) -> None:
    """The report rows and the state change they justify, in one transaction."""
    digest, ref_digest = report.snapshot, str(report.report_digest)
    row = SnapshotReportRow(
        snapshot=digest,
        kind="validation",
        outcome=report.outcome,
        report_digest=ref_digest,
        report_version=str(report.report_version),
        actor=actor,
    )
    with ws.db.tx() as conn:
        record_snapshot_report(conn, row, ok=report.ok)
        if state == "BUILDING" and report.ok:
            transition(
                conn, "snapshot", digest, "VALIDATED", actor=actor, reason=f"report {ref_digest}"
            )
        elif state in ("BUILDING", "VALIDATED", "APPROVED") and not report.ok:
            transition(
                conn,
                "snapshot",
                digest,
                report.outcome,
                actor=actor,
                reason=f"report {ref_digest}: {sorted(report.failing)}",
            )


def validate_snapshot(ws: Workspace, digest: str, *, actor: str) -> ValidationReport:
    """Recompute everything from the pinned sources; sign and record the report."""
    row = get_snapshot(ws.db, digest)
    found = _Findings()
    try:
        manifest = mf.load(ws.store, ws.trusted_keys, digest, row.envelope_version)
        _check_stored(ws, manifest, found)
    except RelgateError as exc:
        # a stored object failing its digest is named with what was expected and found
        named = [f"{k}={exc.details[k]}" for k in ("expected", "actual") if k in exc.details]
        found.problems.append(" ".join([str(exc), *named]))
        found.checks[f"fatal:{exc.check or exc.code}"] = 1
    failing = {k: v for k, v in found.checks.items() if v}
    report = ValidationReport.model_validate(
        {
            "snapshot": digest,
            "outcome": _outcome(failing),
            "checks": found.checks,
            "facts": ValidationFacts.model_validate(found.facts),
            "problems": tuple(found.problems),
            "coverage": tuple(found.coverage),
            **{k: v for k, v in found.sections.items() if v is not None},
        }
    )
    ref = reports.store_report(ws, "validation", report)
    report = report.model_copy(
        update={"report_digest": ref.digest, "report_version": ref.version_id}
    )
    _record(ws, report, row.state, actor=actor)
    return report
