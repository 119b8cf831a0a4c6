"""Token counts of records, by the rule their record schema declares.

``token-ids`` counts the ids a record stores (exact); ``tokenizer`` runs a pinned
``tokenizers`` tokenizer (a JSON file named by its SHA-256, loaded from the workspace
store and checked against the digest before use; nothing is downloaded) over a text
column; ``whitespace-runs`` counts maximal runs of bytes above 0x20; ``none`` is 0.
The writer and the independent verifier both count with :func:`token_counts`, so a
shard's ``tokens`` column is re-derived, never trusted.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from functools import lru_cache
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from tokenizers import Tokenizer

from relgate.errors import IntegrityError, RejectedError
from relgate.integrity.kernel import word_runs
from relgate.records.record_schema import CHECK, TokenRule
from relgate.records.values import Column

#: Fetches the bytes of a tokenizer JSON by digest (the caller checks nothing; we do).
TokenizerBytes = Callable[[str], bytes]
#: Token separators for ``whitespace-runs``: bytes 0x00-0x20.
_SEPARATOR_MAX = 0x20
#: Texts per ``encode_batch`` call (bounded transient memory).
_ENCODE_BATCH = 65_536


def _string_buffers(arr: Column) -> tuple[np.ndarray, np.ndarray]:
    """(offsets relative to the first row, data bytes) of a string column, zero-copy."""
    if isinstance(arr, pa.ChunkedArray):
        arr = arr.combine_chunks()
    if arr.type not in (pa.string(), pa.large_string()):
        arr = pc.cast(arr, pa.large_string())
    width: Any = np.dtype(np.int32) if arr.type == pa.string() else np.dtype(np.int64)
    buffers = arr.buffers()
    n = len(arr)
    offsets = np.frombuffer(
        buffers[1], dtype=width, count=n + 1, offset=arr.offset * width.itemsize
    ).astype(np.int64)
    if buffers[2] is None or n == 0:
        return np.zeros(n + 1, dtype=np.int64), np.zeros(0, dtype=np.uint8)
    data = np.frombuffer(buffers[2], dtype=np.uint8)[offsets[0] : offsets[-1]]
    return offsets - offsets[0], data


def whitespace_runs(text: Column) -> pa.Array:
    """Per record: the number of maximal runs of bytes above 0x20 (one native pass)."""
    offsets, data = _string_buffers(text)
    return pa.array(word_runs(data, offsets, _SEPARATOR_MAX), pa.int64())


def token_id_counts(ids: Column) -> pa.Array:
    """Per record: how many token ids it stores."""
    arr = ids.combine_chunks() if isinstance(ids, pa.ChunkedArray) else ids
    return pc.cast(pc.list_value_length(arr).fill_null(0), pa.int64())


@lru_cache(maxsize=8)
def _tokenizer(digest: str, data: bytes) -> Tokenizer:
    return Tokenizer.from_str(data.decode("utf-8"))


def load_tokenizer(digest: str, fetch: TokenizerBytes) -> Tokenizer:
    """The tokenizer a digest pins: fetched, hashed, refused unless the bytes match."""
    data = fetch(digest)
    actual = "sha256:" + hashlib.sha256(data).hexdigest()
    if actual != digest:
        raise IntegrityError(
            "tokenizer bytes do not match the pinned digest",
            object="tokenizer",
            check="tokenizer-digest",
            digest=digest,
            details={"actual": actual},
        )
    try:
        return _tokenizer(digest, data)
    except (
        UnicodeDecodeError,
        ValueError,
        Exception,
    ) as exc:  # tokenizers raises a bare Exception on malformed JSON
        raise RejectedError(
            f"tokenizer does not load: {exc}", object="tokenizer", check=CHECK, digest=digest
        ) from None


def tokenizer_counts(text: Column, tokenizer: Tokenizer) -> pa.Array:
    """Per record: the number of ids ``tokenizer`` gives its text (no special tokens)."""
    arr = text.combine_chunks() if isinstance(text, pa.ChunkedArray) else text
    counts = np.zeros(len(arr), dtype=np.int64)
    for start in range(0, len(arr), _ENCODE_BATCH):
        texts = arr.slice(start, _ENCODE_BATCH).to_pylist()
        encoded = tokenizer.encode_batch(texts, add_special_tokens=False)
        counts[start : start + len(texts)] = [len(e.ids) for e in encoded]
    return pa.array(counts, pa.int64())


def token_counts(table: pa.Table, rule: TokenRule, fetch: TokenizerBytes | None) -> pa.Array:
    """The ``tokens`` column of ``table`` under ``rule``."""
    if rule.kind == "none" or rule.column is None:
        return pa.array(np.zeros(table.num_rows, dtype=np.int64), pa.int64())
    column = table.column(rule.column)
    if rule.kind == "token-ids":
        return token_id_counts(column)
    if rule.kind == "whitespace-runs":
        return whitespace_runs(column)
    if fetch is None or rule.tokenizer is None:
        raise RejectedError(
            "records declare a tokenizer but none can be loaded here",
            object="tokenizer",
            check="tokenizer-digest",
            digest=rule.tokenizer or "",
        )
    return tokenizer_counts(column, load_tokenizer(rule.tokenizer, fetch))
