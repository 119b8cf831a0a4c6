"""The shard record format and the canonical record stream of a shard release.

This module is the one definition the writer and the independent verifier share: what a
shard record is for a given record schema, how its token count is derived, and which
bytes the descriptor's ``logicalDigest`` and ``memberSetDigest`` are computed over.
Everything else (reading sources, sharding, staging, decoding stored bytes, diffing
sets) lives on one side only.

Shard record (parquet columns, in this order; the record schema's own nullability)::

    sampleId, sourceId, sourceVersion, logicalContentDigest, split : string
    <every record column but sampleId, in record-schema order>
    tokens                                                         : int64

``tokens`` is re-derived by the record schema's token rule (:mod:`relgate.records.tokens`).

Canonical record stream (what ``logicalDigest`` is SHA-256 over)::

    lp("relgate.shard.records.v2", shardSchemaDigest, recordSchemaDigest)
    then, per record in shard order:
    lp(sampleId, sourceId, sourceVersion, contentDigest, split, *attributes, str(tokens))

where ``lp`` is the 4-byte big-endian length-prefixed encoding of
:mod:`relgate.integrity.tuples`, ``contentDigest`` is the snapshot's
``logicalContentDigest`` recomputed from the decoded content columns
(:func:`relgate.records.values.content_digests`) and ``attributes`` are the canonical
bytes (:mod:`relgate.records.values`) of the record columns that are neither the id nor
content.  Every record of a format has the same number of fields, so the stream parses
back uniquely (injective); content enters through its SHA-256 digest, which binds it
just as well and lets the verifier hash each value once.  A record whose stored
``logicalContentDigest`` column disagrees with the recomputed one is a content
substitution and is counted separately.

Member set (what ``memberSetDigest`` is SHA-256 over): the shard's member tuples
``(sampleId, sourceId, sourceVersion, logicalContentDigest, split, schemaDigest)``
sorted by their encoding, each length-prefixed, concatenated.
"""

from __future__ import annotations

from functools import cached_property
from typing import Final, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from pydantic import StrictStr

from relgate.integrity.contract import Contract
from relgate.integrity.hashing import sha256_stream
from relgate.integrity.tuples import encode_fields
from relgate.records.record_schema import ID_COLUMN, FieldSpec, RecordSchema, TokenRule
from relgate.records.tokens import TokenizerBytes, token_counts
from relgate.records.values import Column, canonical_column, constant_column, content_digests

STREAM_NAME: Final = "relgate.shard.records.v2"
SHARD_SCHEMA_KIND: Final = "relgate.shard-schema.v2"
#: Columns that make a member tuple (schemaDigest comes from the snapshot).
TUPLE_COLUMNS: Final = ("sampleId", "sourceId", "sourceVersion", "logicalContentDigest", "split")
TOKENS_COLUMN: Final = "tokens"
#: Parquet key-value metadata key holding the shard schema digest in every shard footer.
SCHEMA_METADATA_KEY: Final = b"relgate.recordSchema"


class ShardSchema(Contract):
    """The document a release root's ``recordSchema`` is the digest of: the record schema
    it carries, the shard columns around it and the stream that binds them."""

    kind: Literal["relgate.shard-schema.v2"] = SHARD_SCHEMA_KIND
    records: RecordSchema
    fields: tuple[FieldSpec, ...]
    stream: StrictStr = STREAM_NAME


class ShardFormat:
    """Shard records of one record schema: their Arrow schema, digests and stream."""

    def __init__(self, records: RecordSchema) -> None:
        self.records = records

    @cached_property
    def document(self) -> ShardSchema:
        tuple_fields = [FieldSpec(name=c, type="string") for c in TUPLE_COLUMNS]
        own = [f for f in self.records.fields if f.name != ID_COLUMN]
        tokens = FieldSpec(name=TOKENS_COLUMN, type="int64")
        return ShardSchema(records=self.records, fields=(*tuple_fields, *own, tokens))

    @cached_property
    def digest(self) -> str:
        """The ``recordSchema`` of a release root cut in this format."""
        return self.document.digest()

    @cached_property
    def arrow_schema(self) -> pa.Schema:
        return pa.schema([f.arrow_field for f in self.document.fields])

    @property
    def columns(self) -> tuple[str, ...]:
        return tuple(self.arrow_schema.names)

    @property
    def token_rule(self) -> TokenRule:
        return self.records.tokens

    @cached_property
    def header(self) -> bytes:
        return encode_fields([STREAM_NAME, self.digest, self.records.digest()])

    def content_digests(self, table: pa.Table) -> Column:
        """``logicalContentDigest`` recomputed from the decoded content columns."""
        return content_digests(table, self.records)

    def token_counts(self, table: pa.Table, fetch: TokenizerBytes | None) -> pa.Array:
        return token_counts(table, self.records.tokens, fetch)

    def stream_columns(
        self, table: pa.Table, recomputed_content: Column | None = None
    ) -> list[Column]:
        """The fields of one canonical record-stream entry, as columns (see the module
        docstring): each row's entry is their tuple encoding."""
        content = (
            recomputed_content if recomputed_content is not None else self.content_digests(table)
        )
        attributes = [
            canonical_column(table.column(name), self.records.field(name))
            for name in self.records.attributes
        ]
        return [
            table.column("sampleId"),
            table.column("sourceId"),
            table.column("sourceVersion"),
            content,
            table.column("split"),
            *attributes,
            pc.cast(table.column(TOKENS_COLUMN), pa.string()),
        ]

    def logical_digest(self, table: pa.Table, recomputed_content: Column | None = None) -> str:
        """SHA-256 over the canonical record stream of ``table`` in its row order (hashed
        from the columns' own buffers: the stream is never built)."""
        columns = self.stream_columns(table, recomputed_content)
        return "sha256:" + sha256_stream(*columns, header=self.header).hex()


#: What the member-set digest's hash starts with (before the sorted member tuples).
MEMBERS_HEADER = b"relgate.shard.members.v1\x00"


def _member_columns(
    table: pa.Table, schema_digest: str, content: Column | None
) -> tuple[list[Column], Column]:
    """The five varying member fields, and the record-schema column (the same on every row)."""
    digest_col = content if content is not None else table.column("logicalContentDigest")
    schema_col = constant_column(schema_digest, table.num_rows)
    varying = [
        table.column("sampleId"),
        table.column("sourceId"),
        table.column("sourceVersion"),
        digest_col,
        table.column("split"),
    ]
    return varying, schema_col


def encoding_order(columns: list[Column]) -> np.ndarray:
    """Row numbers in the order of the rows' tuple encodings, compared as bytes.

    Two encodings first differ in some field: either in its 4-byte big-endian length (which
    orders as the length does) or, at equal lengths, in its bytes.  So sorting by (length,
    bytes) of each field in turn is sorting by the encoding; rows equal in every key have
    equal encodings, so their relative order does not change any hash over them.
    """
    keys: dict[str, Column] = {}
    for i, column in enumerate(columns):
        binary = pc.cast(column, pa.large_binary())
        keys[f"len{i}"] = pc.binary_length(binary)
        keys[f"val{i}"] = binary
    order = pc.sort_indices(pa.table(keys), sort_keys=[(k, "ascending") for k in keys])
    ordered: np.ndarray = order.to_numpy()
    return ordered


def member_set_digest(table: pa.Table, schema_digest: str, content: Column | None = None) -> str:
    """SHA-256 over the shard's member tuples, sorted by their encoding (order-free).

    The record-schema field is the same on every row, so the five varying fields decide
    the order; the tuples are hashed from the columns' buffers in that order, never built."""
    varying, schema_col = _member_columns(table, schema_digest, content)
    order = encoding_order(varying)
    return "sha256:" + sha256_stream(*varying, schema_col, order=order, header=MEMBERS_HEADER).hex()


def shard_id(index: int, total: int) -> str:
    return f"shard-{index:05d}-of-{total:05d}"
