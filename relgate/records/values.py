"""Canonical bytes of record values, column at a time, and the logical content digest.

Each record value has exactly one byte encoding, whatever the Arrow layout it arrived in
(chunking, slicing, 32- or 64-bit offsets):

* ``string``/``large_string``: its UTF-8 bytes; ``binary``/``large_binary``: its bytes;
* ``bool``: one byte 0x00/0x01; integers and floats: their declared width, big-endian
  (floats as the IEEE 754 bits stored, so ``-0.0`` and ``0.0`` differ);
* ``list<T>``/``large_list<T>`` of a fixed-width ``T``: its elements' encodings
  concatenated (a ``list<uint32>`` of token ids is 4 bytes per id, big-endian);
* a value of a *nullable* column is prefixed with 0x01, and a null is the single byte
  0x00, so a null and an empty value never meet.

Values enter digests as fields of the length-prefixed tuple encoding, so concatenations
cannot collide.  ``logicalContentDigest = SHA-256(lp(schema name, *content values))``:
for the demo's ``relgate.text.v1`` that is ``lp(name, lang, text)`` as it always was.
Everything here is vectorised: no Python work per row.
"""

from __future__ import annotations

from typing import TypeAlias

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from relgate.errors import RejectedError
from relgate.integrity.hashing import digests_to_strings, sha256_fields
from relgate.integrity.tuples import encode_fields
from relgate.records.record_schema import CHECK, FIXED_TYPES, FieldSpec, RecordSchema, arrow_type

#: A column as Arrow hands it over: one array or chunks of one.
Column: TypeAlias = pa.Array | pa.ChunkedArray
_PRESENT = pa.scalar(b"\x01", pa.large_binary())
_ABSENT = pa.scalar(b"\x00", pa.large_binary())
_EMPTY = pa.scalar(b"", pa.large_binary())


def _array(column: Column) -> pa.Array:
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def _big_endian(values: np.ndarray) -> np.ndarray:
    return values.astype(values.dtype.newbyteorder(">"), copy=False)


def _fixed_bytes(column: pa.Array, dtype: pa.DataType) -> pa.Array:
    filled = column.fill_null(False if pa.types.is_boolean(dtype) else 0)
    if pa.types.is_boolean(dtype):
        filled = pc.cast(filled, pa.uint8())
    values = _big_endian(np.asarray(filled.to_numpy(zero_copy_only=False)))
    width = values.dtype.itemsize
    fixed = pa.Array.from_buffers(
        pa.binary(width), len(column), [None, pa.py_buffer(values.tobytes())]
    )
    return pc.cast(fixed, pa.large_binary())


def _list_bytes(column: pa.Array, dtype: pa.DataType) -> pa.Array:
    offsets = np.asarray(column.offsets.to_numpy(zero_copy_only=False), dtype=np.int64)
    child = column.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    if child.null_count:
        raise RejectedError("a list element is null", object=str(dtype), check=CHECK)
    values = _big_endian(np.asarray(child.to_numpy(zero_copy_only=False)))
    width = values.dtype.itemsize
    rebased = (offsets - offsets[0]) * width
    return pa.Array.from_buffers(
        pa.large_binary(),
        len(column),
        [None, pa.py_buffer(rebased.tobytes()), pa.py_buffer(values.tobytes())],
    )


def canonical_column(column: Column, spec: FieldSpec) -> pa.Array:
    """The canonical bytes of every value of one column, as ``large_binary``."""
    dtype = arrow_type(spec.type)
    arr = _array(column)
    if arr.type != dtype:
        arr = pc.cast(arr, dtype)
    if spec.type in FIXED_TYPES:
        out = _fixed_bytes(arr, dtype)
    elif pa.types.is_list(dtype) or pa.types.is_large_list(dtype):
        out = _list_bytes(arr, dtype)
    else:
        out = pc.cast(arr, pa.large_binary())
    if not spec.nullable:
        return out.fill_null(b"") if out.null_count else out
    valid = pc.is_valid(arr)
    marker = pc.if_else(valid, _PRESENT, _ABSENT)
    value = pc.if_else(valid, out, _EMPTY)
    return pc.binary_join_element_wise(marker, value, _EMPTY)


def canonical_value(value: object, spec: FieldSpec) -> bytes:
    """One value's canonical bytes (the reference the column path must agree with)."""
    encoded = canonical_column(pa.array([value], arrow_type(spec.type)), spec)
    return bytes(encoded[0].as_py())


def content_columns(table: pa.Table, schema: RecordSchema) -> list[pa.Array]:
    """The canonical bytes of the schema's content columns, in declared order."""
    return [canonical_column(table.column(c), schema.field(c)) for c in schema.content]


def content_digests_packed(table: pa.Table, schema: RecordSchema) -> bytes:
    """Packed 32-byte ``logicalContentDigest`` of every row (one kernel call)."""
    prefix = encode_fields([schema.name])
    return sha256_fields(*content_columns(table, schema), prefix=prefix)


def content_digests(table: pa.Table, schema: RecordSchema) -> pa.Array | pa.ChunkedArray:
    """``sha256:<hex>`` ``logicalContentDigest`` of every row of ``table``."""
    return digests_to_strings(content_digests_packed(table, schema))


def content_digest(record: dict[str, object], schema: RecordSchema) -> str:
    """One record's ``logicalContentDigest`` (row-at-a-time reference)."""
    table = pa.Table.from_pylist(
        [{c: record[c] for c in schema.content}],
        schema=pa.schema([schema.field(c).arrow_field for c in schema.content]),
    )
    return str(content_digests(table, schema)[0].as_py())


def constant_column(value: str, rows: int) -> pa.Array:
    """``value`` repeated ``rows`` times as a string column (no per-row Python object)."""
    return pa.array([value], pa.string()).take(np.zeros(rows, dtype=np.int64))
