"""Replay comparators: how a replayed canary is judged against its reference.

Both comparators key rows by ``sampleId`` and require the two id sets to be equal.
``relgate.replay.exact`` v1 then requires every other column to be equal.
``relgate.replay.numeric`` v1 allows numeric columns (Arrow integer, floating and decimal
types) to differ by at most an absolute ``tolerance``; every other column (the digest of
the non-numeric content in a fingerprint) must still be equal.  A tolerance is a plain
decimal string (``"0.001"``), never a float, so the signed report stays RFC 8785 clean.

A *fingerprint* is what numeric comparison needs of a record and nothing more: the
sampleId, the numeric content columns' values (content as the snapshot's
:class:`~relgate.records.record_schema.RecordSchema` declares it), and the SHA-256 of the
length-prefixed canonical bytes of the other content columns (:data:`OTHER_CONTENT`).
It never holds text.
"""

from __future__ import annotations

import hashlib
import io
import re
from collections.abc import Sequence
from decimal import Decimal, InvalidOperation
from typing import Final, Literal

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from pydantic import StrictInt, StrictStr

from relgate.errors import RejectedError, UsageError
from relgate.integrity.contract import Contract
from relgate.integrity.hashing import digests_to_strings, sha256_fields
from relgate.records.record_schema import RecordSchema
from relgate.records.values import canonical_column

EXACT: Final = "relgate.replay.exact"
NUMERIC: Final = "relgate.replay.numeric"
#: The version of each comparator's rule (bumped when the rule changes meaning).
VERSIONS: Final = {EXACT: 1, NUMERIC: 1}
#: The fingerprint column naming the digest of the non-numeric content.
OTHER_CONTENT: Final = "otherContentDigest"
#: The refusal check of a malformed tolerance or comparator name.
TOLERANCE_CHECK: Final = "replay-tolerance"
#: The refusal check of a replay whose reference (fingerprint) is missing or unusable.
REFERENCE_CHECK: Final = "replay-reference"
#: Mismatching ids a comparison names (sampleIds only, never content).
EXAMPLE_LIMIT = 10
_FINGERPRINT_PREFIX = b"relgate.fingerprint.v1\x00"
_PLAIN_DECIMAL = re.compile(r"(0|[1-9][0-9]*)(\.[0-9]+)?")


def tolerance_text(value: str) -> str:
    """The canonical decimal spelling of a non-negative tolerance (``"1.50"`` -> ``"1.5"``,
    ``"0.000"`` -> ``"0"``); exponents, signs, NaN and infinities are refused."""
    text = value.strip()
    if not _PLAIN_DECIMAL.fullmatch(text):
        raise UsageError(
            f"tolerance {value!r} is not a plain non-negative decimal",
            object="tolerance",
            check=TOLERANCE_CHECK,
        )
    try:
        number = Decimal(text)
    except InvalidOperation:  # pragma: no cover - the pattern admits only decimals
        raise UsageError("bad tolerance", object="tolerance", check=TOLERANCE_CHECK) from None
    if number == 0:
        return "0"
    spelled = format(number.normalize(), "f")
    return spelled


def numeric_type(dtype: pa.DataType) -> bool:
    """Whether values of an Arrow type are compared with a tolerance."""
    return bool(
        pa.types.is_integer(dtype) or pa.types.is_floating(dtype) or pa.types.is_decimal(dtype)
    )


class Comparator(Contract):
    """The comparator a replay report names: its name, rule version and tolerance."""

    name: Literal["relgate.replay.exact", "relgate.replay.numeric"]
    version: StrictInt
    #: Absolute, as a canonical decimal string; always ``"0"`` for the exact comparator.
    tolerance: StrictStr

    @classmethod
    def of(cls, name: str, tolerance: str | None = None) -> Comparator:
        """A known comparator at its current version (tolerance ``"0"`` unless given)."""
        if name not in VERSIONS:
            raise UsageError(
                f"unknown comparator {name!r}; known: {sorted(VERSIONS)}",
                object="comparator",
                check=TOLERANCE_CHECK,
            )
        text = tolerance_text("0" if tolerance is None else tolerance)
        if name == EXACT and text != "0":
            raise UsageError(
                "the exact comparator has no tolerance", object="comparator", check=TOLERANCE_CHECK
            )
        return cls.model_validate({"name": name, "version": VERSIONS[name], "tolerance": text})

    @property
    def numeric(self) -> bool:
        return self.name == NUMERIC


class ReplayHashes(Contract):
    """Replay hashes (:class:`ContentHasher`) of the stored and the recomputed members."""

    expected: StrictStr
    replayed: StrictStr


class Comparison(Contract):
    """What one comparison found; ``examples`` are mismatching sampleIds only."""

    expected_ids: StrictInt
    replayed_ids: StrictInt
    missing: StrictInt
    extra: StrictInt
    mismatching: StrictInt
    numeric_columns: tuple[StrictStr, ...]
    examples: tuple[StrictStr, ...]

    @property
    def identical(self) -> bool:
        return not (self.missing or self.extra or self.mismatching)


def numeric_columns(schema: pa.Schema, content: Sequence[str]) -> tuple[str, ...]:
    """The content columns whose Arrow type is numeric, in schema order."""
    wanted = set(content)
    return tuple(f.name for f in schema if f.name in wanted and numeric_type(f.type))


def fingerprint(table: pa.Table, schema: RecordSchema) -> pa.Table:
    """``sampleId``, the numeric content columns, and the digest of the other content
    columns (their canonical value bytes, :func:`relgate.records.values.canonical_column`),
    sorted by sampleId; never any text.  Numeric is decided by the frame's Arrow types."""
    content = schema.content
    numeric = numeric_columns(table.schema, content)
    others = [c for c in content if c not in numeric]
    n = table.num_rows
    if others and n:
        columns = [canonical_column(table.column(c), schema.field(c)) for c in others]
        digests = digests_to_strings(sha256_fields(*columns, prefix=_FINGERPRINT_PREFIX))
    else:
        digests = pa.array([""] * n, pa.string())
    out = table.select(["sampleId", *numeric]).append_column(OTHER_CONTENT, digests)
    return out.sort_by("sampleId").combine_chunks()


def fingerprint_parquet(table: pa.Table) -> bytes:
    """Deterministic parquet bytes of a fingerprint table."""
    sink = io.BytesIO()
    pq.write_table(table, sink, compression="zstd", store_schema=True)
    return sink.getvalue()


def read_fingerprint(data: bytes, *, subject: str) -> pa.Table:
    """A stored fingerprint, refused unless it has ``sampleId`` and the digest column."""
    try:
        table = pq.read_table(io.BytesIO(data))
    except (pa.ArrowException, OSError) as exc:
        raise RejectedError(
            f"fingerprint is not readable parquet: {exc}", object=subject, check="fingerprint"
        ) from None
    if "sampleId" not in table.column_names or OTHER_CONTENT not in table.column_names:
        raise RejectedError(
            "fingerprint lacks its key columns", object=subject, check="fingerprint"
        )
    return table


def _frame(table: pa.Table) -> pl.DataFrame:
    frame = pl.from_arrow(table)
    if not isinstance(frame, pl.DataFrame):  # a Table always gives a DataFrame
        raise TypeError(f"polars gave {type(frame).__name__} for an arrow table")
    return frame


def _differs(comparator: Comparator, column: str, numeric: bool) -> pl.Expr:
    a, b = pl.col(column), pl.col(f"{column}_replayed")
    if not (numeric and comparator.numeric):
        return ~a.eq_missing(b)
    tolerance = float(Decimal(comparator.tolerance))
    a64, b64 = a.cast(pl.Float64), b.cast(pl.Float64)
    same_special = (a64.is_nan() & b64.is_nan()) | (a64.is_infinite() & a64.eq(b64))
    both_null = a.is_null() & b.is_null()
    close = (a64 - b64).abs() <= tolerance
    return ~(both_null | same_special | close.fill_null(value=False))


def compare(
    comparator: Comparator, expected: pa.Table, replayed: pa.Table, *, limit: int = EXAMPLE_LIMIT
) -> Comparison:
    """Compare two tables keyed by ``sampleId`` with the same other columns."""
    if set(expected.column_names) != set(replayed.column_names):
        raise RejectedError(
            "reference and replay have different columns",
            object="replay",
            check=REFERENCE_CHECK,
            details={"expected": expected.column_names, "replayed": replayed.column_names},
        )
    numeric = set(numeric_columns(expected.schema, expected.column_names))
    a, b = _frame(expected), _frame(replayed)
    joined = a.join(b, on="sampleId", how="full", suffix="_replayed", coalesce=True)
    in_a = pl.col("sampleId").is_in(a["sampleId"].implode())
    in_b = pl.col("sampleId").is_in(b["sampleId"].implode())
    both = joined.filter(in_a & in_b)
    value_columns = [c for c in expected.column_names if c != "sampleId"]
    differs = pl.any_horizontal([_differs(comparator, c, c in numeric) for c in value_columns])
    bad = both.filter(differs) if value_columns else both.clear()
    missing = joined.filter(~in_b)
    extra = joined.filter(~in_a)
    examples = pl.concat([missing["sampleId"], extra["sampleId"], bad["sampleId"]]).sort()
    return Comparison(
        expected_ids=a["sampleId"].n_unique(),
        replayed_ids=b["sampleId"].n_unique(),
        missing=missing.height,
        extra=extra.height,
        mismatching=bad.height,
        numeric_columns=tuple(c for c in expected.column_names if c in numeric),
        examples=tuple(examples.head(limit).to_list()),
    )


class ContentHasher:
    """A replay hash: SHA-256 over the ``logicalContentDigest`` values in sampleId order,
    newline-separated, fed chunk by chunk."""

    def __init__(self) -> None:
        self._sha = hashlib.sha256()
        self._first = True

    def add(self, digests: Sequence[str]) -> None:
        if not digests:
            return
        text = "\n".join(digests)
        self._sha.update((text if self._first else "\n" + text).encode())
        self._first = False

    def add_series(self, digests: pl.Series) -> None:
        """:meth:`add` over a polars string column (joined without a Python list)."""
        if not digests.len():
            return
        text = str(digests.str.join("\n").item())
        self._sha.update((text if self._first else "\n" + text).encode())
        self._first = False

    @property
    def hexdigest(self) -> str:
        return "sha256:" + self._sha.hexdigest()


def content_hash(digests: Sequence[str]) -> str:
    """:class:`ContentHasher` over one sequence."""
    hasher = ContentHasher()
    hasher.add(digests)
    return hasher.hexdigest
