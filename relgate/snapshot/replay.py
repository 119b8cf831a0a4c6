"""Replay a snapshot's canary from its pinned sources and judge it with a comparator.

Selection is re-run from the manifest alone over a fixed canary (ids whose SHA-256
bucket is below ``basisPoints`` of 10000).  The member-id set must equal the stored
table's canary ids under every comparator.  ``relgate.replay.exact`` then requires every
``logicalContentDigest`` to be equal.  ``relgate.replay.numeric`` compares numeric
content columns within a tolerance against a *fingerprint* (sampleId, numeric values,
digest of the other content; never text): the fingerprint is stored by an exact replay
that reproduced every signed content digest, so its values are the ones the builder
hashed; a numeric replay uses the newest such fingerprint whose canary covers its own.
A schema without numeric content columns needs no fingerprint: the digest covers all of
its content.  Every replay, passing or not, yields a signed :class:`ReplayReport` stored
content-addressed and indexed against the snapshot.
"""

from __future__ import annotations

from typing import Final, Literal

import polars as pl
import pyarrow as pa
from pydantic import Field, StrictInt, StrictStr

from relgate.catalog.snapshot_table import SnapshotReportRow, snapshot_reports
from relgate.documents.policy import BASIS_POINTS
from relgate.errors import RejectedError
from relgate.integrity.contract import Contract
from relgate.snapshot import reports
from relgate.snapshot.comparator import (
    EXACT,
    REFERENCE_CHECK,
    Comparator,
    Comparison,
    ReplayHashes,
    compare,
    content_hash,
    fingerprint,
    fingerprint_parquet,
    numeric_columns,
    read_fingerprint,
)
from relgate.snapshot.diff import canary_filter, load_manifest
from relgate.snapshot.validate import recompute
from relgate.workspace import Workspace

REPLAY_SCHEMA: Final = "relgate.snapshot.replay.v1"
#: The refusal check of a replay that did not reproduce the snapshot.
REPLAY_CHECK: Final = "replay-identical"
#: The canary rule a report names (see :func:`relgate.snapshot.diff.canary_filter`).
CANARY_RULE: Final = "sha256(canary\\0 || sampleId)[0:4] as u32be mod 10000 < basisPoints"
_KEY = ["sampleId", "logicalContentDigest"]


def _absent(value: object) -> bool:
    return value is None


class Canary(Contract):
    rule: StrictStr = CANARY_RULE
    basis_points: StrictInt


class FingerprintRef(Contract):
    """A stored fingerprint parquet: its content address and what it covers."""

    content_digest: StrictStr
    version: StrictStr
    rows: StrictInt
    canary_basis_points: StrictInt
    numeric_columns: tuple[StrictStr, ...]


class ReplayReport(Contract):
    """The signed ``relgate.snapshot.replay.v1`` report."""

    schema_name: Literal["relgate.snapshot.replay.v1"] = Field(
        default=REPLAY_SCHEMA, alias="schema"
    )
    snapshot: StrictStr
    canary: Canary
    comparator: Comparator
    expected_ids: StrictInt
    replayed_ids: StrictInt
    missing: StrictInt
    extra: StrictInt
    mismatching_ids: StrictInt
    examples: tuple[StrictStr, ...]
    numeric_columns: tuple[StrictStr, ...]
    replay_hashes: ReplayHashes
    reference: Literal["membership", "fingerprint"]
    reference_fingerprint: FingerprintRef | None = Field(default=None, exclude_if=_absent)
    stored_fingerprint: FingerprintRef | None = Field(default=None, exclude_if=_absent)
    result: Literal["REPRODUCED", "DIVERGED"]
    report_digest: StrictStr | None = Field(default=None, exclude=True)
    report_version: StrictStr | None = Field(default=None, exclude=True)

    @property
    def identical(self) -> bool:
        return self.result == "REPRODUCED"


def _arrow(frame: pl.DataFrame) -> pa.Table:
    return frame.to_arrow()


def fingerprint_reference(
    ws: Workspace, digest: str, canary_bp: int
) -> tuple[pa.Table, FingerprintRef]:
    """The newest fingerprint stored by a reproducing exact replay whose canary covers
    ``canary_bp``, read from its verified report and content address."""
    for row in reversed(snapshot_reports(ws.db, digest, "replay")):
        if row.outcome != "REPRODUCED" or row.fingerprint_digest is None:
            continue
        if (row.canary_bp or 0) < canary_bp:
            continue
        report = reports.open_report(ws, row, ReplayReport)
        ref = report.stored_fingerprint
        if ref is None or ref.content_digest != row.fingerprint_digest:
            raise RejectedError(
                "catalog row names a fingerprint its signed report does not",
                object=f"report {row.report_digest}",
                check=REFERENCE_CHECK,
                digest=row.report_digest,
            )
        data = ws.cas.get(ref.content_digest, ref.version)
        return read_fingerprint(data, subject=f"fingerprint {ref.content_digest}"), ref
    raise RejectedError(
        "no fingerprint for a numeric replay: run an exact replay with a canary at least"
        f" this large ({canary_bp} bp) first",
        object="snapshot",
        check=REFERENCE_CHECK,
        digest=digest,
    )


def _merge(ids: Comparison, values: Comparison) -> Comparison:
    """Ids judged against the membership table, values against the fingerprint."""
    examples = values.examples or (ids.examples if ids.missing or ids.extra else ())
    return ids.model_copy(update={"mismatching": values.mismatching, "examples": examples})


class _Replayed:
    """The canary of the stored table and of the recompute, with the content columns."""

    def __init__(self, ws: Workspace, digest: str, canary_bp: int) -> None:
        manifest = load_manifest(ws, digest)
        keep = canary_filter(canary_bp)
        stored = ws.membership.read(manifest.members_ref)
        self.keep = keep
        self.expected = keep(stored.select(_KEY)).sort("sampleId")
        self.replayed = recompute(ws, manifest, canary=keep, keep_content=True).sort("sampleId")
        self.records = manifest.record_schema_document
        self.numeric = numeric_columns(_arrow(self.replayed).schema, self.records.content)

    def ids_and_digests(self) -> Comparison:
        exact = Comparator.of(EXACT)
        return compare(exact, _arrow(self.expected), _arrow(self.replayed.select(_KEY)))

    def fingerprint(self) -> pa.Table:
        return fingerprint(_arrow(self.replayed), self.records)


def _store_fingerprint(ws: Workspace, run: _Replayed, canary_bp: int) -> FingerprintRef:
    table = run.fingerprint()
    ref = ws.cas.put(fingerprint_parquet(table))
    return FingerprintRef(
        content_digest=ref.digest,
        version=ref.version_id,
        rows=table.num_rows,
        canary_basis_points=canary_bp,
        numeric_columns=run.numeric,
    )


def replay(
    ws: Workspace,
    digest: str,
    *,
    canary_bp: int = BASIS_POINTS,
    comparator: Comparator | None = None,
    actor: str = "relgate",
) -> ReplayReport:
    """Replay the canary, compare, sign, store and index the report (passing or not)."""
    comparator = comparator or Comparator.of(EXACT)
    run = _Replayed(ws, digest, canary_bp)
    comparison = run.ids_and_digests()
    reference_ref = stored_ref = None
    if comparator.numeric and run.numeric:
        table, reference_ref = fingerprint_reference(ws, digest, canary_bp)
        reference = _arrow(run.keep(pl.DataFrame(table)))
        comparison = _merge(comparison, compare(comparator, reference, run.fingerprint()))
    elif comparison.identical and run.numeric:
        stored_ref = _store_fingerprint(ws, run, canary_bp)
    report = ReplayReport(
        snapshot=digest,
        canary=Canary(basis_points=canary_bp),
        comparator=comparator,
        expected_ids=comparison.expected_ids,
        replayed_ids=comparison.replayed_ids,
        missing=comparison.missing,
        extra=comparison.extra,
        mismatching_ids=comparison.mismatching,
        examples=comparison.examples,
        numeric_columns=run.numeric,
        replay_hashes=ReplayHashes(
            expected=content_hash(run.expected["logicalContentDigest"].to_list()),
            replayed=content_hash(run.replayed["logicalContentDigest"].to_list()),
        ),
        reference="fingerprint" if reference_ref else "membership",
        reference_fingerprint=reference_ref,
        stored_fingerprint=stored_ref,
        result="REPRODUCED" if comparison.identical else "DIVERGED",
    )
    return _store(ws, report, actor=actor)


def _store(ws: Workspace, report: ReplayReport, *, actor: str) -> ReplayReport:
    ref = reports.store_report(ws, "replay", report)
    fp = report.stored_fingerprint
    reports.record(
        ws,
        SnapshotReportRow(
            snapshot=report.snapshot,
            kind="replay",
            outcome=report.result,
            report_digest=ref.digest,
            report_version=ref.version_id,
            comparator=f"{report.comparator.name}@{report.comparator.version}",
            canary_bp=report.canary.basis_points,
            fingerprint_digest=fp.content_digest if fp else None,
            fingerprint_version=fp.version if fp else None,
            actor=actor,
        ),
        ok=report.identical,
    )
    return report.model_copy(update={"report_digest": ref.digest, "report_version": ref.version_id})


def newest_replay(ws: Workspace, digest: str) -> ReplayReport:
    """The newest replay report of a snapshot, opened and verified."""
    rows = snapshot_reports(ws.db, digest, "replay")
    if not rows:
        raise RejectedError(
            "snapshot has no replay report",
            object="snapshot",
            check=reports.REPORT_CHECK,
            digest=digest,
        )
    return open_row(ws, rows[-1])


def open_row(ws: Workspace, row: SnapshotReportRow) -> ReplayReport:
    report = reports.open_report(ws, row, ReplayReport)
    return report.model_copy(
        update={"report_digest": row.report_digest, "report_version": row.report_version}
    )
