"""The logical record schema shared by sources, snapshots and shard releases.

Every source yields rows ``(sampleId, lang, text, sourceVersion)``.  A record's
``logicalContentDigest`` is SHA-256 over the length-prefixed encoding of
``(schema name, lang, text)`` after the transform: it names the content, not the id, so
the same text under two ids (or a benchmark item) has the same digest.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa

from relgate.integrity.canonical import canonical_bytes
from relgate.integrity.digests import sha256_digest
from relgate.integrity.hashing import (
    digests_to_strings,
    sha256_fields,
)
from relgate.integrity.tuples import encode_fields

RECORD_SCHEMA_NAME = "relgate.text.v1"

RECORD_SCHEMA = {
    "name": RECORD_SCHEMA_NAME,
    "fields": [
        {"name": "sampleId", "type": "string", "nullable": False},
        {"name": "lang", "type": "string", "nullable": False},
        {"name": "text", "type": "string", "nullable": False},
    ],
    "contentDigest": "sha256(len32be-prefixed(schema name, lang, text))",
}

#: The columns a source batch carries into selection.
SOURCE_ARROW_SCHEMA = pa.schema(
    [
        ("sampleId", pa.string()),
        ("lang", pa.string()),
        ("text", pa.string()),
        ("sourceVersion", pa.string()),
    ]
)


def record_schema_digest() -> str:
    return sha256_digest(canonical_bytes(RECORD_SCHEMA))


def content_digest(lang: str, text: str) -> str:
    return sha256_digest(encode_fields([RECORD_SCHEMA_NAME, lang, text]))


def content_digests(
    lang: pa.Array | pa.ChunkedArray, text: pa.Array | pa.ChunkedArray
) -> pa.Array | pa.ChunkedArray:
    """Vectorised :func:`content_digest` over two columns."""
    name = constant_column(RECORD_SCHEMA_NAME, len(lang))
    return digests_to_strings(sha256_fields(name, lang, text))


def constant_column(value: str, rows: int) -> pa.Array:
    """``value`` repeated ``rows`` times as a string column (no per-row Python object)."""
    return pa.array([value], pa.string()).take(np.zeros(rows, dtype=np.int64))
