"""Selection and split policies: pure, deterministic, recorded by digest.

A policy is a small JSON document of integers and strings; its digest goes into the
manifest, and replay re-runs exactly that policy against the pinned source versions.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Literal, Self

import numpy as np
import pyarrow as pa
from pydantic import Field, StrictInt, StrictStr, field_validator, model_validator

from relgate.errors import UsageError
from relgate.integrity.contract import Contract
from relgate.integrity.hashing import sha256_rows
from relgate.records.record_schema import RecordSchema

if TYPE_CHECKING:
    import polars as pl

#: Split buckets are basis points of the id space.
BASIS_POINTS = 10_000


def _require_kind(data: object, kind: str, what: str, policy: str) -> None:
    if not isinstance(data, dict) or data.get("kind") != kind:
        raise UsageError(f"unknown {policy} policy kind", object=what, check="policy-kind")


# -- selection -------------------------------------------------------------------------------
class SelectionPolicy(Contract):
    """Which transformed rows become members: a language set and a length window."""

    kind: Literal["relgate.selection.v1"] = "relgate.selection.v1"
    languages: tuple[StrictStr, ...] = Field(default=("en", "de", "fr"), validate_default=True)
    min_chars: StrictInt = 16
    max_chars: StrictInt = 20_000

    @field_validator("languages")
    @classmethod
    def _sorted(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return tuple(sorted(value))

    @classmethod
    def from_json(cls, data: object) -> SelectionPolicy:
        _require_kind(data, "relgate.selection.v1", "selectionPolicy", "selection")
        return cls.parse(data, what="selectionPolicy")

    def expression(self, records: RecordSchema) -> pl.Expr:
        """Rows to keep; the record schema must have ``lang`` and ``text`` string columns."""
        import polars as pl  # noqa: PLC0415 - polars loads when a policy runs (CLI start-up)

        for column in ("lang", "text"):
            if column not in records.column_names or records.field(column).type != "string":
                raise UsageError(
                    f"selection v1 needs a string column {column!r}; use relgate.selection.v2"
                    " predicates for this record schema",
                    object=records.name,
                    check="policy-columns",
                )
        length = pl.col("text").str.len_chars()
        return (
            pl.col("lang").is_in(list(self.languages))
            & (length >= self.min_chars)
            & (length <= self.max_chars)
        )


class ColumnPredicate(Contract):
    """One condition on one record column: membership in a set of strings, a length
    window (characters of a string, bytes of a binary, elements of a list) and/or a value
    window (integers)."""

    column: StrictStr
    any_of: tuple[StrictStr, ...] | None = None
    min_length: StrictInt | None = None
    max_length: StrictInt | None = None
    min_value: StrictInt | None = None
    max_value: StrictInt | None = None

    def expression(self, records: RecordSchema) -> pl.Expr:
        import polars as pl  # noqa: PLC0415 - as SelectionPolicy.expression

        if self.column not in records.column_names:
            raise UsageError(
                f"selection predicate names no record column {self.column!r}",
                object=records.name,
                check="policy-columns",
            )
        dtype = records.field(self.column).arrow_field.type
        col = pl.col(self.column)
        out = pl.lit(value=True)
        if self.any_of is not None:
            out = out & col.is_in(list(self.any_of))
        if self.min_length is not None or self.max_length is not None:
            length = _length(col, dtype, self.column, records.name)
            if self.min_length is not None:
                out = out & (length >= self.min_length)
            if self.max_length is not None:
                out = out & (length <= self.max_length)
        if self.min_value is not None:
            out = out & (col >= self.min_value)
        if self.max_value is not None:
            out = out & (col <= self.max_value)
        return out


def _length(col: pl.Expr, dtype: pa.DataType, column: str, schema: str) -> pl.Expr:
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return col.str.len_chars()
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return col.bin.size()
    if pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        return col.list.len()
    raise UsageError(f"column {column!r} has no length", object=schema, check="policy-columns")


class PredicatePolicy(Contract):
    """Which transformed rows become members, for any record schema: every predicate
    holds (an empty list selects every row)."""

    kind: Literal["relgate.selection.v2"] = "relgate.selection.v2"
    predicates: tuple[ColumnPredicate, ...] = ()

    def expression(self, records: RecordSchema) -> pl.Expr:
        import polars as pl  # noqa: PLC0415 - as SelectionPolicy.expression

        out = pl.lit(value=True)
        for predicate in self.predicates:
            out = out & predicate.expression(records)
        return out


#: A selection policy of either kind (the ``kind`` field tells them apart).
Selection = Annotated[SelectionPolicy | PredicatePolicy, Field(discriminator="kind")]


def selection_from_json(data: object) -> SelectionPolicy | PredicatePolicy:
    """A selection policy document of a known kind."""
    if isinstance(data, dict) and data.get("kind") == "relgate.selection.v2":
        return PredicatePolicy.parse(data, what="selectionPolicy")
    return SelectionPolicy.from_json(data)


# -- split -----------------------------------------------------------------------------------
class SplitPolicy(Contract):
    """Bucket = first 4 bytes of SHA-256(seed || 0x00 || sampleId) mod 10000; splits own
    consecutive bucket ranges in basis points.  Depends on the id only, so a sample keeps
    its split across snapshots."""

    kind: Literal["relgate.split.v1"] = "relgate.split.v1"
    seed: StrictStr = "relgate-split-1"
    buckets: tuple[tuple[StrictStr, StrictInt], ...] = (
        ("train", 9000),
        ("validation", 500),
        ("test", 500),
    )

    @model_validator(mode="after")
    def _partition(self) -> Self:
        if sum(bp for _, bp in self.buckets) != BASIS_POINTS:
            raise UsageError(
                "split basis points must sum to 10000", object="splitPolicy", check="split-sum"
            )
        names = [n for n, _ in self.buckets]
        if len(set(names)) != len(names):
            raise UsageError(
                "split names must be unique", object="splitPolicy", check="split-names"
            )
        return self

    @classmethod
    def from_json(cls, data: object) -> SplitPolicy:
        _require_kind(data, "relgate.split.v1", "splitPolicy", "split")
        return cls.parse(data, what="splitPolicy")

    def _name_for(self, bucket: int) -> str:
        edge = 0
        for name, bp in self.buckets:
            edge += bp
            if bucket < edge:
                return name
        raise AssertionError("unreachable: buckets sum to 10000")

    def assign(self, sample_ids: pa.Array | pa.ChunkedArray) -> pa.Array:
        raw = sha256_rows(sample_ids, prefix=self.seed.encode() + b"\x00")
        words = np.frombuffer(raw, dtype=">u4").reshape(-1, 8)[:, 0].astype(np.int64) % BASIS_POINTS
        edges = np.cumsum([bp for _, bp in self.buckets])
        index = np.searchsorted(edges, words, side="right")
        names = pa.array([n for n, _ in self.buckets], pa.string())
        return names.take(pa.array(index))
