"""Proof bundles: a (non-)inclusion proof together with the signed manifest that commits to its root.

``relgate prove`` emits a bundle; ``relgate check-proof`` verifies it with only a trusted key
set, no workspace:

1. the bundle file is strictly parsed (bounded size and depth, no duplicate keys, no floats)
   and every field is type-checked (``proof-shape``);
2. the embedded DSSE envelope verifies against the trusted keys for the builder role and is
   the snapshot manifest or release root the bundle names (``signature-*``, ``key-*``,
   ``manifest-digest``, ``manifest-identity``);
3. the proof's root is the ``orderedMemberTupleRoot`` that signed document commits to
   (``proof-root-binding``) and its tree size is the committed member count
   (``proof-size-binding``);
4. the audit paths recompute that root and the leaves prove (non-)membership
   (``proof-path``).

Bundle (``relgate.proof-bundle.v1``)::

    {"schema": "relgate.proof-bundle.v1", "subjectKind": "snapshot"|"release",
     "subject": "sha256:...", "envelope": {DSSE envelope},
     "proof": {"kind": "inclusion"|"non-inclusion", "sampleId", "root", "size",
               "leaves": [{"index", "tuple": {...6 fields}, "path": [hex, ...]}]}}
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from typing import Any

from relgate_trust import dsse

from relgate.catalog.release_table import get_release
from relgate.catalog.snapshot_table import get_snapshot
from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.documents.kind import DocumentKind
from relgate.errors import IntegrityError, RejectedError, RelgateError, UsageError
from relgate.integrity.digests import require_digest
from relgate.integrity.merkle import LeafProof, check_proof
from relgate.integrity.signing import TrustedKeys, relgate_error
from relgate.integrity.tuples import FIELDS, MemberTuple
from relgate.snapshot.diff import prove

SCHEMA = "relgate.proof-bundle.v1"
MAX_BUNDLE_BYTES = 16 * 1024 * 1024
#: A SHA-256 path entry in hex.
HEX_DIGITS = 64
MAX_LEAVES = 2
MAX_PATH = 64
SUBJECT_KINDS = ("snapshot", "release")
PROOF_KINDS = ("inclusion", "non-inclusion")


def _kind(subject_kind: str) -> DocumentKind:
    return sm.KIND if subject_kind == "snapshot" else rm.KIND


def committed(subject_kind: str, body: dict[str, Any]) -> tuple[str, int]:
    """(tuple root, member count) a signed snapshot manifest or release root commits to."""
    try:
        if subject_kind == "snapshot":
            root, count = body["members"]["tupleRoot"], body["members"]["count"]
        else:
            root, count = body["orderedMemberTupleRoot"], body["totals"]["records"]
    except (KeyError, TypeError):
        root = count = None
    if not isinstance(root, str) or not isinstance(count, int) or isinstance(count, bool):
        raise RejectedError(
            f"the signed {subject_kind} does not state its tuple root and member count",
            object=subject_kind,
            check="manifest-shape",
        )
    return root, count


class _Shape(Exception):
    pass


def _field(data: Any, name: str, kind: type | tuple[type, ...]) -> Any:
    if not isinstance(data, dict) or name not in data:
        raise _Shape(f"missing {name}")
    value = data[name]
    if not isinstance(value, kind) or (isinstance(value, bool) and kind is not bool):
        raise _Shape(f"{name} has the wrong type")
    return value


def _hash(text: Any) -> bytes:
    if not isinstance(text, str) or len(text) != HEX_DIGITS:
        raise _Shape("a path entry is not 64 hex digits")
    try:
        return bytes.fromhex(text)
    except ValueError:
        raise _Shape("a path entry is not hex") from None


@dataclass(frozen=True)
class Proof:
    kind: str
    sample_id: str
    root: str
    size: int
    leaves: tuple[LeafProof, ...]

    @classmethod
    def from_json(cls, data: Any) -> Proof:
        kind = _field(data, "kind", str)
        if kind not in PROOF_KINDS:
            raise _Shape(f"proof kind {kind[:40]!r}")
        sample = _field(data, "sampleId", str)
        root = _field(data, "root", str)
        try:
            require_digest(root, what="root")
        except RelgateError:
            raise _Shape("root is not a sha256 digest") from None
        size = _field(data, "size", int)
        if size < 0:
            raise _Shape("negative size")
        raw_leaves = _field(data, "leaves", list)
        if len(raw_leaves) > MAX_LEAVES:
            raise _Shape(f"more than {MAX_LEAVES} leaves")
        leaves = []
        for leaf in raw_leaves:
            index = _field(leaf, "index", int)
            tup = _field(leaf, "tuple", dict)
            path = _field(leaf, "path", list)
            if len(path) > MAX_PATH:
                raise _Shape("audit path too long")
            values = [_field(tup, f, str) for f in FIELDS]
            if set(tup) != set(FIELDS):
                raise _Shape("tuple has unknown fields")
            leaves.append(LeafProof(index, MemberTuple(*values), [_hash(p) for p in path]))
        return cls(kind, sample, root, size, tuple(leaves))

    def to_json(self) -> dict[str, Any]:
        return {
            "kind": self.kind,
            "sampleId": self.sample_id,
            "root": self.root,
            "size": self.size,
            "leaves": [leaf.to_json() for leaf in self.leaves],
        }

    def path_valid(self) -> bool:
        return check_proof(self.to_json())


@dataclass(frozen=True)
class ProofBundle:
    subject_kind: str
    subject: str
    envelope: dict[str, Any]
    proof: Proof

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "subjectKind": self.subject_kind,
            "subject": self.subject,
            "envelope": self.envelope,
            "proof": self.proof.to_json(),
        }

    @classmethod
    def from_json(cls, data: Any, *, subject: str = "proof") -> ProofBundle:
        try:
            if _field(data, "schema", str) != SCHEMA:
                raise _Shape(f"not a {SCHEMA}")
            kind = _field(data, "subjectKind", str)
            if kind not in SUBJECT_KINDS:
                raise _Shape("subjectKind is not snapshot or release")
            digest = _field(data, "subject", str)
            require_digest(digest, what="subject")
            envelope = _field(data, "envelope", dict)
            proof = Proof.from_json(_field(data, "proof", dict))
        except _Shape as exc:
            raise RejectedError(
                f"malformed proof bundle: {exc}", object=subject, check="proof-shape"
            ) from None
        except RelgateError as exc:
            raise RejectedError(
                f"malformed proof bundle: {exc.message}", object=subject, check="proof-shape"
            ) from None
        return cls(kind, digest, envelope, proof)

    @classmethod
    def parse(cls, data: bytes, *, subject: str = "proof") -> ProofBundle:
        if len(data) > MAX_BUNDLE_BYTES:
            raise RejectedError(
                f"proof bundle larger than {MAX_BUNDLE_BYTES} bytes",
                object=subject,
                check="proof-size",
            )
        try:
            doc = dsse.parse_json(data, what="proof", subject=subject)
        except dsse.DsseError as exc:
            raise relgate_error(exc, subject) from None
        return cls.from_json(doc, subject=subject)

    def check(self, trusted: TrustedKeys, *, subject: str = "proof") -> dict[str, Any]:
        """Verify signature, root and size binding and the path; raise exit 3 otherwise."""
        body = _kind(self.subject_kind).open(
            self.envelope, trusted, expected=self.subject, subject=f"{subject} envelope"
        )
        root, size = committed(self.subject_kind, body)
        if self.proof.root != root:
            raise IntegrityError(
                "the proof's root is not the tuple root the signed manifest commits to",
                object=subject,
                check="proof-root-binding",
                digest=self.subject,
                details={"proofRoot": self.proof.root, "signedRoot": root},
            )
        if self.proof.size != size:
            raise IntegrityError(
                "the proof's tree size is not the signed member count",
                object=subject,
                check="proof-size-binding",
                digest=self.subject,
                details={"proofSize": self.proof.size, "signedSize": size},
            )
        if not self.proof.path_valid():
            raise IntegrityError(
                f"the {self.proof.kind} proof does not verify against the signed root",
                object=subject,
                check="proof-path",
                digest=self.subject,
            )
        return {
            "valid": True,
            "kind": self.proof.kind,
            "sampleId": self.proof.sample_id,
            "root": root,
            "subjectKind": self.subject_kind,
            "subject": self.subject,
        }


def read_bundle(path: str | os.PathLike[str]) -> ProofBundle:
    try:
        with open(path, "rb") as fh:
            data = fh.read(MAX_BUNDLE_BYTES + 1)
    except OSError as exc:
        raise RejectedError(
            f"cannot read proof: {exc}", object=str(path), check="proof-read"
        ) from None
    return ProofBundle.parse(data, subject=str(path))


def bundle(ws: Any, sample_id: str, *, snapshot: str | None, release: str | None) -> ProofBundle:
    """Prove ``sample_id`` against a snapshot or a release root and bundle the signed envelope."""
    if release is not None:
        envelope_raw = ws.store.get(
            rm.envelope_key(release), get_release(ws.db, release).envelope_version
        )
        body = rm.KIND.open(envelope_raw, ws.trusted_keys, expected=release, subject="release")
        kind, digest, snap = "release", release, str(body["datasetSnapshot"])
    else:
        if snapshot is None:
            raise UsageError(
                "prove against a snapshot or a release", object="proof", check="subject"
            )
        envelope_raw = ws.store.get(
            sm.envelope_key(snapshot), get_snapshot(ws.db, snapshot).envelope_version
        )
        body = sm.KIND.open(envelope_raw, ws.trusted_keys, expected=snapshot, subject="snapshot")
        kind, digest, snap = "snapshot", snapshot, snapshot
    proof = Proof.from_json(prove(ws, snap, sample_id).to_json())
    root, _ = committed(kind, body)
    if proof.root != root:
        raise IntegrityError(
            "the snapshot's membership does not give the release's tuple root",
            object=kind,
            check="proof-root-binding",
            digest=digest,
        )
    envelope = dsse.parse_json(envelope_raw, what="envelope", subject=kind)
    return ProofBundle(kind, digest, envelope, proof)
