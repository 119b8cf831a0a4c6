"""The data a transform exchanges: an Arrow IPC file in, an Arrow IPC stream (or file) out.

relgate writes every record batch the transform should see to one IPC file (standard
32-bit-offset types, no schema metadata, ``sourceId`` appended), runs the transform once,
and then reads the output as hostile: it must be a readable IPC file or stream no larger
than a bound, whose schema is exactly the input schema, with no more rows than the input,
and whose record identities (``sourceId``, ``sampleId``, ``sourceVersion`` where present)
each occur at most as often as in the input: a transform may drop or rewrite records,
never invent members.  Columns are passed through whatever they are (text, token ids,
binary); only the identity columns are looked at.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import polars as pl
import pyarrow as pa

from relgate.errors import RejectedError
from relgate.transforms import refusals

#: The columns that identify a record (those the input has).
ID_COLUMNS: Final = ("sourceId", "sampleId", "sourceVersion")
SOURCE_COLUMN: Final = "sourceId"
#: The output may be at most this many times the input's bytes (plus the slack).
OUTPUT_FACTOR: Final = 4
OUTPUT_SLACK: Final = 64 * 1024 * 1024


def narrow_type(dtype: pa.DataType) -> pa.DataType:
    """The standard (32-bit offset, non-view) spelling of a type, recursively."""
    if pa.types.is_large_string(dtype) or pa.types.is_string_view(dtype):
        return pa.string()
    if pa.types.is_large_binary(dtype) or pa.types.is_binary_view(dtype):
        return pa.binary()
    if (
        pa.types.is_large_list(dtype)
        or pa.types.is_list_view(dtype)
        or pa.types.is_large_list_view(dtype)
    ):
        return pa.list_(narrow_field(dtype.value_field))
    if pa.types.is_list(dtype):
        return pa.list_(narrow_field(dtype.value_field))
    if pa.types.is_struct(dtype):
        return pa.struct([narrow_field(dtype.field(i)) for i in range(dtype.num_fields)])
    return dtype


def narrow_field(field: pa.Field) -> pa.Field:
    return pa.field(field.name, narrow_type(field.type), nullable=field.nullable)


def narrow_schema(schema: pa.Schema) -> pa.Schema:
    """What the transform sees: standard types, every field as given, no metadata."""
    return pa.schema([narrow_field(f) for f in schema])


def narrow(table: pa.Table) -> pa.Table:
    return table.cast(narrow_schema(table.schema))


class InputFile:
    """The transform's input, written batch by batch (one schema for the whole file)."""

    def __init__(self, path: Path, what: str) -> None:
        self.path = path
        self.what = what
        self.rows = 0
        self.schema: pa.Schema | None = None
        self._sink: pa.NativeFile | None = None
        self._writer: pa.ipc.RecordBatchFileWriter | None = None

    def write(self, table: pa.Table) -> None:
        table = narrow(table)
        if self._writer is None:
            self.schema = table.schema
            self._sink = pa.OSFile(str(self.path), "wb")
            self._writer = pa.ipc.new_file(self._sink, table.schema)
        elif not table.schema.equals(self.schema):
            raise RejectedError(
                "sources of one build have different record schemas",
                object=self.what,
                check=refusals.SCHEMA,
                details={"first": str(self.schema), "next": str(table.schema)},
            )
        self._writer.write_table(table)
        self.rows += table.num_rows

    def close(self, schema: pa.Schema) -> pa.Schema:
        """Finish the file (an empty one with ``schema`` if nothing was written)."""
        if self._writer is None:
            self.write(schema.empty_table())
        if self._writer is not None and self._sink is not None:
            self._writer.close()
            self._sink.close()
        if self.schema is None:  # pragma: no cover - write() always sets it
            raise AssertionError("input schema unset")
        return self.schema


@dataclass(frozen=True)
class OutputFacts:
    """What the verified output holds."""

    rows_in: int
    rows_out: int


def _refuse(what: str, digest: str, check: str, message: str, **details: object) -> RejectedError:
    return RejectedError(message, object=what, check=check, digest=digest, details=dict(details))


def output_batches(path: Path) -> Iterator[pa.RecordBatch]:
    """The output's batches, as an IPC file or, failing that, an IPC stream."""
    source = pa.memory_map(str(path))
    try:
        reader: pa.ipc.RecordBatchFileReader | pa.ipc.RecordBatchStreamReader = pa.ipc.open_file(
            source
        )
    except pa.ArrowInvalid:
        source.seek(0)
        stream = pa.ipc.open_stream(source)
        yield from stream
        return
    for i in range(reader.num_record_batches):
        yield reader.get_batch(i)


def _scan(path: Path, schema: pa.Schema, what: str, digest: str) -> tuple[int, pa.Table]:
    """Rows and identity columns of the output, every batch fully validated."""
    keys = [c for c in ID_COLUMNS if c in schema.names]
    rows, parts = 0, []
    try:
        for batch in output_batches(path):
            if not batch.schema.equals(schema):
                raise _refuse(
                    what,
                    digest,
                    refusals.SCHEMA,
                    "transform output schema differs from its input schema",
                    expected=str(schema)[:2000],
                    actual=str(batch.schema)[:2000],
                )
            batch.validate(full=True)
            rows += batch.num_rows
            parts.append(batch.select(keys))
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _unreadable(what, digest, exc) from None
    key_schema = pa.schema([schema.field(k) for k in keys])
    return rows, pa.Table.from_batches(parts, key_schema)


def _unreadable(what: str, digest: str, exc: Exception) -> RejectedError:
    return _refuse(
        what,
        digest,
        refusals.OUTPUT,
        "transform output is not readable Arrow IPC",
        cause=str(exc)[:200],
    )


def _schema_of(path: Path, what: str, digest: str) -> pa.Schema:
    try:
        source = pa.memory_map(str(path))
        try:
            return pa.ipc.open_file(source).schema
        except pa.ArrowInvalid:
            source.seek(0)
            return pa.ipc.open_stream(source).schema
    except (pa.ArrowException, OSError, ValueError) as exc:
        raise _unreadable(what, digest, exc) from None


def check_output(
    input_path: Path, output_path: Path, schema: pa.Schema, *, what: str, digest: str
) -> OutputFacts:
    """Refuse an output that is unreadable, too large, reshaped, longer, or invents ids."""
    if output_path.is_symlink() or not output_path.is_file():
        raise _refuse(what, digest, refusals.OUTPUT, "transform wrote no output")
    limit = input_path.stat().st_size * OUTPUT_FACTOR + OUTPUT_SLACK
    if output_path.stat().st_size > limit:
        raise _refuse(what, digest, refusals.OUTPUT, "transform output is too large", limit=limit)
    actual = _schema_of(output_path, what, digest)
    if not actual.equals(schema):
        raise _refuse(
            what,
            digest,
            refusals.SCHEMA,
            "transform output schema differs from its input schema",
            expected=str(schema)[:2000],
            actual=str(actual)[:2000],
        )
    rows_out, out_keys = _scan(output_path, schema, what, digest)
    in_keys = (
        pa.ipc.open_file(pa.memory_map(str(input_path))).read_all().select(out_keys.column_names)
    )
    rows_in = in_keys.num_rows
    if rows_out > rows_in:
        raise _refuse(
            what,
            digest,
            refusals.ROWS,
            "transform output has more rows than its input",
            rowsIn=rows_in,
            rowsOut=rows_out,
        )
    _check_ids(in_keys, out_keys, what, digest)
    return OutputFacts(rows_in=rows_in, rows_out=rows_out)


def _check_ids(in_keys: pa.Table, out_keys: pa.Table, what: str, digest: str) -> None:
    keys = out_keys.column_names
    if "sampleId" not in keys:
        raise _refuse(what, digest, refusals.SCHEMA, "transform input has no sampleId column")
    counted_in = pl.DataFrame(in_keys).lazy().group_by(keys).agg(pl.len().alias("in"))
    counted_out = pl.DataFrame(out_keys).lazy().group_by(keys).agg(pl.len().alias("out"))
    joined = counted_out.join(counted_in, on=keys, how="left", nulls_equal=True)
    found = joined.select(
        invented=pl.col("in").is_null().sum(),
        duplicated=(pl.col("in").is_not_null() & (pl.col("out") > pl.col("in"))).sum(),
    ).collect()
    invented, duplicated = int(found["invented"][0]), int(found["duplicated"][0])
    if invented:
        raise _refuse(
            what,
            digest,
            refusals.INVENTED,
            "transform output names records its input did not have",
            records=invented,
        )
    if duplicated:
        raise _refuse(
            what, digest, refusals.DUPLICATE, "transform output repeats records", records=duplicated
        )
