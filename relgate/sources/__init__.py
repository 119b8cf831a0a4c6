"""Pinned data sources: Iceberg tables, versioned object prefixes and CDC change logs."""

from relgate.sources.source import Source, SourcePin, source_from_config

__all__ = ["Source", "SourcePin", "source_from_config"]
