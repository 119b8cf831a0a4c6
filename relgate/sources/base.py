"""The source contract.

``pin()`` establishes the source's side of the consistent boundary (a table snapshot id,
the exact object versions and their byte digests, a contiguous CDC offset range) and
returns a :class:`SourcePin` whose ``entry`` goes into the manifest.  ``read(pin)`` reads
exactly the pinned versions, never "latest", so a replay months later sees the same rows.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from relgate.errors import UsageError
from relgate.objects.cas import ContentStore


@dataclass(frozen=True)
class SourcePin:
    source_id: str
    kind: str
    #: The manifest entry: integers and strings only.
    entry: dict[str, Any]
    #: Counters for the validation report (e.g. unversioned objects seen while pinning).
    stats: dict[str, int] = field(default_factory=dict)


class Source(abc.ABC):
    kind: str = "abstract"

    def __init__(self, source_id: str) -> None:
        self.id = source_id

    @abc.abstractmethod
    def pin(self) -> SourcePin: ...

    @abc.abstractmethod
    def read(self, entry: dict[str, Any]) -> pa.Table:
        """Rows of :data:`relgate.records.SOURCE_ARROW_SCHEMA` at the pinned versions."""

    @abc.abstractmethod
    def check_readable(self, entry: dict[str, Any]) -> list[str]:
        """Problems that make the pinned versions unreadable now (empty when all is well)."""

    def late_events(self, entry: dict[str, Any]) -> int:
        """Events older than the pinned watermark that arrived after pinning."""
        return 0


def source_from_config(config: dict[str, Any], cas: ContentStore) -> Source:
    kind = config.get("kind")
    if kind == "iceberg":
        from relgate.sources.iceberg import IcebergSource

        return IcebergSource(
            config["id"],
            catalog_uri=config["catalogUri"],
            warehouse=config["warehouse"],
            table=config["table"],
        )
    if kind == "object-prefix":
        from relgate.sources.objects import ObjectPrefixSource

        return ObjectPrefixSource(config["id"], cas=cas, prefix=config["prefix"])
    if kind == "cdc":
        from relgate.sources.cdc import CdcSource

        return CdcSource(config["id"], cas=cas, prefix=config["prefix"])
    raise UsageError(
        f"unknown source kind {kind!r}", object=str(config.get("id")), check="source-kind"
    )
