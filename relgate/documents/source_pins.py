"""The pins a snapshot manifest records for its sources: one entry per source, discriminated
by ``kind`` (an Iceberg snapshot id, an object prefix pinned object by object, a CDC offset
range), and what pinning returns."""

from __future__ import annotations

from typing import Annotated, Literal, TypeVar

from pydantic import Field, StrictInt, StrictStr

from relgate.errors import IntegrityError
from relgate.integrity.contract import Contract


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
_Pin = TypeVar("_Pin", IcebergPin, ObjectPrefixPin, CdcPin)


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
