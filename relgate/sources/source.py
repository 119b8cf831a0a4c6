"""The source contract.

``pin()`` establishes the source's side of the consistent boundary (a table snapshot id,
the exact object versions and their byte digests, a contiguous CDC offset range) and
returns a :class:`SourcePin` whose ``entry`` goes into the manifest.  ``read(pin)`` reads
exactly the pinned versions, never "latest", so a replay months later sees the same rows.
"""

from __future__ import annotations

import abc
import json
from dataclasses import dataclass, field
from typing import Any

import pyarrow as pa

from relgate.errors import RejectedError, UsageError
from relgate.integrity.identifiers import IdentifierError, validate_id
from relgate.objects.cas import ContentStore

#: A source row that cannot be admitted (bad UTF-8, not JSON, no or bad id, bad field):
#: the build is refused (exit 3) naming the source, the object version and the line.
ROW_CHECK = "source-row"


def row_error(where: str, why: str, **details: Any) -> RejectedError:
    return RejectedError(
        f"source row refused: {why}", object=where, check=ROW_CHECK, details=details
    )


def parse_row(line: bytes, where: str) -> dict[str, Any]:
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
        raise row_error(where, f"bad id ({exc.details['reason']})", **exc.details) from None
    return record


def require_text(record: dict[str, Any], name: str, where: str) -> str:
    value = record.get(name)
    if not isinstance(value, str):
        raise row_error(where, f"field {name!r} is not a string")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError:
        raise row_error(where, f"field {name!r} is not valid UTF-8") from None
    return value


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
        """Rows of :data:`relgate.sources.schema.SOURCE_ARROW_SCHEMA` at the pinned versions."""

    @abc.abstractmethod
    def check_readable(self, entry: dict[str, Any]) -> list[str]:
        """Problems that make the pinned versions unreadable now (empty when all is well)."""

    def late_events(self, entry: dict[str, Any]) -> int:
        """Events older than the pinned watermark that arrived after pinning."""
        return 0


def source_from_config(config: dict[str, Any], cas: ContentStore) -> Source:
    validate_id(config.get("id"), kind="source id", where="source config")
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
        from relgate.sources.prefix import ObjectPrefixSource

        return ObjectPrefixSource(config["id"], cas=cas, prefix=config["prefix"])
    if kind == "cdc":
        from relgate.sources.cdc import CdcSource

        return CdcSource(config["id"], cas=cas, prefix=config["prefix"])
    raise UsageError(
        f"unknown source kind {kind!r}", object=str(config.get("id")), check="source-kind"
    )
