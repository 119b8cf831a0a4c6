"""Pinned data sources: Iceberg tables, versioned object prefixes and CDC change logs."""

from relgate.sources.factory import source_from_config
from relgate.sources.source import Source, SourceEntry, SourcePin

__all__ = ["Source", "SourceEntry", "SourcePin", "source_from_config"]
