"""The source contract and the pins a source writes into a snapshot manifest.

``pin()`` establishes the source's side of the consistent boundary (a table snapshot id,
the exact object versions and their byte digests, a contiguous CDC offset range) and
returns a :class:`SourcePin` whose ``entry`` (an :data:`SourceEntry`: one typed model per
kind) goes into the manifest.  ``read(entry)`` reads exactly the pinned versions, never
"latest", so a replay months later sees the same rows.  The kinds live in their own
modules and import this one; :mod:`relgate.sources.factory` builds a source from config.
"""

from __future__ import annotations

import abc
import json
from collections.abc import Iterator

import pyarrow as pa

from relgate.documents.source_pins import SourceEntry, SourcePin
from relgate.integrity.contract import JsonObject
from relgate.integrity.identifiers import IdentifierError, validate_id
from relgate.records.record_schema import TEXT_SCHEMA, RecordSchema
from relgate.records.rows import row_error

#: Rows per batch a source yields when it has no natural batches of its own.
BATCH_ROWS = 1_000_000


def parse_row(line: bytes, where: str) -> JsonObject:
    """One JSON-lines row: strict UTF-8, a JSON object, a valid ``id`` (never trusted)."""
    try:
        text = line.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise row_error(where, "not valid UTF-8", offset=exc.start) from None
    try:
        record = json.loads(text)
    except (ValueError, RecursionError):
        raise row_error(where, "not JSON") from None
    if not isinstance(record, dict):
        raise row_error(where, "not a JSON object")
    if "id" not in record:
        raise row_error(where, "no id")
    try:
        record["id"] = validate_id(record["id"], kind="sample id", where=where)
    except IdentifierError as exc:
        raise row_error(where, f"bad id ({exc.details['reason']})") from None
    return record


class Source(abc.ABC):
    kind: str = "abstract"

    def __init__(self, source_id: str, *, schema: RecordSchema = TEXT_SCHEMA) -> None:
        self.id = source_id
        #: What one record is: the columns :meth:`read` yields (plus ``sourceVersion``).
        self.schema = schema

    @abc.abstractmethod
    def pin(self) -> SourcePin: ...

    @abc.abstractmethod
    def read(self, entry: SourceEntry) -> pa.Table:
        """Rows of ``self.schema.arrow_schema()`` at the pinned versions."""

    def read_batches(self, entry: SourceEntry) -> Iterator[pa.Table]:
        """:meth:`read` in record batches (kinds that can stream override this)."""
        table = self.read(entry)
        for start in range(0, table.num_rows, BATCH_ROWS):
            yield table.slice(start, BATCH_ROWS)

    @abc.abstractmethod
    def check_readable(self, entry: SourceEntry) -> list[str]:
        """Problems that make the pinned versions unreadable now (empty when all is well)."""

    def late_events(self, entry: SourceEntry) -> int:
        """Events older than the pinned watermark that arrived after pinning."""
        return 0
