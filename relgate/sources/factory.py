"""The source factory: a configured source of any kind, from its workspace config entry.

It imports every kind; the kinds import only :mod:`relgate.sources.source`, so there is
no import cycle between the contract and its implementations.
"""

from __future__ import annotations

from collections.abc import Mapping

from relgate.errors import UsageError
from relgate.integrity.identifiers import validate_id
from relgate.objects.cas import ContentStore
from relgate.sources.cdc import CdcSource
from relgate.sources.iceberg import IcebergSource
from relgate.sources.prefix import ObjectPrefixSource
from relgate.sources.source import Source


def source_from_config(config: Mapping[str, object], cas: ContentStore) -> Source:
    """The source a ``sources:`` entry of the workspace config describes."""
    source_id = validate_id(config.get("id"), kind="source id", where="source config")
    kind = config.get("kind")
    if kind == "iceberg":
        return IcebergSource(
            source_id,
            catalog_uri=str(config["catalogUri"]),
            warehouse=str(config["warehouse"]),
            table=str(config["table"]),
        )
    if kind == "object-prefix":
        return ObjectPrefixSource(source_id, cas=cas, prefix=str(config["prefix"]))
    if kind == "cdc":
        return CdcSource(source_id, cas=cas, prefix=str(config["prefix"]))
    raise UsageError(
        f"unknown source kind {kind!r}", object=str(config.get("id")), check="source-kind"
    )
