"""Pinned data sources: Iceberg tables, versioned object prefixes and CDC change logs.

The contract and the pin models are in :mod:`relgate.sources.source`; each kind has its
own module; :func:`relgate.sources.factory.source_from_config` builds one from config
(imported from there, so that reading the record schema does not load every kind).
"""

from relgate.documents.source_pins import SourceEntry, SourcePin
from relgate.sources.source import Source

__all__ = ["Source", "SourceEntry", "SourcePin"]
