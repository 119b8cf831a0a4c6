"""A record schema: the Arrow schema of a corpus's records, declared once per snapshot.

A snapshot declares what one record is: its columns with Arrow types (a small closed type
grammar, spelled canonically), which columns make up the logical content (hashed into
``logicalContentDigest``), how tokens are counted, and optionally a label column whose
distribution the shadow diff reports.  The digest of the record schema is SHA-256 over
the RFC 8785 encoding of this document; it is the ``recordSchema`` of the manifest and
the ``schemaDigest`` of every member tuple.

Text, token-id (``list<uint32>``) and binary-with-metadata corpora are instances of the
same document (:data:`TEXT_SCHEMA` is the demo's).  Every record has the id column
``sampleId`` (a string, validated as an identifier); the other columns are free.
"""

from __future__ import annotations

import re
from typing import Final, Literal, Self

import pyarrow as pa
from pydantic import Field, StrictBool, StrictStr, model_validator

from relgate.errors import RelgateError, UsageError
from relgate.integrity.contract import Contract

KIND: Final = "relgate.record-schema.v1"
#: The id column every record has.
ID_COLUMN: Final = "sampleId"
#: Columns a shard adds around the record's own (member-tuple fields and the token count):
#: a record column may not take one of these names.
RESERVED_COLUMNS: Final = frozenset(
    {"sourceId", "sourceVersion", "logicalContentDigest", "split", "tokens"}
)
CHECK: Final = "record-schema"

#: Fixed-width primitive types by canonical name.
FIXED_TYPES: Final[dict[str, pa.DataType]] = {
    "bool": pa.bool_(),
    "int8": pa.int8(),
    "int16": pa.int16(),
    "int32": pa.int32(),
    "int64": pa.int64(),
    "uint8": pa.uint8(),
    "uint16": pa.uint16(),
    "uint32": pa.uint32(),
    "uint64": pa.uint64(),
    "float32": pa.float32(),
    "float64": pa.float64(),
}
#: Variable-width primitive types by canonical name.
VARIABLE_TYPES: Final[dict[str, pa.DataType]] = {
    "string": pa.string(),
    "large_string": pa.large_string(),
    "binary": pa.binary(),
    "large_binary": pa.large_binary(),
}
_LIST = re.compile(r"(list|large_list)<([a-z0-9_]+)>")


def arrow_type(name: str) -> pa.DataType:
    """The Arrow type a canonical type name spells; refused when outside the grammar."""
    if name in FIXED_TYPES:
        return FIXED_TYPES[name]
    if name in VARIABLE_TYPES:
        return VARIABLE_TYPES[name]
    match = _LIST.fullmatch(name)
    if match and match.group(2) in FIXED_TYPES and match.group(2) != "bool":
        item = FIXED_TYPES[match.group(2)]
        return pa.list_(item) if match.group(1) == "list" else pa.large_list(item)
    raise UsageError(
        f"record field type {name!r} is not one relgate can encode canonically",
        object=name,
        check=CHECK,
        details={"supported": [*FIXED_TYPES, *VARIABLE_TYPES, "list<T>", "large_list<T>"]},
    )


def type_name(dtype: pa.DataType) -> str:
    """The canonical name of an Arrow type (inverse of :func:`arrow_type`)."""
    for table in (FIXED_TYPES, VARIABLE_TYPES):
        for name, candidate in table.items():
            if dtype == candidate:
                return name
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        outer = "list" if pa.types.is_list(dtype) else "large_list"
        spelled = f"{outer}<{type_name(dtype.value_type)}>"
        arrow_type(spelled)  # refuses a list of something outside the grammar
        return spelled
    raise UsageError(
        f"Arrow type {dtype} is not one relgate can encode canonically",
        object=str(dtype),
        check=CHECK,
    )


class FieldSpec(Contract):
    """One column: its name, canonical type name and nullability.

    ``renamedFrom`` declares that this column is the previous schema's column of that name
    under a new name (schema evolution reports a rename only when it is declared, never by
    guessing); absent from the JSON when unset, so schemas without it keep their digests.
    """

    name: StrictStr = Field(min_length=1, max_length=128)
    type: StrictStr
    nullable: StrictBool = False
    renamed_from: StrictStr | None = Field(
        default=None, min_length=1, max_length=128, exclude_if=lambda v: v is None
    )

    @model_validator(mode="after")
    def _known_type(self) -> Self:
        try:
            arrow_type(self.type)
        except UsageError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def arrow_field(self) -> pa.Field:
        return pa.field(self.name, arrow_type(self.type), nullable=self.nullable)


class TokenRule(Contract):
    """How a record's token count is derived.

    ``token-ids``: the length of a ``list<uint32>`` column (exact); ``tokenizer``: the
    number of ids a pinned tokenizer (a ``tokenizers`` JSON file by SHA-256 digest in the
    workspace store) gives a string column, special tokens excluded; ``whitespace-runs``:
    maximal runs of bytes above 0x20 of a string column; ``none``: 0 (binary corpora).
    """

    kind: Literal["token-ids", "tokenizer", "whitespace-runs", "none"]
    column: StrictStr | None = None
    tokenizer: StrictStr | None = None

    @model_validator(mode="after")
    def _shape(self) -> Self:
        needs_column = self.kind != "none"
        if needs_column != (self.column is not None):
            raise ValueError(
                f"token rule {self.kind!r} {'needs' if needs_column else 'takes no'} column"
            )
        if (self.kind == "tokenizer") != (self.tokenizer is not None):
            raise ValueError("a tokenizer digest goes with, and only with, the 'tokenizer' rule")
        return self


class RecordSchema(Contract):
    """What one record of a corpus is (see the module docstring)."""

    kind: Literal["relgate.record-schema.v1"] = KIND
    name: StrictStr = Field(min_length=1, max_length=128)
    fields: tuple[FieldSpec, ...]
    content: tuple[StrictStr, ...]
    tokens: TokenRule
    label: StrictStr | None = None

    @model_validator(mode="after")
    def _consistent(self) -> Self:
        names = [f.name for f in self.fields]
        by_name = {f.name: f for f in self.fields}
        problems = []
        if len(set(names)) != len(names):
            problems.append("column names repeat")
        id_field = by_name.get(ID_COLUMN)
        if id_field is None or id_field.type != "string" or id_field.nullable:
            problems.append(f"{ID_COLUMN!r} must be a non-nullable string column")
        if RESERVED_COLUMNS & set(names):
            problems.append(f"reserved column names: {sorted(RESERVED_COLUMNS & set(names))}")
        if not self.content or len(set(self.content)) != len(self.content):
            problems.append("content must name at least one column, each once")
        for column in self.content:
            spec = by_name.get(column)
            if spec is None or column == ID_COLUMN or spec.nullable:
                problems.append(f"content column {column!r} must be a non-nullable record column")
        problems += self._token_problems(by_name)
        if self.label is not None and self.label not in by_name:
            problems.append(f"label column {self.label!r} is not a record column")
        problems += _rename_problems(self.fields, set(names))
        if problems:
            raise ValueError("record schema refused: " + "; ".join(problems))
        return self

    def _token_problems(self, by_name: dict[str, FieldSpec]) -> list[str]:
        column = self.tokens.column
        if column is None:
            return []
        spec = by_name.get(column)
        if spec is None or spec.nullable:
            return [f"token column {column!r} must be a non-nullable record column"]
        wanted = {"token-ids": ("list<uint32>", "large_list<uint32>")}.get(
            self.tokens.kind, ("string", "large_string")
        )
        if spec.type not in wanted:
            return [f"token rule {self.tokens.kind!r} needs a {' or '.join(wanted)} column"]
        return []

    @property
    def column_names(self) -> tuple[str, ...]:
        return tuple(f.name for f in self.fields)

    @property
    def attributes(self) -> tuple[str, ...]:
        """Record columns that are neither the id nor content (bound by the shard stream)."""
        return tuple(
            f.name for f in self.fields if f.name != ID_COLUMN and f.name not in self.content
        )

    def field(self, name: str) -> FieldSpec:
        for spec in self.fields:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def arrow_schema(self) -> pa.Schema:
        """The Arrow schema of a source batch of these records (``sourceVersion`` added)."""
        return pa.schema(
            [*(f.arrow_field for f in self.fields), pa.field("sourceVersion", pa.string(), False)]
        )

    @classmethod
    def from_config(cls, value: object) -> RecordSchema:
        """A record schema a user wrote (workspace config): a mistake is a usage error."""
        try:
            return cls.parse(value, what="recordSchema")
        except RelgateError as exc:
            raise UsageError(str(exc), object="recordSchema", check=CHECK) from None

    @classmethod
    def from_arrow(
        cls,
        name: str,
        schema: pa.Schema,
        *,
        content: tuple[str, ...],
        tokens: TokenRule,
        label: str | None = None,
    ) -> RecordSchema:
        """Declare a record schema from an Arrow schema (for users who have one)."""
        fields = tuple(
            FieldSpec(name=f.name, type=type_name(f.type), nullable=f.nullable) for f in schema
        )
        return cls(name=name, fields=fields, content=content, tokens=tokens, label=label)


def _rename_problems(fields: tuple[FieldSpec, ...], names: set[str]) -> list[str]:
    """A declared rename names a column this schema no longer has, each at most once."""
    sources = [f.renamed_from for f in fields if f.renamed_from is not None]
    problems = [
        f"column {f.name!r} is renamed from a column this schema still has"
        for f in fields
        if f.renamed_from is not None and f.renamed_from in names
    ]
    if len(set(sources)) != len(sources):
        problems.append("two columns are renamed from the same column")
    return problems


#: The demo corpus: text records with a language code, tokens by whitespace runs unless a
#: tokenizer is declared (the demo workspace declares its trained one).
TEXT_SCHEMA: Final = RecordSchema(
    name="relgate.text.v1",
    fields=(
        FieldSpec(name=ID_COLUMN, type="string"),
        FieldSpec(name="lang", type="string"),
        FieldSpec(name="text", type="string"),
    ),
    content=("lang", "text"),
    tokens=TokenRule(kind="whitespace-runs", column="text"),
    label="lang",
)
