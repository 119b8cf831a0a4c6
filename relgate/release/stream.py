"""The shard record schema and the canonical record stream of a shard release.

This module is the one definition the writer and the independent verifier share: what a
shard record is, how its token count is derived, and which bytes the descriptor's
``logicalDigest`` and ``memberSetDigest`` are computed over.  Everything else (reading
sources, sharding, staging, decoding stored bytes, diffing sets) lives on one side only.

Shard record (parquet columns, in this order, none nullable)::

    sampleId, sourceId, sourceVersion, logicalContentDigest, split, lang, text : string
    tokens                                                                     : int64

``tokens`` is a deliberately simple, deterministic count: the number of maximal runs of
bytes of ``text`` above 0x20, i.e. separated by spaces and ASCII control characters (tab
and newlines among them); it sizes a release and is re-counted by the verifier, it is not
a model tokenizer.

Canonical record stream (what ``logicalDigest`` is SHA-256 over)::

    lp("relgate.shard.records.v1", recordSchemaDigest, contentSchemaDigest)
    then, per record in shard order:
    lp(sampleId, sourceId, sourceVersion, contentDigest(lang, text), split, lang, str(tokens))

where ``lp`` is the 4-byte big-endian length-prefixed encoding of :mod:`relgate.integrity.tuples`
and ``contentDigest`` is the snapshot's ``logicalContentDigest`` function
(:func:`relgate.sources.schema.content_digest`) recomputed from the decoded ``lang`` and
``text``.  Every record has exactly seven length-prefixed fields, so the stream parses
back uniquely (injective); the text enters through its SHA-256 content digest, which
binds it just as well and lets the verifier hash each text once instead of twice.  A
record whose stored ``logicalContentDigest`` column disagrees with the recomputed one is
a content substitution and is counted separately.

Member set (what ``memberSetDigest`` is SHA-256 over): the shard's member tuples
``(sampleId, sourceId, sourceVersion, logicalContentDigest, split, schemaDigest)``
sorted by their encoding, each length-prefixed, concatenated.
"""

from __future__ import annotations

import hashlib
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from relgate.integrity.canonical import canonical_bytes
from relgate.integrity.digests import sha256_digest
from relgate.integrity.hashing import (
    digests_to_strings,
    length_prefixed,
    sha256_fields,
)
from relgate.integrity.tuples import encode_fields
from relgate.sources.schema import RECORD_SCHEMA_NAME, content_digest, record_schema_digest

STREAM_NAME = "relgate.shard.records.v1"
SHARD_RECORD_SCHEMA_NAME = "relgate.shard.text.v1"

#: Columns that make a member tuple (schemaDigest comes from the snapshot).
TUPLE_COLUMNS = ("sampleId", "sourceId", "sourceVersion", "logicalContentDigest", "split")

SHARD_ARROW_SCHEMA = pa.schema(
    [
        pa.field("sampleId", pa.string(), nullable=False),
        pa.field("sourceId", pa.string(), nullable=False),
        pa.field("sourceVersion", pa.string(), nullable=False),
        pa.field("logicalContentDigest", pa.string(), nullable=False),
        pa.field("split", pa.string(), nullable=False),
        pa.field("lang", pa.string(), nullable=False),
        pa.field("text", pa.string(), nullable=False),
        pa.field("tokens", pa.int64(), nullable=False),
    ]
)
COLUMNS = tuple(SHARD_ARROW_SCHEMA.names)

#: Parquet key-value metadata key holding the record schema digest in every shard footer.
SCHEMA_METADATA_KEY = b"relgate.recordSchema"


def shard_record_schema() -> dict[str, Any]:
    return {
        "name": SHARD_RECORD_SCHEMA_NAME,
        "fields": [
            {"name": f.name, "type": str(f.type), "nullable": f.nullable}
            for f in SHARD_ARROW_SCHEMA
        ],
        "contentSchema": record_schema_digest(),
        "contentDigest": f"sha256(len32be-prefixed({RECORD_SCHEMA_NAME!r}, lang, text))",
        "tokens": "count of maximal runs of UTF-8 bytes of text above 0x20",
        "stream": STREAM_NAME,
    }


def shard_record_schema_digest() -> str:
    """The ``recordSchema`` of a shard release root: pins columns, types and derivations."""
    return sha256_digest(canonical_bytes(shard_record_schema()))


#: Token separators: bytes 0x00-0x20 (space and the ASCII controls, tab and newlines
#: among them); the ``normalize`` transform already folds Unicode whitespace into spaces.
_SEPARATOR_MAX = 0x20


def _string_buffers(arr: pa.Array | pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """(offsets relative to the first row, data bytes) of a string column, zero-copy."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.type != pa.string():
        arr = pc.cast(arr, pa.large_string())
    width: Any = np.dtype(np.int32) if arr.type == pa.string() else np.dtype(np.int64)
    buffers = arr.buffers()
    n = len(arr)
    offsets = np.frombuffer(
        buffers[1], dtype=width, count=n + 1, offset=arr.offset * width.itemsize
    )
    offsets = offsets.astype(np.int64)
    if buffers[2] is None or n == 0:
        return np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.uint8)
    data = np.frombuffer(buffers[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    return offsets - offsets[0], data


def token_counts(text: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Per record: the number of maximal runs of bytes above 0x20 (see the module doc)."""
    offsets, data = _string_buffers(text)
    n = len(offsets) - 1
    if n == 0 or len(data) == 0:
        return pa.array(np.zeros(n, dtype=np.int64), pa.int64())
    word = data > _SEPARATOR_MAX
    starts = np.empty_like(word)
    starts[0] = word[0]
    np.greater(word[1:], word[:-1], out=starts[1:])  # a word byte after a separator
    # A record's first byte starts a token whatever the previous record ended with.
    nonempty = offsets[:-1] < offsets[1:]
    firsts = offsets[:-1][nonempty]
    starts[firsts] = word[firsts]
    positions = np.flatnonzero(starts)
    counts = np.diff(np.searchsorted(positions, offsets, side="left")).astype(np.int64)
    return pa.array(counts, pa.int64())


#: ``lp(RECORD_SCHEMA_NAME)``: every content digest's message starts with it.
_CONTENT_PREFIX = encode_fields([RECORD_SCHEMA_NAME])


def content_digests(
    lang: pa.Array | pa.ChunkedArray, text: pa.Array | pa.ChunkedArray
) -> pa.Array | pa.ChunkedArray:
    """``logicalContentDigest`` recomputed from decoded content: the snapshot's function
    (:func:`relgate.sources.schema.content_digest`), one kernel call over the column."""
    packed = sha256_fields(lang, text, prefix=_CONTENT_PREFIX)
    return digests_to_strings(packed)


def stream_header() -> bytes:
    return encode_fields([STREAM_NAME, shard_record_schema_digest(), record_schema_digest()])


def _concat_data(arr: pa.Array) -> memoryview:
    """The concatenated bytes of every row of a (large_)binary array, zero-copy."""
    arr = pc.cast(arr, pa.large_binary())
    if len(arr) == 0:
        return memoryview(b"")
    buffers = arr.buffers()
    offsets = np.frombuffer(buffers[1], dtype=np.int64, count=len(arr) + 1, offset=arr.offset * 8)
    data = memoryview(buffers[2]) if buffers[2] is not None else memoryview(b"")
    return data[int(offsets[0]) : int(offsets[-1])]


def stream_rows(
    table: pa.Table, recomputed_content: pa.Array | pa.ChunkedArray | None = None
) -> pa.Array:
    """One canonical record-stream entry per row (see the module docstring)."""
    content = (
        recomputed_content
        if recomputed_content is not None
        else content_digests(table.column("lang"), table.column("text"))
    )
    return length_prefixed(
        table.column("sampleId"),
        table.column("sourceId"),
        table.column("sourceVersion"),
        content,
        table.column("split"),
        table.column("lang"),
        pc.cast(table.column("tokens"), pa.string()),
    )


def logical_digest(
    table: pa.Table, recomputed_content: pa.Array | pa.ChunkedArray | None = None
) -> str:
    """SHA-256 over the canonical record stream of ``table`` in its row order."""
    h = hashlib.sha256(stream_header())
    h.update(_concat_data(stream_rows(table, recomputed_content)))
    return "sha256:" + h.hexdigest()


def encode_stream(records: list[tuple[str, str, str, str, str, str, str, int]]) -> bytes:
    """Reference row-at-a-time encoding of the canonical record stream (``records`` are
    rows in :data:`COLUMNS` order); the vectorised :func:`logical_digest` must agree."""
    out = bytearray(stream_header())
    for sample_id, source_id, source_version, _stored, split, lang, text, tokens in records:
        out += encode_fields(
            [
                sample_id,
                source_id,
                source_version,
                content_digest(lang, text),
                split,
                lang,
                str(tokens),
            ]
        )
    return bytes(out)


def member_tuples(
    table: pa.Table, schema_digest: str, content: pa.Array | pa.ChunkedArray | None = None
) -> pa.Array:
    """Length-prefixed member tuples of ``table`` (content column overridable)."""
    digest_col = content if content is not None else table.column("logicalContentDigest")
    schema_col = pa.array([schema_digest] * table.num_rows, pa.string())
    return length_prefixed(
        table.column("sampleId"),
        table.column("sourceId"),
        table.column("sourceVersion"),
        digest_col,
        table.column("split"),
        schema_col,
    )


def member_set_digest(
    table: pa.Table, schema_digest: str, content: pa.Array | pa.ChunkedArray | None = None
) -> str:
    """SHA-256 over the shard's member tuples, sorted by their encoding (order-free)."""
    encoded = member_tuples(table, schema_digest, content)
    ordered = pc.take(encoded, pc.sort_indices(encoded))
    h = hashlib.sha256(b"relgate.shard.members.v1\x00")
    h.update(_concat_data(ordered))
    return "sha256:" + h.hexdigest()


def shard_id(index: int, total: int) -> str:
    return f"shard-{index:05d}-of-{total:05d}"


__all__ = [
    "COLUMNS",
    "SCHEMA_METADATA_KEY",
    "SHARD_ARROW_SCHEMA",
    "TUPLE_COLUMNS",
    "content_digests",
    "logical_digest",
    "member_set_digest",
    "member_tuples",
    "shard_id",
    "shard_record_schema",
    "shard_record_schema_digest",
    "token_counts",
]
