"""The release checks' results from a verification report: one blocking check per check the
verifier emits, and the outcome.  Written once, used by ``release_verification``'s checks
and by each root's partition of ``release_version``."""

from __future__ import annotations

from typing import Any

import dagster as dg

from assets.table_metadata import typed_table
from relgate.release.verify.checks import ZERO_CHECKS, Check
from relgate.release.verify.report import ShardFinding, VerificationReport, failing_shards
from relgate.workspace import Workspace

#: One blocking asset check per check the verifier emits (the same enum): each count must be
#: zero.  A further blocking check requires the outcome VERIFIED, so a verdict reached by a
#: fatal error (a bad signature, a malformed root), which no count names, blocks as well.
VERIFICATION_CHECKS: tuple[Check, ...] = ZERO_CHECKS
OUTCOME_CHECK = "outcome_verified"
#: Every check name a verification report yields, in order.
VERIFICATION_CHECK_NAMES: tuple[str, ...] = (
    *(check.asset_check_name for check in VERIFICATION_CHECKS),
    OUTCOME_CHECK,
)


def verification_results(ws: Workspace, report: VerificationReport) -> list[dg.AssetCheckResult]:
    """Each check's result: its count, the failing shards (object key, expected and actual
    digests) and the signed report's digest; the outcome last."""
    findings = failing_shards(ws, report) if not report.ok else []
    signed = {"root": report.root, "reportDigest": report.report_digest or ""}
    results = []
    for check in VERIFICATION_CHECKS:
        # A count the report lacks is a report this code does not understand: it fails.
        value = report.counts.get(check.value)
        mine = [f for f in findings if f.check is check]
        results.append(
            dg.AssetCheckResult(
                check_name=check.asset_check_name,
                passed=value == 0,
                description=None if value == 0 else _why(check, value, mine),
                metadata={"count": -1 if value is None else int(value), **signed, **_shown(mine)},
                severity=dg.AssetCheckSeverity.ERROR,
            )
        )
    results.append(
        dg.AssetCheckResult(
            check_name=OUTCOME_CHECK,
            passed=report.ok,
            description=None if report.ok else _outcome_why(report),
            metadata={"outcome": report.outcome.value, **signed, "failing": dict(report.failing)},
            severity=dg.AssetCheckSeverity.ERROR,
        )
    )
    return results


def _why(check: Check, count: int | None, findings: list[ShardFinding]) -> str:
    """The failing check in one sentence, naming its first shard."""
    if count is None:
        return f"the report has no {check.value} count: this code does not understand it"
    said = f"{check.value}: {count} found by the independent verifier"
    if findings:
        first = findings[0]
        said += f"; first: shard {first.shard} ({first.object_key}): {first.message}"
    return said


def _outcome_why(report: VerificationReport) -> str:
    failing = ", ".join(f"{k} {v}" for k, v in sorted(report.failing.items()))
    return f"the signed report {report.report_digest} says {report.outcome.value}: {failing}"


def _shown(findings: list[ShardFinding]) -> dict[str, Any]:
    """Each failing shard of one check (object key, version, expected and actual), and the
    first one's values as plain fields (searchable, comparable)."""
    if not findings:
        return {}
    first = findings[0]
    rows = [
        {
            "shard": f.shard,
            "objectKey": f.object_key or "",
            "objectVersion": f.object_version,
            "expected": str(f.expected),
            "actual": str(f.actual),
            "message": f.message,
        }
        for f in findings
    ]
    return {
        "failingShards": typed_table(rows),
        "shard": first.shard,
        "objectKey": first.object_key or "",
        "objectVersion": first.object_version,
        "expected": str(first.expected),
        "actual": str(first.actual),
    }
