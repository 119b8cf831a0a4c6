"""A snapshot validation report as Dagster metadata: numbers that plot, tables where
tabular.  Used by ``dataset_snapshot``'s check, the nightly build and each digest's
partition of ``snapshot_version``."""

from __future__ import annotations

from typing import Any

import dagster as dg

from assets.table_metadata import typed_table
from relgate.snapshot.coverage import PPM
from relgate.snapshot.validate import ValidationReport


def validation_metadata(report: ValidationReport) -> dict[str, Any]:
    """The validation report as Dagster metadata: numbers that plot, tables where tabular."""
    meta: dict[str, Any] = {
        "outcome": report.outcome,
        "report": report.report_digest or "",
        "checks": typed_table([{"check": k, "count": v} for k, v in report.checks.items()]),
        "problems": dg.MetadataValue.json(list(report.problems)),
        "orphanIds": report.checks.get("orphanIds", 0),
        "unexplainedRows": report.checks.get("unexplainedRows", 0),
        "coverage": typed_table([c.to_json() for c in report.coverage]),
        "uncoveredSources": sum(1 for c in report.coverage if not c.covered),
        "unversionedObjects": sum(c.unversioned_objects or 0 for c in report.coverage),
        "eventsAfterPin": sum(c.events_after_pin or 0 for c in report.coverage),
        "rowAccounting": typed_table([r.to_json() for r in report.row_accounting]),
    }
    if report.lineage is not None:
        meta["lineageCompleteness"] = dg.MetadataValue.float(report.lineage.completeness_ppm / PPM)
        meta["untracedMembers"] = report.lineage.untraced
    diffs = report.set_differences
    if diffs is not None:
        meta |= {
            "missingMembers": diffs.missing,
            "extraMembers": diffs.extra,
            "contentSubstitutions": diffs.content_substitutions,
            "splitConflicts": diffs.split_conflicts,
            "setDifferenceExamples": dg.MetadataValue.json(diffs.examples.to_json()),
        }
    if report.replay_hashes is not None:
        meta["replayHashExpected"] = report.replay_hashes.expected
        meta["replayHashReplayed"] = report.replay_hashes.replayed
    if report.build_latency is not None:
        meta["buildLatencySeconds"] = report.build_latency.seconds
    if report.tombstones is not None:
        meta["tombstoneMatches"] = report.tombstones.matches_in_members
        meta["tombstonesExcluded"] = report.tombstones.excluded_at_selection
    return meta
