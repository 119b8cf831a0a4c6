"""The ``relgate.release.verification.v1`` report: what one verification attempt found.

:class:`VerificationPayload` is the signed document (its JSON is the DSSE payload, stored
content-addressed and bound to the root digest); :class:`VerificationReport` adds where it
was stored, the provenance statement and the release state after the attempt.
"""

from __future__ import annotations

import json

from pydantic import Field
from pydantic import JsonValue as WireValue

from relgate.catalog.audit import latest_report
from relgate.catalog.release_table import get_release
from relgate.documents import release_root as rm
from relgate.documents.shard_descriptor import ShardDescriptor
from relgate.errors import RejectedError, RelgateError
from relgate.integrity.contract import Contract, JsonObject
from relgate.integrity.signing import SigningKey, sign_envelope, verify_envelope
from relgate.objects.cas import ContentRef
from relgate.release.verify import attest
from relgate.release.verify.checks import Check, Outcome
from relgate.workspace import Workspace

REPORT_SCHEMA = "relgate.release.verification.v1"
REPORT_PAYLOAD_TYPE = "application/vnd.relgate.release-verification.v1+json"

#: A JSON object inside a model (pydantic's recursive JSON type, validated as JSON).
WireObject = dict[str, WireValue]


class VerificationPayload(Contract):
    """The signed report.  ``counts`` maps every :class:`~relgate.release.verify.checks.Check`
    (and any ``fatal:``/``unavailable:`` finding) to its count."""

    schema_name: str = Field(default=REPORT_SCHEMA, alias="schema")
    root: str
    outcome: Outcome
    counts: dict[str, int]
    shards: list[WireObject]
    facts: WireObject
    problems: list[str]
    unavailable: list[str]

    @property
    def ok(self) -> bool:
        return self.outcome == Outcome.VERIFIED

    @property
    def failing(self) -> dict[str, int]:
        return {k: v for k, v in self.counts.items() if v}


#: What the signed root says a shard should be, per check: the descriptor field each
#: per-shard check compares the stored shard against.
EXPECTED_FIELD: dict[Check, str] = {
    Check.SIZE_MISMATCH: "size",
    Check.STORAGE_DIGEST_MISMATCH: "storage_digest",
    Check.LOGICAL_DIGEST_MISMATCH: "logical_digest",
    Check.MEMBER_SET_DIGEST_MISMATCH: "member_set_digest",
    Check.RECORD_COUNT_MISMATCH: "records",
    Check.TOKEN_COUNT_MISMATCH: "tokens",
}


class ShardFinding(Contract):
    """One failed per-shard check of a report: the shard, the check, and the value the
    signed root expected next to the one the verifier found (when the check has one)."""

    shard: str
    object_version: str
    check: Check
    message: str
    expected: WireValue = None
    actual: WireValue = None
    #: where the signed root says the shard's bytes are (None: the root did not open)
    object_key: str | None = None

    def line(self) -> str:
        """The finding on one line (the command line's listing)."""
        text = f"shard {self.shard}@{self.object_version}: {self.check.value}: {self.message}"
        if self.expected is not None or self.actual is not None:
            text += f" (expected {self.expected}, actual {self.actual})"
        return text


class VerificationReport(VerificationPayload):
    """The payload, where its envelope is stored, the provenance and the resulting state."""

    report_digest: str | None = None
    report_version: str | None = None
    provenance_digest: str | None = None
    provenance_version: str | None = None
    state: str | None = None

    def payload(self) -> VerificationPayload:
        fields = set(VerificationPayload.model_fields)
        return VerificationPayload.model_validate(self.model_dump(include=fields))

    def shard_findings(self, descriptors: tuple[ShardDescriptor, ...] = ()) -> list[ShardFinding]:
        """Every failed per-shard check, in shard order; ``expected`` from the root's
        ``descriptors`` (the signed values), ``actual`` from what the verifier found."""
        by_id = {d.id: d for d in descriptors}
        found = []
        for shard in self.shards:
            failures = shard.get("failures")
            for failure in failures if isinstance(failures, list) else ():
                if not isinstance(failure, dict):
                    continue
                try:
                    check = Check(str(failure.get("check")))
                except ValueError:
                    continue  # not a per-shard check name: counted in ``counts`` only
                descriptor = by_id.get(str(shard.get("id")))
                field = EXPECTED_FIELD.get(check)
                expected = getattr(descriptor, field) if descriptor and field else None
                found.append(
                    ShardFinding(
                        shard=str(shard.get("id")),
                        object_version=str(shard.get("objectVersion")),
                        check=check,
                        message=str(failure.get("message", "")),
                        expected=expected,
                        actual=failure.get("actual"),
                        object_key=descriptor.object_key if descriptor else None,
                    )
                )
        return found

    def summary(self) -> JsonObject:
        """What the CLI and Dagster layers print/attach as metadata."""
        return {
            "root": self.root,
            "outcome": self.outcome.value,
            "state": self.state,
            "reportDigest": self.report_digest,
            "provenanceDigest": self.provenance_digest,
            "failing": dict(self.failing),
            "unavailable": list(self.unavailable),
            "shards": len(self.shards),
            "shardsVerified": sum(1 for s in self.shards if s["ok"]),
            "records": self.facts.get("records", 0),
            "bytes": self.facts.get("bytes", 0),
        }


def failing_shards(ws: Workspace, report: VerificationReport) -> list[ShardFinding]:
    """The report's failed per-shard checks, each with what the signed root expected (its
    shard descriptors); without expected values when the root itself cannot be opened
    (the report's own ``fatal:`` finding says why)."""
    if all(shard.get("ok") for shard in report.shards):
        return []
    try:
        version = str(get_release(ws.db, report.root).envelope_version)
        descriptors = rm.load(ws.store, ws.trusted_keys, report.root, version).descriptors
    except RelgateError:
        descriptors = ()
    return report.shard_findings(descriptors)


def store_report(ws: Workspace, report: VerificationReport, key: SigningKey) -> ContentRef:
    """Sign the payload and store its envelope content-addressed."""
    envelope = sign_envelope(REPORT_PAYLOAD_TYPE, report.payload().canonical(), key)
    return ws.cas.put(json.dumps(envelope, sort_keys=True).encode())


def store_provenance(
    ws: Workspace, root: JsonObject, report: VerificationReport, key: SigningKey
) -> ContentRef:
    """The signed in-toto/SLSA statement (:mod:`relgate.release.verify.attest`) that this verifier
    passed this root: subjects the root and every shard by digest."""
    assert report.report_digest is not None  # noqa: S101 - stored before the provenance
    data = attest.signed_statement(report.root, root, report_digest=report.report_digest, key=key)
    return ws.cas.put(data)


def stored_report(ws: Workspace, root: str) -> VerificationReport | None:
    """The newest verification report the catalog records for ``root``, opened from the
    store with its signature checked, or None when there is none.  The catalog row is not
    trusted: a signed report about another root is refused (check ``report-subject``)."""
    record = latest_report(ws.db, root, "release")
    if record is None:
        return None
    payload = load_report(ws, record.report_digest, record.report_version)
    if payload.root != root:
        raise RejectedError(
            f"the catalog's report for {root} is signed for {payload.root}",
            object="report",
            check="report-subject",
            digest=record.report_digest,
        )
    return VerificationReport.model_validate(
        {
            **payload.model_dump(),
            "report_digest": record.report_digest,
            "report_version": record.report_version,
            "state": get_release(ws.db, root).state,
        }
    )


def load_report(ws: Workspace, digest: str, version_id: str) -> VerificationPayload:
    """Open a stored verification report: the signature checked against trusted keys, the
    payload read into its model (a signed payload that does not fit: check ``schema``)."""
    payload = verify_envelope(
        ws.cas.get(digest, version_id),
        ws.trusted_keys,
        payload_type=REPORT_PAYLOAD_TYPE,
        subject=f"report {digest}",
    )
    return VerificationPayload.parse(json.loads(payload), what=f"report {digest}")
