"""In-toto Statement v1 with the SLSA provenance v1 predicate, as typed contracts.

One model for every statement relgate issues (snapshots and releases): field names are the
specs' own (``_type``, ``subject``, ``predicateType``, ``buildDefinition``,
``resolvedDependencies``, ``runDetails``...).  Every subject and every material is a
:class:`ResourceDescriptor` that *must* carry a ``digest: {sha256: <hex>}``: a dependency
named only by a mutable name (a source id, a table name, a tag) cannot be expressed.

The statement travels as a DSSE envelope (``application/vnd.in-toto+json``) over its
RFC 8785 bytes.  :func:`open_statement` verifies the signature with the trusted keys of one
role, parses strictly (a payload that does not survive the round trip through the model is
refused) and checks that the builder id names the key that signed it;
:func:`require_subjects` and :func:`require_materials` are the binding checks.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Mapping, Sequence
from typing import Annotated, Final, Literal

from pydantic import Field, StrictInt, StrictStr, StringConstraints
from pydantic import JsonValue as WireValue
from relgate_trust.digests import is_digest

from relgate.errors import IntegrityError, RejectedError
from relgate.integrity.contract import Contract, JsonObject
from relgate.integrity.digests import hex_of
from relgate.integrity.signing import Role, SigningKey, TrustedKeys, open_verified, sign_envelope

STATEMENT_TYPE: Final = "https://in-toto.io/Statement/v1"
PREDICATE_TYPE: Final = "https://slsa.dev/provenance/v1"
PAYLOAD_TYPE: Final = "application/vnd.in-toto+json"
#: Builder ids are ``<namespace>/<kind>/<keyid>``: the key, never a host, names the builder.
BUILDER_NAMESPACE: Final = "https://relgate.dev/builders"

#: The statement's subjects are not exactly the object it is opened for.
SUBJECT_CHECK: Final = "provenance-subject"
#: A material (resolved dependency) without a usable digest.
MATERIAL_DIGEST_CHECK: Final = "provenance-material-digest"
#: The statement's materials differ from what the manifest's pins resolve to.
MATERIALS_CHECK: Final = "provenance-materials"
#: The builder id does not name the key that signed the statement.
BUILDER_CHECK: Final = "provenance-builder"
#: No statement is recorded for the object.
STATEMENT_CHECK: Final = "provenance-statement"

Sha256Hex = Annotated[str, StringConstraints(strict=True, pattern=r"^[0-9a-f]{64}$")]
#: A ``sha256:<hex>`` digest as a model field (the spelling of relgate.integrity.digests).
SpelledDigest = Annotated[str, StringConstraints(strict=True, pattern=r"^sha256:[0-9a-f]{64}$")]
#: Annotation values: strings and integers (the manifests' own rule: no floats).
Annotation = StrictStr | StrictInt


def _absent(value: object) -> bool:
    return value is None


class DigestSet(Contract):
    """``{"sha256": "<hex>"}``: the one algorithm relgate records (closed model)."""

    sha256: Sha256Hex

    @property
    def spelled(self) -> str:
        """The ``sha256:<hex>`` spelling used everywhere else."""
        return f"sha256:{self.sha256}"


class ResourceDescriptor(Contract):
    """An in-toto ResourceDescriptor whose ``digest`` is required."""

    uri: StrictStr | None = Field(default=None, exclude_if=_absent)
    #: ``digest`` on the wire (``digest`` is the contract's own digest method).
    digest_set: DigestSet = Field(alias="digest")
    name: StrictStr | None = Field(default=None, exclude_if=_absent)
    media_type: StrictStr | None = Field(default=None, exclude_if=_absent)
    annotations: dict[StrictStr, Annotation] | None = Field(default=None, exclude_if=_absent)

    @classmethod
    def of(cls, digest: str, **fields: object) -> ResourceDescriptor:
        """A descriptor for a ``sha256:`` digest (syntax checked)."""
        return cls.model_validate({"digest": {"sha256": hex_of(digest)}, **fields})

    @property
    def sha256(self) -> str:
        return self.digest_set.spelled


class Builder(Contract):
    id: StrictStr
    version: dict[StrictStr, StrictStr]


class BuildMetadata(Contract):
    invocation_id: StrictStr
    started_on: StrictStr
    finished_on: StrictStr


class RunDetails(Contract):
    builder: Builder
    metadata: BuildMetadata
    byproducts: tuple[ResourceDescriptor, ...] | None = Field(default=None, exclude_if=_absent)


class BuildDefinition(Contract):
    build_type: StrictStr
    external_parameters: dict[StrictStr, WireValue]
    internal_parameters: dict[StrictStr, WireValue]
    resolved_dependencies: tuple[ResourceDescriptor, ...]


class SlsaProvenance(Contract):
    """The SLSA provenance v1 predicate."""

    build_definition: BuildDefinition
    run_details: RunDetails


class Statement(Contract):
    """An in-toto Statement v1 whose predicate is SLSA provenance v1."""

    type_: Literal["https://in-toto.io/Statement/v1"] = Field(default=STATEMENT_TYPE, alias="_type")
    subject: tuple[ResourceDescriptor, ...] = Field(min_length=1)
    predicate_type: Literal["https://slsa.dev/provenance/v1"] = PREDICATE_TYPE
    predicate: SlsaProvenance

    @property
    def materials(self) -> tuple[ResourceDescriptor, ...]:
        return self.predicate.build_definition.resolved_dependencies

    @property
    def builder_id(self) -> str:
        return self.predicate.run_details.builder.id


def builder_id(kind: str, keyid: str) -> str:
    """The builder id URI of ``kind`` (e.g. ``snapshot-builder``) signing with ``keyid``."""
    return f"{BUILDER_NAMESPACE}/{kind}/{keyid}"


def sign_statement(statement: Statement, key: SigningKey) -> JsonObject:
    """The DSSE envelope over the statement's RFC 8785 bytes."""
    return sign_envelope(PAYLOAD_TYPE, statement.canonical(), key)


def open_statement(
    envelope: bytes, trusted: TrustedKeys, *, role: Role, kind: str, subject: str
) -> Statement:
    """Verify the envelope with the trusted keys of ``role``, parse strictly and check that
    the builder id is ``kind`` at the signing key; any refusal is exit 3."""
    verified = open_verified(
        envelope, trusted, payload_type=PAYLOAD_TYPE, subject=subject, roles={role}
    )
    _require_material_digests(verified.body, subject)
    statement = Statement.parse(verified.body, what=subject)
    if statement.to_json() != verified.body:
        raise RejectedError(
            "statement does not survive the round trip through its model",
            object=subject,
            check="schema",
        )
    expected = builder_id(kind, verified.keyid)
    if statement.builder_id != expected:
        raise RejectedError(
            "builder id does not name the key that signed the statement",
            object=subject,
            check=BUILDER_CHECK,
            digest=verified.keyid,
            details={"builderId": statement.builder_id, "expected": expected},
        )
    return statement


def _require_material_digests(body: object, subject: str) -> None:
    """Every ``resolvedDependencies`` entry carries a ``sha256`` digest (checked on the
    raw payload first, so the refusal names this check rather than a schema error)."""
    predicate = body.get("predicate") if isinstance(body, dict) else None
    definition = predicate.get("buildDefinition") if isinstance(predicate, dict) else None
    materials = definition.get("resolvedDependencies") if isinstance(definition, dict) else None
    for index, material in enumerate(materials if isinstance(materials, list) else []):
        digest = material.get("digest") if isinstance(material, dict) else None
        value = digest.get("sha256") if isinstance(digest, dict) else None
        if not isinstance(value, str) or not is_digest(f"sha256:{value}"):
            uri = material.get("uri") if isinstance(material, dict) else None
            raise RejectedError(
                f"material {index} ({uri or 'no uri'}) has no sha256 digest",
                object=subject,
                check=MATERIAL_DIGEST_CHECK,
            )


def require_subjects(statement: Statement, expected: Mapping[str, str], *, subject: str) -> None:
    """Every ``name -> digest`` in ``expected`` is a subject, and nothing else is."""
    found = {d.name or "": d.sha256 for d in statement.subject}
    for name, digest in expected.items():
        if found.get(name) != digest:
            raise IntegrityError(
                f"statement subject {name!r} is not this object's digest",
                object=subject,
                check=SUBJECT_CHECK,
                digest=digest,
                details={"found": found.get(name)},
            )
    extra = sorted(set(found) - set(expected))
    if extra:
        raise IntegrityError(
            f"statement names subjects this object does not have: {extra[:3]}",
            object=subject,
            check=SUBJECT_CHECK,
            digest=found[extra[0]],
        )


def _key(descriptor: ResourceDescriptor) -> str:
    """An order-free identity of a descriptor's JSON (values are strings and integers)."""
    return json.dumps(descriptor.to_json(), sort_keys=True, separators=(",", ":"))


def require_materials(
    statement: Statement, expected: Sequence[ResourceDescriptor], *, subject: str
) -> None:
    """The statement's materials are exactly ``expected`` (as a multiset, order free)."""
    have = Counter(_key(d) for d in statement.materials)
    want = Counter(_key(d) for d in expected)
    if have == want:
        return
    short, over = want - have, have - want
    missing = [d for d in expected if short[_key(d)]]
    extra = [d for d in statement.materials if over[_key(d)]]
    first = (missing or extra)[0]
    raise IntegrityError(
        "statement materials differ from the manifest's pins",
        object=subject,
        check=MATERIALS_CHECK,
        digest=first.sha256,
        details={
            "missing": len(missing),
            "extra": len(extra),
            "expected": len(expected),
            "found": len(statement.materials),
        },
    )


class VerifiedStatement(Contract):
    """A statement that verified, and where it is stored (what ``provenance`` prints)."""

    #: The snapshot or release root the statement is about.
    subject_digest: StrictStr
    statement_digest: StrictStr
    statement_version: StrictStr
    materials: StrictInt
    statement: Statement
