"""The catalog's schema, migrated by Alembic.

Each of :data:`relgate.catalog.migrations.MIGRATIONS` is one Alembic revision
(``versions/r<NNNN>_*.py``: revision ``"NNNN"``, a linear chain), so the catalog's schema
state is Alembic's ``alembic_version`` row and a migration is ``alembic upgrade head`` run
by :func:`upgrade` on the caller's connection and transaction (PostgreSQL: under an
advisory lock, so concurrent migrators serialise).  Only ``relgate init`` and ``relgate
migrate`` call it; opening a workspace compares the catalog with :func:`pending` and
refuses a catalog that is behind (``catalog-schema``).

A catalog from before Alembic holds the versions it applied in ``schema_migrations``;
:func:`upgrade` first stamps its highest applied version as Alembic's current revision,
then upgrades from there.
"""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from alembic.script import ScriptDirectory
from sqlalchemy import Connection, inspect, text

from relgate.errors import UsageError

#: The check a catalog whose schema does not match this relgate fails.
CATALOG_SCHEMA = "catalog-schema"
#: The Alembic script directory (``env.py`` and ``versions/``); tests point it elsewhere.
SCRIPT_LOCATION = Path(__file__).parent
LEGACY_TABLE = "schema_migrations"


def revision_id(version: int) -> str:
    """The Alembic revision of migration ``version`` (one rule, used by every revision)."""
    return f"{version:04d}"


def _config(conn: Connection) -> Config:
    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    config.attributes["connection"] = conn
    return config


def _chain(config: Config) -> list[str]:
    """Every revision of this relgate, oldest first."""
    script = ScriptDirectory.from_config(config)
    return [r.revision for r in reversed(list(script.walk_revisions()))]


def _current(conn: Connection) -> str | None:
    heads = MigrationContext.configure(conn).get_current_heads()
    return heads[0] if heads else None


def _legacy_version(conn: Connection) -> int | None:
    if not inspect(conn).has_table(LEGACY_TABLE):
        return None
    row = conn.execute(text(f"SELECT MAX(version) FROM {LEGACY_TABLE}")).first()  # noqa: S608
    return int(row[0]) if row and row[0] is not None else None


def pending(conn: Connection) -> list[int]:
    """The versions this relgate has and the catalog lacks, oldest first."""
    chain = _chain(_config(conn))
    current = _current(conn)
    if current is None:
        legacy = _legacy_version(conn)
        current = revision_id(legacy) if legacy is not None else None
    if current is None:
        return [int(r) for r in chain]
    if current not in chain:
        raise UsageError(
            f"the catalog is at schema revision {current}, which this relgate does not have:"
            " it was migrated by a newer relgate (upgrade this one)",
            object="catalog",
            check=CATALOG_SCHEMA,
            details={"revision": current, "known": chain},
        )
    return [int(r) for r in chain[chain.index(current) + 1 :]]


def version(conn: Connection) -> int:
    """The catalog's schema version (0: no relgate schema)."""
    current = _current(conn)
    if current is not None:
        return int(current)
    return _legacy_version(conn) or 0


def upgrade(conn: Connection) -> list[int]:
    """Apply every pending revision on ``conn`` (in its transaction); the versions applied."""
    if conn.dialect.name == "postgresql":
        conn.execute(text("SELECT pg_advisory_xact_lock(7243)"))
    config = _config(conn)
    if _current(conn) is None:
        legacy = _legacy_version(conn)
        if legacy is not None:
            command.stamp(config, revision_id(legacy))
    todo = pending(conn)
    if todo:
        command.upgrade(config, "head")
    return todo
