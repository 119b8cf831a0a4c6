"""Schema evolution: what changed between two record schemas, and who can still read.

:func:`compare` diffs the record schema of an old and a new subject (a release root, or a
snapshot) into a :class:`SchemaEvolutionReport`: columns added, removed, renamed (only
when the new schema *declares* it, ``renamedFrom``; a rename is never guessed),
type-changed (classified as widening, narrowing or changed), content-column, label and
token-rule changes, and a verdict per declared reader (:mod:`relgate.documents.declared_readers`).

Widening (:func:`widens`) is a partial order on canonical type names, reflexive and
transitive: ``int8 < int16 < int32 < int64``, ``uint8 < ... < uint64``,
``float32 < float64``, ``string < large_string``, ``binary < large_binary``, and
``list<T> <= list<U>``, ``list<T> <= large_list<U>``, ``large_list<T> <= large_list<U>``
whenever ``T <= U``.  Nothing else widens (signed/unsigned, integer/float and any other
cross-kind change is *changed*).  Nullability widens from non-nullable to nullable.  A
column change is a widening when both its type and its nullability widen (or stay), a
narrowing when both narrow (or stay), otherwise changed.

A reader is checked against the *new* schema: a required column missing (or only present
under a new name: the reader reads it by its old name) makes it INCOMPATIBLE, as does a
column it reads whose type is narrower than, or unrelated to, the type it reads it as; a
widened column (wider type, or nulls where the reader takes none) is compatible only when
the reader accepts widening.  An absent optional column is fine.

The verifier stores the report signed (DSSE, verifier role) for every root it verifies
(:func:`record_for_root`), against the previous release (:func:`previous_release`); the
publication path refuses a root whose stored report says a declared reader cannot read
it, or which has no (current) report while readers are declared (:func:`require_readable`).
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Final, Literal

import pyarrow as pa
from pydantic import Field, StrictBool, StrictStr

from relgate.catalog import evolution_table
from relgate.catalog.release_table import get_release
from relgate.catalog.snapshot_table import get_snapshot
from relgate.documents import release_root as rm
from relgate.documents import snapshot_manifest as sm
from relgate.documents.declared_readers import ReaderColumn, ReaderSpec
from relgate.documents.shard_format import ShardFormat
from relgate.errors import IntegrityError, NotFoundError, RejectedError, RelgateError
from relgate.integrity.contract import Contract
from relgate.integrity.signing import SigningKey, sign_envelope, verify_envelope
from relgate.objects.cas import ContentRef
from relgate.records.record_schema import FieldSpec, RecordSchema, TokenRule, arrow_type, type_name
from relgate.workspace import Workspace

REPORT_SCHEMA: Final = "relgate.release.schema-evolution.v1"
PAYLOAD_TYPE: Final = "application/vnd.relgate.schema-evolution.v1+json"
#: The check a publication refused for a reader that cannot read the root names.
SCHEMA_COMPATIBILITY: Final = "schema-compatibility"
#: Releases a previous release may be in (verified at least once, not proven INVALID).
PREVIOUS_STATES: Final = ("VERIFIED", "APPROVED", "PUBLISHED")

Change = Literal["widening", "narrowing", "changed"]
Verdict = Literal["COMPATIBLE", "INCOMPATIBLE"]

#: Chains of the widening order among primitive types (each widens to those after it).
_CHAINS: Final = (
    ("int8", "int16", "int32", "int64"),
    ("uint8", "uint16", "uint32", "uint64"),
    ("float32", "float64"),
    ("string", "large_string"),
    ("binary", "large_binary"),
)


def _list_parts(name: str) -> tuple[bool, str] | None:
    """(is large, item type name) of a list type name; None for a primitive."""
    dtype = arrow_type(name)
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return pa.types.is_large_list(dtype), type_name(dtype.value_type)
    return None


def widens(old: str, new: str) -> bool:
    """Whether a column of type ``old`` may become ``new`` losslessly (see module doc)."""
    if old == new:
        return True
    old_list, new_list = _list_parts(old), _list_parts(new)
    if old_list is not None or new_list is not None:
        if old_list is None or new_list is None:
            return False
        outer_ok = new_list[0] or not old_list[0]  # list -> large_list, never back
        return outer_ok and widens(old_list[1], new_list[1])
    for chain in _CHAINS:
        if old in chain and new in chain:
            return chain.index(old) <= chain.index(new)
    return False


def classify(old: FieldSpec, new: FieldSpec) -> Change | None:
    """How a column's type and nullability changed (None: they did not)."""
    if (old.type, old.nullable) == (new.type, new.nullable):
        return None
    if widens(old.type, new.type) and new.nullable >= old.nullable:
        return "widening"
    if widens(new.type, old.type) and new.nullable <= old.nullable:
        return "narrowing"
    return "changed"


class SchemaSide(Contract):
    """One side of a comparison: the subject and the digests of its schema."""

    kind: Literal["release", "snapshot"]
    subject: StrictStr
    #: the release root's ``recordSchema`` (its shard schema), or the snapshot's shard
    #: format digest
    shard_schema: StrictStr
    #: the record schema's digest (every member tuple's ``schemaDigest``)
    record_schema: StrictStr


class Renamed(Contract):
    old_name: StrictStr = Field(alias="from")
    new_name: StrictStr = Field(alias="to")


class TypeChange(Contract):
    column: StrictStr
    old_type: StrictStr
    new_type: StrictStr
    old_nullable: StrictBool
    new_nullable: StrictBool
    change: Change


class ColumnsChange(Contract):
    """Content columns (or the label) before and after."""

    old: tuple[StrictStr, ...]
    new: tuple[StrictStr, ...]
    changed: StrictBool


class TokenRuleChange(Contract):
    old: TokenRule | None
    new: TokenRule
    changed: StrictBool


class ReaderVerdict(Contract):
    reader: StrictStr
    #: digest of the reader's declaration the verdict was reached for
    declaration: StrictStr
    verdict: Verdict
    reasons: tuple[StrictStr, ...]


class ChangeCounts(Contract):
    added: int
    removed: int
    renamed: int
    type_changed: int
    widened: int
    narrowed: int
    incompatible_readers: int


class SchemaEvolutionReport(Contract):
    """The signed document (see the module docstring); ``old`` is null for a first release."""

    schema_name: Literal["relgate.release.schema-evolution.v1"] = Field(
        default=REPORT_SCHEMA, alias="schema"
    )
    old: SchemaSide | None
    new: SchemaSide
    added: tuple[FieldSpec, ...]
    removed: tuple[FieldSpec, ...]
    renamed: tuple[Renamed, ...]
    type_changes: tuple[TypeChange, ...]
    content: ColumnsChange
    label: ColumnsChange
    token_rule: TokenRuleChange
    readers: tuple[ReaderVerdict, ...]
    counts: ChangeCounts

    @property
    def compatible(self) -> bool:
        return all(r.verdict == "COMPATIBLE" for r in self.readers)


# -- comparing -------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Pairs:
    pairs: tuple[tuple[FieldSpec, FieldSpec], ...]
    added: tuple[FieldSpec, ...]
    removed: tuple[FieldSpec, ...]
    renamed: tuple[Renamed, ...]


def _pair(old: RecordSchema | None, new: RecordSchema) -> _Pairs:
    """Match new columns to old ones: by a declared rename, else by name."""
    old_fields = {f.name: f for f in (old.fields if old is not None else ())}
    new_names = set(new.column_names)
    pairs, added, renamed = [], [], []
    for spec in new.fields:
        source = spec.renamed_from
        if source is not None and source in old_fields and source not in new_names:
            pairs.append((old_fields.pop(source), spec))
            renamed.append(Renamed.model_validate({"from": source, "to": spec.name}))
        elif spec.name in old_fields:
            pairs.append((old_fields.pop(spec.name), spec))
        elif old is not None:
            added.append(spec)
    return _Pairs(tuple(pairs), tuple(added), tuple(old_fields.values()), tuple(renamed))


def _type_changes(pairs: _Pairs) -> tuple[TypeChange, ...]:
    changes = []
    for old, new in pairs.pairs:
        change = classify(old, new)
        if change is not None:
            changes.append(
                TypeChange(
                    column=new.name,
                    old_type=old.type,
                    new_type=new.type,
                    old_nullable=old.nullable,
                    new_nullable=new.nullable,
                    change=change,
                )
            )
    return tuple(changes)


def _column_problem(column: ReaderColumn, spec: FieldSpec, accepts_widening: bool) -> str | None:
    """Why a reader cannot read ``spec`` as it declares ``column`` (None: it can)."""
    exact = spec.type == column.type and (column.nullable or not spec.nullable)
    if exact:
        return None
    wanted = f"{column.type}{' (nullable)' if column.nullable else ''}"
    found = f"{spec.type}{' (nullable)' if spec.nullable else ''}"
    if widens(column.type, spec.type):
        if accepts_widening:
            return None
        return f"column {spec.name!r} is widened to {found}; the reader reads {wanted} and does not accept widened types"
    how = "narrowed" if widens(spec.type, column.type) else "changed"
    return f"column {spec.name!r} is {found} ({how}); the reader reads it as {wanted}"


def reader_verdict(reader: ReaderSpec, new: RecordSchema) -> ReaderVerdict:
    """Whether ``reader`` can read records of ``new`` (see the module docstring)."""
    by_name = {f.name: f for f in new.fields}
    renamed_to = {f.renamed_from: f.name for f in new.fields if f.renamed_from is not None}
    reasons: list[str] = []
    for column, required in reader.columns:
        spec = by_name.get(column.name)
        if spec is None:
            if column.name in renamed_to and required:
                reasons.append(
                    f"column {column.name!r} was renamed to {renamed_to[column.name]!r};"
                    " the reader reads it by its old name"
                )
            elif required:
                reasons.append(f"required column {column.name!r} is missing")
            continue
        problem = _column_problem(column, spec, reader.accepts_widening)
        if problem is not None:
            reasons.append(problem)
    return ReaderVerdict(
        reader=reader.name,
        declaration=reader.digest(),
        verdict="INCOMPATIBLE" if reasons else "COMPATIBLE",
        reasons=tuple(reasons),
    )


def compare(
    old: tuple[SchemaSide, RecordSchema] | None,
    new: tuple[SchemaSide, RecordSchema],
    readers: tuple[ReaderSpec, ...],
) -> SchemaEvolutionReport:
    """The report of ``new`` against ``old`` (None: a first release) for ``readers``."""
    old_schema = old[1] if old is not None else None
    new_schema = new[1]
    pairs = _pair(old_schema, new_schema)
    changes = _type_changes(pairs)
    verdicts = tuple(reader_verdict(r, new_schema) for r in readers)
    old_content = old_schema.content if old_schema is not None else ()
    old_label = (old_schema.label,) if old_schema is not None and old_schema.label else ()
    new_label = (new_schema.label,) if new_schema.label else ()
    old_tokens = old_schema.tokens if old_schema is not None else None
    return SchemaEvolutionReport(
        old=old[0] if old is not None else None,
        new=new[0],
        added=pairs.added,
        removed=pairs.removed,
        renamed=pairs.renamed,
        type_changes=changes,
        content=ColumnsChange(
            old=old_content, new=new_schema.content, changed=old_content != new_schema.content
        ),
        label=ColumnsChange(old=old_label, new=new_label, changed=old_label != new_label),
        token_rule=TokenRuleChange(
            old=old_tokens, new=new_schema.tokens, changed=old_tokens != new_schema.tokens
        ),
        readers=verdicts,
        counts=ChangeCounts(
            added=len(pairs.added),
            removed=len(pairs.removed),
            renamed=len(pairs.renamed),
            type_changed=len(changes),
            widened=sum(1 for c in changes if c.change == "widening"),
            narrowed=sum(1 for c in changes if c.change == "narrowing"),
            incompatible_readers=sum(1 for v in verdicts if v.verdict == "INCOMPATIBLE"),
        ),
    )


# -- subjects --------------------------------------------------------------------------------
def schema_of(ws: Workspace, digest: str) -> tuple[SchemaSide, RecordSchema]:
    """The record schema a release root (verified envelope) or a snapshot declares."""
    try:
        row = get_release(ws.db, digest)
    except NotFoundError:
        row = None
    if row is not None:
        manifest = rm.load(ws.store, ws.trusted_keys, digest, row.envelope_version)
        fmt = manifest.shard_format()
        kind: Literal["release", "snapshot"] = "release"
    else:
        snap_row = get_snapshot(ws.db, digest)
        snap = sm.load(ws.store, ws.trusted_keys, digest, snap_row.envelope_version)
        fmt = ShardFormat(snap.record_schema_document)
        kind = "snapshot"
    side = SchemaSide(
        kind=kind, subject=digest, shard_schema=fmt.digest, record_schema=fmt.records.digest()
    )
    return side, fmt.records


def declared_readers(ws: Workspace) -> tuple[ReaderSpec, ...]:
    return ws.settings.readers or ()


def schema_diff(ws: Workspace, old: str, new: str) -> SchemaEvolutionReport:
    """``relgate release schema-diff OLD NEW``: nothing is stored."""
    return compare(schema_of(ws, old), schema_of(ws, new), declared_readers(ws))


def previous_release(ws: Workspace, root: str) -> str | None:
    """The release a new root is compared with: a release of its snapshot's parent.

    Parents in the order the snapshot manifest lists them; of a parent's releases that
    were verified and not proven INVALID, a PUBLISHED one first, then the newest.  None
    when the snapshot has no parent or no parent has such a release.
    """
    manifest = rm.load(ws.store, ws.trusted_keys, root, get_release(ws.db, root).envelope_version)
    snap_row = get_snapshot(ws.db, manifest.snapshot)
    snap = sm.load(ws.store, ws.trusted_keys, manifest.snapshot, snap_row.envelope_version)
    for parent in snap.parents:
        found = evolution_table.releases_of_snapshot(ws.db, parent, PREVIOUS_STATES)
        candidates = [d for d in found if d != root]
        if candidates:
            return candidates[0]
    return None


# -- storing and enforcing -------------------------------------------------------------------
def store_report(ws: Workspace, report: SchemaEvolutionReport, key: SigningKey) -> ContentRef:
    """Sign the report and store its envelope content-addressed."""
    envelope = sign_envelope(PAYLOAD_TYPE, report.canonical(), key)
    return ws.cas.put(json.dumps(envelope, sort_keys=True).encode())


def record_for_root(ws: Workspace, root: str, *, actor: str) -> SchemaEvolutionReport:
    """Compare a just-verified root with the previous release; sign, store and record it."""
    previous = previous_release(ws, root)
    old = schema_of(ws, previous) if previous is not None else None
    report = compare(old, schema_of(ws, root), declared_readers(ws))
    ref = store_report(ws, report, ws.key("verifier"))
    evolution_table.record(
        ws.db,
        root=root,
        old_root=previous,
        ref=ref,
        compatible=report.compatible,
        actor=actor,
    )
    return report


def load_stored(ws: Workspace, root: str) -> tuple[SchemaEvolutionReport, str] | None:
    """The newest stored report bound to ``root`` (signature, digest and binding checked)
    and its digest; None when none is recorded."""
    row = evolution_table.newest(ws.db, root)
    if row is None:
        return None
    digest, version = row.report_digest, row.report_version
    subject = f"schema-evolution report {digest}"
    try:
        payload = verify_envelope(
            json.loads(ws.cas.get(digest, version)),
            ws.trusted_keys,
            payload_type=PAYLOAD_TYPE,
            subject=subject,
        )
        report = SchemaEvolutionReport.parse(json.loads(payload), what=subject)
    except (RelgateError, ValueError) as exc:
        cause = exc.check if isinstance(exc, RelgateError) else type(exc).__name__
        raise IntegrityError(
            f"stored schema-evolution report of release {root} refused: {exc}",
            object=f"release {root}",
            check=SCHEMA_COMPATIBILITY,
            digest=root,
            details={"report": digest, "cause": cause},
        ) from None
    if report.new.subject != root:
        raise IntegrityError(
            f"stored schema-evolution report is bound to another root, not release {root}",
            object=f"release {root}",
            check=SCHEMA_COMPATIBILITY,
            digest=root,
            details={"report": digest, "boundTo": report.new.subject},
        )
    return report, digest


def require_readable(ws: Workspace, root: str) -> None:
    """Refuse (exit 3) unless every declared reader can read ``root`` per its stored,
    current schema-evolution report (fail closed: no report, or a reader it does not
    cover with the declaration in force now, is a refusal)."""
    readers = declared_readers(ws)
    if not readers:
        return
    stored = load_stored(ws, root)
    if stored is None:
        raise RejectedError(
            f"release {root} has no schema-evolution report while readers are declared"
            f" ({', '.join(r.name for r in readers)}); verify it first",
            object=f"release {root}",
            check=SCHEMA_COMPATIBILITY,
            digest=root,
            details={"readers": [r.name for r in readers]},
        )
    report, digest = stored
    verdicts = {(v.reader, v.declaration): v for v in report.readers}
    for reader in readers:
        verdict = verdicts.get((reader.name, reader.digest()))
        if verdict is None:
            reasons: tuple[str, ...] = (
                "the stored report does not cover this reader's current declaration;"
                " verify the release again",
            )
        elif verdict.verdict != "COMPATIBLE":
            reasons = verdict.reasons
        else:
            continue
        raise RejectedError(
            f"reader {reader.name!r} cannot read release {root}: {'; '.join(reasons)}",
            object=f"release {root}",
            check=SCHEMA_COMPATIBILITY,
            digest=root,
            details={"reader": reader.name, "reasons": list(reasons), "report": digest},
        )
