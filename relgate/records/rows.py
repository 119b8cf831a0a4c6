"""Rows from JSON records, typed by a record schema, every value checked before use.

JSON-lines sources (object prefixes, CDC logs) carry records as JSON objects with ``id``
and one member per record column.  Each value must already have its column's type: a
string for ``string``, base64 (RFC 4648, padded, canonical) for ``binary``, an integer
in range for an integer column (never a boolean), a number for a float, a boolean for
``bool``, an array of in-range integers for ``list<int>``; ``null`` or an absent member
only where the column is nullable.  Anything else refuses the build (exit 3) naming the
source, object version and line: nothing is coerced.
"""

from __future__ import annotations

import base64
import binascii
import math
from collections.abc import Callable, Mapping

import numpy as np
import pyarrow as pa

from relgate.errors import RejectedError
from relgate.integrity.contract import JsonValue
from relgate.records.record_schema import ID_COLUMN, FieldSpec, RecordSchema, arrow_type

#: The check a refused source row reports.
ROW_CHECK = "source-row"


def row_error(where: str, why: str, **details: object) -> RejectedError:
    """A source row that cannot be admitted: the build is refused (exit 3) naming it."""
    return RejectedError(
        f"source row refused: {why}", object=where, check=ROW_CHECK, details=details
    )


def _text(value: JsonValue) -> str | None:
    if not isinstance(value, str):
        return None
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        return None
    return value


def _binary(value: JsonValue) -> bytes | None:
    if not isinstance(value, str) or not value.isascii():
        return None
    try:
        data = base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        return None
    return data if base64.b64encode(data).decode() == value else None


def _integer(dtype: pa.DataType) -> Callable[[JsonValue], int | None]:
    info = np.iinfo(dtype.to_pandas_dtype())

    def check(value: JsonValue) -> int | None:
        if isinstance(value, bool) or not isinstance(value, int):
            return None
        return value if info.min <= value <= info.max else None

    return check


def _float(value: JsonValue) -> float | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    number = float(value)
    return number if math.isfinite(number) else None


def _boolean(value: JsonValue) -> bool | None:
    return value if isinstance(value, bool) else None


def _scalar_check(dtype: pa.DataType) -> Callable[[JsonValue], object | None]:
    if pa.types.is_string(dtype) or pa.types.is_large_string(dtype):
        return _text
    if pa.types.is_binary(dtype) or pa.types.is_large_binary(dtype):
        return _binary
    if pa.types.is_boolean(dtype):
        return _boolean
    if pa.types.is_floating(dtype):
        return _float
    return _integer(dtype)


def value_check(spec: FieldSpec) -> Callable[[JsonValue], object | None]:
    """A function giving the typed value of a JSON value, or None when it does not fit."""
    dtype = arrow_type(spec.type)
    if not (pa.types.is_list(dtype) or pa.types.is_large_list(dtype)):
        return _scalar_check(dtype)
    item = _scalar_check(dtype.value_type)

    def check_list(value: JsonValue) -> list[object] | None:
        if not isinstance(value, list):
            return None
        items = [item(v) for v in value]
        return None if any(i is None for i in items) else items

    return check_list


class RowBuilder:
    """Collects checked records column by column; :meth:`table` gives the Arrow batch."""

    def __init__(self, schema: RecordSchema) -> None:
        self.schema = schema
        self._fields = [f for f in schema.fields if f.name != ID_COLUMN]
        self._checks = [value_check(f) for f in self._fields]
        self._columns: dict[str, list[object]] = {f.name: [] for f in schema.fields}
        self._versions: list[str] = []

    def check(self, record: Mapping[str, JsonValue], where: str) -> list[object]:
        """The typed values of a record's columns (id aside); refused naming ``where``."""
        return [
            self._value(spec, check, record, where)
            for spec, check in zip(self._fields, self._checks, strict=True)
        ]

    def add(
        self, sample_id: str, record: Mapping[str, JsonValue], version: str, where: str
    ) -> None:
        """One record (``sample_id`` already validated); refused naming ``where``."""
        values = self.check(record, where)
        self._columns[ID_COLUMN].append(sample_id)
        for spec, value in zip(self._fields, values, strict=True):
            self._columns[spec.name].append(value)
        self._versions.append(version)

    @staticmethod
    def _value(
        spec: FieldSpec,
        check: Callable[[JsonValue], object | None],
        record: Mapping[str, JsonValue],
        where: str,
    ) -> object:
        value = record.get(spec.name)
        if value is None:
            if spec.nullable:
                return None
            raise row_error(where, f"field {spec.name!r} is missing or null")
        typed = check(value)
        if typed is None:
            raise row_error(where, f"field {spec.name!r} is not a valid {spec.type}")
        return typed

    def __len__(self) -> int:
        return len(self._versions)

    def table(self) -> pa.Table:
        schema = self.schema.arrow_schema()
        arrays = [pa.array(self._columns[f.name], arrow_type(f.type)) for f in self.schema.fields]
        return pa.Table.from_arrays([*arrays, pa.array(self._versions, pa.string())], schema=schema)
