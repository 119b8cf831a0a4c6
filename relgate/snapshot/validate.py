"""Validate a snapshot by recomputing everything from its pinned sources.

Nothing the builder computed is trusted: the envelope's signature and digest are checked,
the membership table is re-read from its content address, selection is re-run from the
pinned source versions, and the two multisets are diffed in full.  The report counts each
check; the snapshot moves to VALIDATED only when every count that must be zero is zero.
A late CDC event sends it to INCOMPLETE instead of REJECTED.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import Final, Literal

import polars as pl
from pydantic import Field, StrictInt, StrictStr

from relgate.catalog.audit import record_report
from relgate.catalog.snapshot_table import get_snapshot
from relgate.catalog.states import transition
from relgate.errors import IntegrityError, RelgateError
from relgate.gate.fences import Fences
from relgate.integrity.contract import Contract
from relgate.integrity.signing import sign_envelope
from relgate.snapshot import manifest as mf
from relgate.snapshot.build import fenced_at, pinned_sources, source_configs
from relgate.snapshot.membership import Tally
from relgate.snapshot.policy import TransformRef
from relgate.snapshot.runs import SortedRuns, aligned
from relgate.snapshot.selection import MEMBER_FRAME_SCHEMA, Fenced, Selector
from relgate.sources.factory import source_from_config
from relgate.sources.source import Source
from relgate.workspace import Workspace

REPORT_SCHEMA: Final = "relgate.snapshot.validation.v1"
REPORT_PAYLOAD_TYPE = "application/vnd.relgate.validation-report.v1+json"

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


class ValidationReport(Contract):
    """The signed ``relgate.snapshot.validation.v1`` report; ``report_digest`` (the CAS
    digest of its envelope) is known only after signing and is not part of the payload."""

    schema_name: Literal["relgate.snapshot.validation.v1"] = Field(
        default=REPORT_SCHEMA, alias="schema"
    )
    snapshot: StrictStr
    outcome: Outcome
    checks: dict[StrictStr, StrictInt]
    facts: ValidationFacts
    problems: tuple[StrictStr, ...]
    report_digest: StrictStr | None = Field(default=None, exclude=True)
    report_version: StrictStr | None = Field(default=None, exclude=True)

    @property
    def ok(self) -> bool:
        return self.outcome == "VALIDATED"

    @property
    def failing(self) -> dict[str, int]:
        return {k: v for k, v in self.checks.items() if v}


def multiset_diff(stored: pl.DataFrame, expected: pl.DataFrame) -> dict[str, int]:
    """Full diff of two member tables keyed by sampleId (streaming-friendly polars plan)."""
    dup = stored.group_by("sampleId").len().filter(pl.col("len") > 1)
    stored_first = stored.unique(subset="sampleId", keep="first")
    joined = stored_first.join(expected, on="sampleId", how="full", suffix="_exp", coalesce=True)
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
    transform = TransformRef.parse(manifest.transform_image).resolve()
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
    """Counts, facts and problems gathered while checking one snapshot."""

    def __init__(self) -> None:
        self.checks: dict[str, int] = dict.fromkeys(ZERO_CHECKS, 0)
        self.facts: dict[str, object] = {}
        self.problems: list[str] = []


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


class _StoredScan:
    """One pass over the stored table in its own order: the tally, the order-free
    structure checks, and whether it is sorted by sampleId."""

    def __init__(self, manifest: mf.SnapshotManifest, fenced: Fenced) -> None:
        self.tally = Tally(manifest.record_schema)
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


def _diff_recomputed(
    ws: Workspace, manifest: mf.SnapshotManifest, stored: Frames, checks: dict[str, int]
) -> None:
    """Selection re-run into an out-of-core sort, then diffed range by range."""
    with SortedRuns(MEMBER_FRAME_SCHEMA) as runs:
        try:
            selector, sources = _selector(ws, manifest, None, keep_content=False)
            for batch in selector.batches(sources, manifest.sources):
                runs.add(batch)
        except RelgateError:
            checks["idsInSeveralSplits"] = _key_local(stored)[0]  # counted before the refusal
            raise
        totals = dict.fromkeys(_DIFF_CHECKS, 0)
        several = 0
        for got, want in aligned([stored(), runs.merged()], [_EMPTY, _EMPTY]):
            several += _several_splits(got)
            for name, count in multiset_diff(got, want).items():
                totals[name] += count
    checks["idsInSeveralSplits"] = several
    checks.update(totals)


def _readability(ws: Workspace, manifest: mf.SnapshotManifest, found: _Findings) -> None:
    checks = found.checks
    configs = source_configs(ws)
    for entry in manifest.sources:
        if entry.id not in configs:
            found.problems.append(f"source {entry.id} is not configured here")
            checks["unreadableSources"] += 1
            continue
        source = source_from_config(configs[entry.id], ws.cas, manifest.record_schema_document)
        unreadable = source.check_readable(entry)
        found.problems.extend(unreadable)
        checks["unreadableSources"] += len(unreadable)
        checks["lateEvents"] += source.late_events(entry)


def _check_stored(ws: Workspace, manifest: mf.SnapshotManifest, found: _Findings) -> None:
    """Structure checks on the stored table, then readability, then the full recompute;
    every pass streams (the stored table is sorted out of core if it is not sorted)."""
    checks = found.checks
    ref = manifest.members_ref
    scan = _StoredScan(manifest, _fenced(ws, manifest))
    for chunk in ws.membership.frames(ref):
        scan.add(chunk)
    found.facts["members"] = scan.tally.rows
    found.facts["manifestMembers"] = manifest.member_count
    checks.update(scan.checks)
    with SortedRuns(MEMBER_FRAME_SCHEMA) as resorted:
        stored: Frames = partial(ws.membership.frames, ref)
        if not scan.sorted:
            for chunk in ws.membership.frames(ref):
                resorted.add(chunk)
            stored = resorted.merged
        _readability(ws, manifest, found)
        if checks["unreadableSources"] == 0:
            _diff_recomputed(ws, manifest, stored, checks)
        else:
            checks["idsInSeveralSplits"], checks["duplicateIds"] = _key_local(stored)
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
    """The report row and the state change it justifies, in one transaction."""
    digest, ref_digest = report.snapshot, str(report.report_digest)
    with ws.db.tx() as conn:
        record_report(conn, "snapshot", digest, ref_digest, str(report.report_version), report.ok)
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
        manifest = mf.load(ws.store, ws.trusted_keys, digest, row["envelope_version"])
        _check_stored(ws, manifest, found)
    except RelgateError as exc:
        found.problems.append(str(exc))
        found.checks[f"fatal:{exc.check or exc.code}"] = 1
    failing = {k: v for k, v in found.checks.items() if v}
    report = ValidationReport(
        snapshot=digest,
        outcome=_outcome(failing),
        checks=found.checks,
        facts=ValidationFacts.model_validate(found.facts),
        problems=tuple(found.problems),
    )
    envelope = sign_envelope(REPORT_PAYLOAD_TYPE, report.canonical(), ws.key("verifier"))
    ref = ws.cas.put(json.dumps(envelope, sort_keys=True).encode())
    report = report.model_copy(
        update={"report_digest": ref.digest, "report_version": ref.version_id}
    )
    _record(ws, report, row["state"], actor=actor)
    return report
