"""Validate a snapshot by recomputing everything from its pinned sources.

Nothing the builder computed is trusted: the envelope's signature and digest are checked,
the membership table is re-read from its content address, selection is re-run from the
pinned source versions, and the two multisets are diffed in full.  The report counts each
check; the snapshot moves to VALIDATED only when every count that must be zero is zero.
A late CDC event sends it to INCOMPLETE instead of REJECTED.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

import polars as pl

from relgate.catalog.audit import record_report
from relgate.catalog.snapshot_table import get_snapshot
from relgate.catalog.states import transition
from relgate.errors import IntegrityError, RejectedError, RelgateError
from relgate.gate.core import Fences, fenced_entries
from relgate.integrity.canonical import canonical_bytes
from relgate.integrity.signing import sign_envelope
from relgate.snapshot import manifest as mf
from relgate.snapshot.membership import tuple_root
from relgate.snapshot.policy import SelectionPolicy, SplitPolicy, TransformRef
from relgate.snapshot.selection import Fenced, select_members
from relgate.sources.source import source_from_config
from relgate.workspace import Workspace

REPORT_SCHEMA = "relgate.snapshot.validation.v1"
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


@dataclass
class ValidationReport:
    snapshot: str
    outcome: str  # VALIDATED | REJECTED | INCOMPLETE
    checks: dict[str, int]
    facts: dict[str, Any]
    problems: list[str]
    report_digest: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome == "VALIDATED"

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": REPORT_SCHEMA,
            "snapshot": self.snapshot,
            "outcome": self.outcome,
            "checks": self.checks,
            "facts": self.facts,
            "problems": self.problems,
        }


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


def recompute(
    ws: Workspace, manifest: mf.SnapshotManifest, canary: Any = None, *, keep_content: bool = False
) -> pl.DataFrame:
    """Selection re-run from the manifest alone (pins, policies, transform digest, fences)."""
    body = manifest.body
    configs = {c["id"]: c for c in ws.config.get("sources", [])}
    sources = {}
    for entry in body["sources"]:
        if entry["id"] not in configs:
            raise RejectedError(
                "manifest names a source this workspace does not know",
                object=entry["id"],
                check="source-known",
                digest=manifest.digest,
            )
        sources[entry["id"]] = source_from_config(configs[entry["id"]], ws.cas)
    transform = TransformRef.parse(body["transformImage"]).resolve()
    selection = SelectionPolicy.from_json(body["policies"]["selection"])
    split = SplitPolicy.from_json(body["policies"]["split"])
    if selection.digest != body["selectionPolicy"] or split.digest != body["splitPolicy"]:
        raise IntegrityError(
            "embedded policy text does not match its digest",
            object="policies",
            check="policy-digest",
            digest=manifest.digest,
        )
    with ws.db.tx() as conn:
        tombs, bench = fenced_entries(
            conn, Fences(int(body["tombstoneWatermark"]), int(body["benchmarkFence"]))
        )
    result = select_members(
        sources,
        body["sources"],
        transform=transform,
        selection=selection,
        split=split,
        fenced=Fenced(frozenset(tombs), frozenset(bench)),
        canary=canary,
        keep_content=keep_content,
    )
    return result.members


def validate_snapshot(ws: Workspace, digest: str, *, actor: str) -> ValidationReport:
    row = get_snapshot(ws.db, digest)
    checks: dict[str, int] = dict.fromkeys(ZERO_CHECKS, 0)
    facts: dict[str, Any] = {}
    problems: list[str] = []
    try:
        manifest = mf.load(ws.store, ws.trusted_keys, digest, row["envelope_version"])
        body = manifest.body
        stored = ws.membership.read(manifest.members_ref)
        facts["members"] = stored.height
        facts["manifestMembers"] = manifest.member_count
        split_names = {n for n, _ in SplitPolicy.from_json(body["policies"]["split"]).buckets}
        source_ids = {e["id"] for e in body["sources"]}
        per_id_splits = stored.group_by("sampleId").agg(pl.col("split").n_unique().alias("n"))
        checks["idsInSeveralSplits"] = per_id_splits.filter(pl.col("n") > 1).height
        checks["unknownSplits"] = stored.filter(~pl.col("split").is_in(list(split_names))).height
        checks["unknownOrigins"] = stored.filter(~pl.col("sourceId").is_in(list(source_ids))).height
        with ws.db.tx() as conn:
            tombs, bench = fenced_entries(
                conn, Fences(int(body["tombstoneWatermark"]), int(body["benchmarkFence"]))
            )
        checks["tombstoneHits"] = stored.filter(pl.col("sampleId").is_in(list(tombs))).height
        checks["benchmarkHits"] = stored.filter(
            pl.col("logicalContentDigest").is_in(list(bench))
        ).height
        configs = {c["id"]: c for c in ws.config.get("sources", [])}
        for entry in body["sources"]:
            if entry["id"] not in configs:
                problems.append(f"source {entry['id']} is not configured here")
                checks["unreadableSources"] += 1
                continue
            source = source_from_config(configs[entry["id"]], ws.cas)
            unreadable = source.check_readable(entry)
            problems.extend(unreadable)
            checks["unreadableSources"] += len(unreadable)
            checks["lateEvents"] += source.late_events(entry)
        if checks["unreadableSources"] == 0:
            expected = recompute(ws, manifest)
            checks.update(multiset_diff(stored, expected))
        else:
            checks["duplicateIds"] = stored.height - stored["sampleId"].n_unique()
        root = tuple_root(stored, body["recordSchema"])
        facts["tupleRoot"] = root
        checks["tupleRootMismatch"] = int(root != manifest.tuple_root)
        checks["memberCountMismatch"] = int(stored.height != manifest.member_count)
        split_counts = {
            r["split"]: r["len"] for r in stored.group_by("split").len().iter_rows(named=True)
        }
        checks["splitCountMismatch"] = int(split_counts != body["splits"])
        facts["splits"] = split_counts
    except RelgateError as exc:
        problems.append(str(exc))
        checks[f"fatal:{exc.check or exc.code}"] = 1

    failing = {k: v for k, v in checks.items() if v}
    if not failing:
        outcome = "VALIDATED"
    elif set(failing) == {"lateEvents"}:
        outcome = "INCOMPLETE"
    else:
        outcome = "REJECTED"
    report = ValidationReport(digest, outcome, checks, facts, problems)
    payload = canonical_bytes(report.to_json())
    envelope = sign_envelope(REPORT_PAYLOAD_TYPE, payload, ws.key("verifier"))
    ref = ws.cas.put(json.dumps(envelope, sort_keys=True).encode())
    report.report_digest = ref.digest
    with ws.db.tx() as conn:
        record_report(conn, "snapshot", digest, ref.digest, ref.version_id, report.ok)
        state = row["state"]
        if state == "BUILDING" and report.ok:
            transition(
                conn, "snapshot", digest, "VALIDATED", actor=actor, reason=f"report {ref.digest}"
            )
        elif state in ("BUILDING", "VALIDATED", "APPROVED") and not report.ok:
            transition(
                conn,
                "snapshot",
                digest,
                outcome,
                actor=actor,
                reason=f"report {ref.digest}: {sorted(failing)}",
            )
    return report
