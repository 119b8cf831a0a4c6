"""Stored-envelope re-verification: the gate re-opens what a catalog row vouches for.

Before an alias moves or a root is admitted, the stored envelope the row names is opened
again (trusted signature, recomputed digest, the exact stored version) and every payload
field the row repeats is compared; an APPROVED state needs a signed approval by a trusted
approver key naming that digest.  A gate without a verifier moves nothing.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Any, Protocol

from sqlalchemy import Connection

from relgate.catalog.audit import ReportRecord, newest_reports
from relgate.catalog.versions import VersionRecord, read_version
from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.errors import IntegrityError, RelgateError
from relgate.gate.approvals import approval_kind, missing_approval, open_approval
from relgate.integrity.signing import TrustedKeys
from relgate.objects.cas import ContentStore
from relgate.objects.layout import envelope_key
from relgate.objects.versioned import ObjectStore


class EnvelopeVerifier(Protocol):
    """Re-opens the stored envelope of a catalog row; raises unless it binds to the row."""

    def verify(self, kind: str, row: VersionRecord) -> None: ...

    def verify_approval(self, conn: Connection, kind: str, digest: str) -> None: ...

    def verify_approvals(self, conn: Connection, subjects: Sequence[tuple[str, str]]) -> None: ...


#: Each kind's projection of a signed document onto its catalog row, read from the
#: document as signed (a missing or mistyped field raises, and is a binding refusal).
_BOUND_FIELDS = {"snapshot": sm.bound_fields, "release": rm.bound_fields}


#: Verified envelope bodies by (trusted keys, kind, digest, version, SHA-256 of the exact
#: stored bytes), and opened approvals by (trusted keys, "approval", kind, digest, the
#: approval's content address, which ContentStore.get checks on every read).  Opening an envelope is a pure function of its bytes and the trusted
#: keys, so a hit is the same answer a fresh verification would give; different bytes
#: (a tampered or replaced object) miss and are verified in full.  Bounded.
_VERIFIED: dict[tuple[object, ...], tuple[TrustedKeys, Any]] = {}
_VERIFIED_MAX = 4096


def _stored_body(store: ObjectStore, trusted: TrustedKeys, kind: str, row: VersionRecord) -> Any:
    digest, version = row.digest, row.envelope_version
    key = envelope_key(kind, digest)
    data = store.get(key, version)
    memo = (id(trusted), kind, digest, version, hashlib.sha256(data).digest())
    hit = _VERIFIED.get(memo)
    if hit is not None and hit[0] is trusted:
        return hit[1]
    if kind == "snapshot":
        opened = sm.KIND.open(data, trusted, expected=digest, subject=key)
        body: Any = sm.from_payload(opened, subject=key).body
    else:
        body = rm.open_document(data, trusted, expected=digest, subject=key)
        rm.ReleaseManifest.from_document(body, subject=key)  # the model, as for a snapshot
    _remember(memo, trusted, body)
    return body


def _remember(memo: tuple[object, ...], trusted: TrustedKeys, opened: Any) -> None:
    if len(_VERIFIED) >= _VERIFIED_MAX:
        _VERIFIED.clear()
    _VERIFIED[memo] = (trusted, opened)


class StoredEnvelopes:
    """The gate's :class:`EnvelopeVerifier`: trusted signature, recomputed digest, the exact
    stored version the row names, and every payload field the row repeats."""

    def __init__(self, store: ObjectStore, trusted: TrustedKeys) -> None:
        self.store = store
        self.trusted = trusted

    def verify(self, kind: str, row: VersionRecord) -> None:
        digest = row.digest
        where = f"{envelope_key(kind, digest)}@{row.envelope_version}"
        try:
            bound = _BOUND_FIELDS[kind](_stored_body(self.store, self.trusted, kind, row))
        except RelgateError as exc:
            raise IntegrityError(
                f"stored {kind} envelope refused: {exc.message}",
                object=where,
                check=exc.check or "stored-envelope",
                digest=digest,
                details={"cause": exc.code},
            ) from None
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise IntegrityError(
                f"stored {kind} envelope lacks a field its catalog row repeats",
                object=where,
                check="envelope-binding",
                digest=digest,
                details={"cause": type(exc).__name__},
            ) from None
        stored = row.model_dump()
        differs = sorted(f for f, v in bound.items() if stored.get(f) != v)
        if differs:
            raise IntegrityError(
                f"stored {kind} envelope does not bind to its catalog row",
                object=where,
                check="envelope-binding",
                digest=digest,
                details={"fields": differs},
            )

    def verify_approval(self, conn: Connection, kind: str, digest: str) -> None:
        """The newest signed approval of ``digest``: an approver-role signature naming it.

        An APPROVED state in the catalog is not enough: a row edited to APPROVED, or an
        approval signed by any key but a trusted approver key, moves nothing."""
        self.verify_approvals(conn, [(kind, digest)])

    def verify_approvals(self, conn: Connection, subjects: Sequence[tuple[str, str]]) -> None:
        """:meth:`verify_approval` of each (kind, digest), their rows read in one statement."""
        wanted = [(digest, approval_kind(kind)) for kind, digest in subjects]
        for (kind, digest), row in zip(subjects, newest_reports(conn, wanted), strict=True):
            if row is None:
                raise missing_approval(kind, digest)
            self._open_approval(kind, digest, row)

    def _open_approval(self, kind: str, digest: str, row: ReportRecord) -> None:
        """Read and hash the approval (every time), then open it unless these exact
        content-addressed bytes were opened for this subject under these keys before."""
        where = f"approval {row.report_digest}@{row.report_version}"
        try:
            envelope = ContentStore(self.store).get(row.report_digest, row.report_version)
            memo = (id(self.trusted), "approval", kind, digest, row.report_digest)
            hit = _VERIFIED.get(memo)
            if hit is None or hit[0] is not self.trusted:
                opened = open_approval(envelope, self.trusted, kind, digest, subject=where)
                _remember(memo, self.trusted, opened)
        except RelgateError as exc:
            raise IntegrityError(
                f"signed approval refused: {exc.message}",
                object=where,
                check=exc.check or "approval",
                digest=digest,
                details={"cause": exc.code},
            ) from None


def verify_envelope(
    conn: Connection, verifier: EnvelopeVerifier, kind: str, digest: str
) -> VersionRecord:
    """Re-open the stored envelope ``digest``'s row names and bind it to the row."""
    row = read_version(conn, kind, digest)
    verifier.verify(kind, row)
    return row


def verify_signed_approval(
    conn: Connection, verifier: EnvelopeVerifier, kind: str, digest: str
) -> None:
    """Re-open the signed approval that ``digest``'s APPROVED state claims."""
    verifier.verify_approval(conn, kind, digest)
