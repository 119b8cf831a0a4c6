"""The source factory: a configured source of any kind, from its workspace config entry.

It imports every kind; the kinds import only :mod:`relgate.sources.source`, so there is
no import cycle between the contract and its implementations.
"""

from __future__ import annotations

from collections.abc import Mapping

from relgate.errors import UsageError
from relgate.integrity.identifiers import validate_id
from relgate.objects.cas import ContentStore
from relgate.records.record_schema import TEXT_SCHEMA, RecordSchema
from relgate.sources.cdc import CdcSource
from relgate.sources.iceberg import ID_COLUMN as ICEBERG_ID_COLUMN
from relgate.sources.iceberg import IcebergCatalog, IcebergSource
from relgate.sources.prefix import ObjectPrefixSource
from relgate.sources.source import Source


def source_from_config(
    config: Mapping[str, object], cas: ContentStore, schema: RecordSchema = TEXT_SCHEMA
) -> Source:
    """The source a ``sources:`` entry of the workspace config describes, reading records
    of ``schema``."""
    source_id = validate_id(config.get("id"), kind="source id", where="source config")
    kind = config.get("kind")
    if kind == "iceberg":
        return IcebergSource(
            source_id,
            catalog=IcebergCatalog.from_source_config(config, source_id),
            table=str(config["table"]),
            schema=schema,
            id_column=str(config.get("idColumn", ICEBERG_ID_COLUMN)),
        )
    if kind == "object-prefix":
        return ObjectPrefixSource(source_id, cas=cas, prefix=str(config["prefix"]), schema=schema)
    if kind == "cdc":
        return CdcSource(source_id, cas=cas, prefix=str(config["prefix"]), schema=schema)
    raise UsageError(
        f"unknown source kind {kind!r}", object=str(config.get("id")), check="source-kind"
    )
