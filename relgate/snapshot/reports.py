"""Signed snapshot reports (validation and replay): sign, store, index, open.

A report is a :class:`~relgate.integrity.contract.Contract` whose canonical JSON is the
payload of a DSSE envelope signed with the workspace's verifier key; the envelope is
stored content-addressed (:func:`relgate.objects.layout.report_key`) and indexed in the
catalog's ``snapshot_reports`` table against its snapshot.  Opening one re-reads the
exact stored version, checks its content address, the signature against the trusted
keys and the payload's schema; any failure is a refusal (exit 3) naming the report.
"""

from __future__ import annotations

import json
from typing import Final, TypeVar

from relgate.catalog.snapshot_table import SnapshotReportRow, record_snapshot_report
from relgate.errors import RejectedError
from relgate.integrity.contract import Contract
from relgate.integrity.signing import open_verified, sign_envelope
from relgate.objects.cas import ContentRef
from relgate.workspace import Workspace

VALIDATION_PAYLOAD_TYPE: Final = "application/vnd.relgate.validation-report.v1+json"
REPLAY_PAYLOAD_TYPE: Final = "application/vnd.relgate.replay-report.v1+json"
#: Report kind (a ``snapshot_reports.kind``) -> its DSSE payload type.
PAYLOAD_TYPES: Final = {"validation": VALIDATION_PAYLOAD_TYPE, "replay": REPLAY_PAYLOAD_TYPE}
#: The refusal check of a stored report that does not open.
REPORT_CHECK: Final = "snapshot-report"

_Doc = TypeVar("_Doc", bound=Contract)


def store_report(ws: Workspace, kind: str, document: Contract) -> ContentRef:
    """Sign ``document`` with the verifier key and store its envelope content-addressed."""
    envelope = sign_envelope(PAYLOAD_TYPES[kind], document.canonical(), ws.key("verifier"))
    return ws.cas.put(json.dumps(envelope, sort_keys=True).encode())


def record(ws: Workspace, row: SnapshotReportRow, *, ok: bool) -> None:
    """Index a stored report in its own transaction."""
    with ws.db.tx() as conn:
        record_snapshot_report(conn, row, ok=ok)


def open_report(ws: Workspace, row: SnapshotReportRow, model: type[_Doc]) -> _Doc:
    """The verified report a catalog row names, as ``model``."""
    subject = f"report {row.report_digest}"
    data = ws.cas.get(row.report_digest, row.report_version)  # content address checked
    verified = open_verified(
        data, ws.trusted_keys, payload_type=PAYLOAD_TYPES[row.kind], subject=subject
    )
    document = model.parse(verified.body, what=subject)
    snapshot = getattr(document, "snapshot", None)
    if snapshot != row.snapshot:
        raise RejectedError(
            "report is about another snapshot",
            object=subject,
            check=REPORT_CHECK,
            digest=row.report_digest,
            details={"expected": row.snapshot, "found": snapshot},
        )
    return document
