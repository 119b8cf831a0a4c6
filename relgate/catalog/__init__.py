"""The catalog and gate database: SQLite (embedded default) or PostgreSQL, one schema."""

from relgate.catalog.db import Database

__all__ = ["Database"]
