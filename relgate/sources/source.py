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
from collections.abc import Iterator, Mapping
from typing import Annotated, Literal, TypeVar

import pyarrow as pa
from pydantic import Field, StrictInt, StrictStr, TypeAdapter

from relgate.errors import IntegrityError
from relgate.integrity.contract import Contract, JsonObject, JsonValue
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


def require_text(record: Mapping[str, JsonValue], name: str, where: str) -> str:
    value = record.get(name)
    if not isinstance(value, str):
        raise row_error(where, f"field {name!r} is not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise row_error(where, f"field {name!r} is not valid UTF-8") from None
    return value


class PinList(Contract):
    """The content-addressed pin document a source entry points at (exact version)."""

    uri: StrictStr
    object_version: StrictStr
    count: StrictInt


class ObjectList(PinList):
    """An object-prefix pin list: the object count and their total bytes."""

    size_bytes: StrictInt = Field(alias="bytes")


class MetadataFile(Contract):
    """The Iceberg table-metadata file current at pin time: its location and the SHA-256
    and size of its bytes (metadata files are never rewritten; a commit writes a new one)."""

    location: StrictStr
    #: ``digest`` on the wire (the name ``digest`` is the contract's own digest method).
    file_digest: StrictStr = Field(alias="digest")
    size: StrictInt


class IcebergPin(Contract):
    """An Iceberg table pinned by snapshot id, spelled ``iceberg:<id>`` (64-bit ids), and by
    the digest of its metadata file (absent only in manifests written before it was)."""

    id: StrictStr
    kind: Literal["iceberg"] = "iceberg"
    table: StrictStr
    table_snapshot: StrictStr
    metadata_file: MetadataFile | None = Field(default=None, exclude_if=lambda value: value is None)

    @property
    def snapshot_id(self) -> int:
        return int(self.table_snapshot.removeprefix("iceberg:"))

    @property
    def label(self) -> str:
        """The pinned version in one word (for tables and logs)."""
        return self.table_snapshot


class ObjectPrefixPin(Contract):
    """A versioned prefix pinned object by object (version id, byte digest, size)."""

    id: StrictStr
    kind: Literal["object-prefix"] = "object-prefix"
    prefix: StrictStr
    objects: ObjectList

    @property
    def label(self) -> str:
        """The pinned version in one word (for tables and logs)."""
        return f"{self.objects.count} objects"


class CdcPin(Contract):
    """A CDC log pinned to a contiguous offset range and a commit watermark."""

    id: StrictStr
    kind: Literal["cdc"] = "cdc"
    stream: StrictStr
    cdc_high_watermark: StrictStr
    commit_watermark: StrictInt
    segments: PinList

    @property
    def high_offset(self) -> int:
        return int(self.cdc_high_watermark.removeprefix("offset:"))

    @property
    def label(self) -> str:
        """The pinned version in one word (for tables and logs)."""
        return self.cdc_high_watermark


#: One pinned source as the manifest records it, discriminated by ``kind``.
SourceEntry = Annotated[IcebergPin | ObjectPrefixPin | CdcPin, Field(discriminator="kind")]
_ENTRIES: TypeAdapter[list[SourceEntry]] = TypeAdapter(list[SourceEntry])
_Pin = TypeVar("_Pin", IcebergPin, ObjectPrefixPin, CdcPin)


def parse_entries(value: object) -> list[SourceEntry]:
    """Source entries from decoded JSON (a manifest's ``sources``, a frozen boundary)."""
    return _ENTRIES.validate_python(value)


def expect_pin(entry: SourceEntry, kind: type[_Pin], source_id: str) -> _Pin:
    """The entry as the pin of ``kind`` a source reads, or refuse a mismatched one."""
    if not isinstance(entry, kind) or entry.id != source_id:
        raise IntegrityError(
            f"source {source_id} was handed the pin of {entry.id} ({entry.kind})",
            object=source_id,
            check="source-pin-kind",
        )
    return entry


class SourcePin(Contract):
    """What pinning returns: the manifest entry and counters for the validation report."""

    entry: SourceEntry
    #: e.g. unversioned objects seen while pinning.
    stats: dict[str, StrictInt] = Field(default_factory=dict)

    @property
    def source_id(self) -> str:
        return self.entry.id

    @property
    def kind(self) -> str:
        return self.entry.kind


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
