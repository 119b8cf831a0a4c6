"""Signed approvals: an approval of an exact digest, signed with the workspace's approver key.

:func:`sign_approval` wraps the result of :func:`relgate.catalog.audit.approve`: it signs a
``relgate.approval.v1`` statement (subject kind, subject digest, approver, the passing
report it relied on, time) as a DSSE envelope with the **approver** role key, stores it
content-addressed and records it in ``reports`` as ``<kind>-approval`` (so GC keeps it
with its subject).  :func:`verify_approval` opens the newest one for a digest: trusted
approver signature (``key-role`` for any other role), strict canonical payload, and bound
to that subject (``approval-subject``).
"""

from __future__ import annotations

import json
from typing import Any, Final, Literal, Protocol

from pydantic import Field

from relgate.catalog.audit import Approved, approve, latest_report, newest_report, record_report
from relgate.catalog.db import Database, one, utcnow
from relgate.catalog.states import APPROVED_STATES, current_state
from relgate.errors import IntegrityError, RejectedError
from relgate.integrity.contract import Contract
from relgate.integrity.signing import Role, SigningKey, TrustedKeys, open_verified, sign_envelope
from relgate.objects.cas import ContentStore

SCHEMA: Final = "relgate.approval.v1"
PAYLOAD_TYPE = "application/vnd.relgate.approval.v1+json"


class Approval(Contract):
    """The signed ``relgate.approval.v1`` statement (its canonical bytes are the payload)."""

    statement_schema: Literal["relgate.approval.v1"] = Field(
        SCHEMA, validation_alias="schema", serialization_alias="schema"
    )
    subject_kind: str
    subject: str
    approver: str
    report: str
    at: str

    def __init__(
        self, subject_kind: str, subject: str, approver: str, report: str, at: str
    ) -> None:
        fields: dict[str, Any] = {
            "subject_kind": subject_kind,
            "subject": subject,
            "approver": approver,
            "report": report,
            "at": at,
        }
        super().__init__(**fields)


class ApprovalSigner(Protocol):
    """What signing an approval needs from a workspace: the catalog, the CAS, the keys."""

    @property
    def db(self) -> Database: ...

    @property
    def cas(self) -> ContentStore: ...

    def key(self, role: Role | str) -> SigningKey: ...


class ApprovalVerifier(Protocol):
    """What verifying an approval needs from a workspace."""

    @property
    def db(self) -> Database: ...

    @property
    def cas(self) -> ContentStore: ...

    @property
    def trusted_keys(self) -> TrustedKeys: ...


def sign_approval(ws: ApprovalSigner, result: Approved) -> Approved:
    """Sign the approval ``audit.approve`` just recorded; ``result`` with its ``approval``."""
    kind = result.kind
    approval = Approval(kind, result.digest, result.approver, result.report, utcnow())
    envelope = sign_envelope(PAYLOAD_TYPE, approval.canonical(), ws.key(Role.APPROVER))
    ref = ws.cas.put(json.dumps(envelope, sort_keys=True).encode())
    with ws.db.tx() as conn:
        record_report(conn, approval_kind(kind), approval.subject, ref.digest, ref.version_id, True)
    return result.model_copy(update={"approval": ref.digest})


def approve_signed(
    ws: ApprovalSigner, kind: str, digest: str, *, approver: str, comment: str = ""
) -> Approved:
    """Approve ``digest`` and sign the approval; an already approved (or active, or
    published) digest with a signed approval is not approved again: its existing approval
    is returned with ``existing: "true"``."""
    found = existing_approval(ws.db, kind, digest)
    if found is not None:
        return found
    result = approve(ws.db, kind, digest, approver=approver, comment=comment)
    return sign_approval(ws, result).model_copy(update={"existing": "false"})


def existing_approval(db: Database, kind: str, digest: str) -> Approved | None:
    """The recorded, signed approval of a digest in an approved state; None otherwise."""
    with db.tx() as conn:
        state = current_state(conn, kind, digest)
        if state not in APPROVED_STATES[kind]:
            return None
        signed = newest_report(conn, digest, approval_kind(kind))
        passed = newest_report(conn, digest, kind)
        named = one(
            conn,
            "SELECT approver FROM approvals WHERE subject_kind = :k AND digest = :d"
            " ORDER BY id DESC LIMIT 1",
            {"k": kind, "d": digest},
        )
    if signed is None or passed is None or named is None:
        return None
    return Approved(
        kind=kind,
        digest=digest,
        state=state,
        approver=str(named["approver"]),
        report=passed.report_digest,
        approval=signed.report_digest,
        existing="true",
    )


def approval_kind(kind: str) -> str:
    """The ``reports.subject_kind`` under which signed approvals of ``kind`` are recorded."""
    return f"{kind}-approval"


def missing_approval(kind: str, digest: str) -> RejectedError:
    return RejectedError(
        "no signed approval for this digest", object=kind, check="approval", digest=digest
    )


def verify_approval(ws: ApprovalVerifier, kind: str, digest: str) -> Approval:
    """The newest signed approval of ``digest``, verified; exit 3 if missing or not trusted."""
    row = latest_report(ws.db, digest, approval_kind(kind))
    if row is None:
        raise missing_approval(kind, digest)
    return open_approval(
        ws.cas.get(row.report_digest, row.report_version),
        ws.trusted_keys,
        kind,
        digest,
        subject=f"approval {row.report_digest}",
    )


def open_approval(
    envelope: bytes, trusted: TrustedKeys, kind: str, digest: str, *, subject: str
) -> Approval:
    """Open one stored approval envelope: approver signature, canonical payload, subject."""
    body: Any = open_verified(envelope, trusted, payload_type=PAYLOAD_TYPE, subject=subject).body
    if (
        not isinstance(body, dict)
        or body.get("schema") != SCHEMA
        or body.get("subjectKind") != kind
        or body.get("subject") != digest
        or not all(isinstance(body.get(f), str) for f in ("approver", "report", "at"))
    ):
        raise IntegrityError(
            "signed approval does not name this digest",
            object=kind,
            check="approval-subject",
            digest=digest,
        )
    return Approval(kind, digest, body["approver"], body["report"], body["at"])
