"""Validate a snapshot by recomputing everything from its pinned sources.

Nothing the builder computed is trusted: the envelope's signature and digest are checked,
the membership table is re-read from its content address, selection is re-run from the
pinned source versions, and the two multisets are diffed in full.  The report counts each
check; the snapshot moves to VALIDATED only when every count that must be zero is zero.
A late CDC event sends it to INCOMPLETE instead of REJECTED.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
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
from relgate.snapshot.membership import tuple_root
from relgate.snapshot.policy import TransformRef
from relgate.snapshot.selection import Fenced, select_members
from relgate.sources.factory import source_from_config
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


def recompute(
    ws: Workspace,
    manifest: mf.SnapshotManifest,
    canary: Canary | None = None,
    *,
    keep_content: bool = False,
) -> pl.DataFrame:
    """Selection re-run from the manifest alone (pins, policies, transform digest, fences)."""
    sources = pinned_sources(ws, manifest.sources, manifest.digest)
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
    result = select_members(
        sources,
        manifest.sources,
        transform=transform,
        selection=policies.selection,
        split=policies.split,
        fenced=_fenced(ws, manifest),
        canary=canary,
        keep_content=keep_content,
    )
    return result.members


class _Findings:
    """Counts, facts and problems gathered while checking one snapshot."""

    def __init__(self) -> None:
        self.checks: dict[str, int] = dict.fromkeys(ZERO_CHECKS, 0)
        self.facts: dict[str, object] = {}
        self.problems: list[str] = []


def _check_stored(ws: Workspace, manifest: mf.SnapshotManifest, found: _Findings) -> None:
    """Structure checks on the stored table, then readability, then the full recompute."""
    checks = found.checks
    stored = ws.membership.read(manifest.members_ref)
    found.facts["members"] = stored.height
    found.facts["manifestMembers"] = manifest.member_count
    split_names = [n for n, _ in manifest.policies.split.buckets]
    source_ids = [e.id for e in manifest.sources]
    per_id_splits = stored.group_by("sampleId").agg(pl.col("split").n_unique().alias("n"))
    checks["idsInSeveralSplits"] = per_id_splits.filter(pl.col("n") > 1).height
    checks["unknownSplits"] = stored.filter(~pl.col("split").is_in(split_names)).height
    checks["unknownOrigins"] = stored.filter(~pl.col("sourceId").is_in(source_ids)).height
    fenced = _fenced(ws, manifest)
    checks["tombstoneHits"] = stored.filter(
        pl.col("sampleId").is_in(list(fenced.sample_ids))
    ).height
    checks["benchmarkHits"] = stored.filter(
        pl.col("logicalContentDigest").is_in(list(fenced.content_digests))
    ).height
    configs = source_configs(ws)
    for entry in manifest.sources:
        if entry.id not in configs:
            found.problems.append(f"source {entry.id} is not configured here")
            checks["unreadableSources"] += 1
            continue
        source = source_from_config(configs[entry.id], ws.cas)
        unreadable = source.check_readable(entry)
        found.problems.extend(unreadable)
        checks["unreadableSources"] += len(unreadable)
        checks["lateEvents"] += source.late_events(entry)
    if checks["unreadableSources"] == 0:
        checks.update(multiset_diff(stored, recompute(ws, manifest)))
    else:
        checks["duplicateIds"] = stored.height - stored["sampleId"].n_unique()
    root = tuple_root(stored, manifest.record_schema)
    found.facts["tupleRoot"] = root
    checks["tupleRootMismatch"] = int(root != manifest.tuple_root)
    checks["memberCountMismatch"] = int(stored.height != manifest.member_count)
    split_counts = {
        r["split"]: r["len"] for r in stored.group_by("split").len().iter_rows(named=True)
    }
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
