"""The catalog's schema, migrated by Alembic.

Each of :data:`relgate.catalog.migrations.MIGRATIONS` is one Alembic revision
(``versions/r<NNNN>_*.py``: revision ``"NNNN"``, a linear chain), so the catalog's schema
state is Alembic's ``alembic_version`` row and a migration is ``alembic upgrade head`` run
by :func:`upgrade` on the caller's connection and transaction (PostgreSQL: under an
advisory lock, so concurrent migrators serialise).  Only ``relgate init`` and ``relgate
migrate`` call it; opening a workspace compares the catalog with :func:`pending` and
refuses a catalog that is behind (``catalog-schema``).

:func:`pending` and :func:`version` run on every workspace open, so they read without
Alembic (importing it and loading every revision script cost a CLI command ~0.15 s of its
~1 s): the revisions are the ``versions/r<NNNN>_*.py`` file names (revision
:func:`revision_id` of NNNN, a test holds Alembic's own chain to the same list) and the
current one is Alembic's ``alembic_version`` row.  Alembic loads only to migrate.

A catalog from before Alembic holds the versions it applied in ``schema_migrations``;
:func:`upgrade` first stamps its highest applied version as Alembic's current revision,
then upgrades from there.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import TYPE_CHECKING

from sqlalchemy import Connection, inspect, text

from relgate.errors import UsageError

#: The check a catalog whose schema does not match this relgate fails.
CATALOG_SCHEMA = "catalog-schema"
#: The Alembic script directory (``env.py`` and ``versions/``); tests point it elsewhere.
SCRIPT_LOCATION = Path(__file__).parent
LEGACY_TABLE = "schema_migrations"
#: Alembic's table of the applied revision (its default ``version_table``).
VERSION_TABLE = "alembic_version"
#: A revision script's file name: ``r<NNNN>_<what>.py`` holds revision ``revision_id(NNNN)``.
REVISION_FILE = re.compile(r"r(\d{4})_\w+\.py")

if TYPE_CHECKING:
    from alembic.config import Config


def revision_id(version: int) -> str:
    """The Alembic revision of migration ``version`` (one rule, used by every revision)."""
    return f"{version:04d}"


def _config(conn: Connection) -> Config:
    from alembic.config import Config  # noqa: PLC0415 - Alembic loads only to migrate

    config = Config()
    config.set_main_option("script_location", str(SCRIPT_LOCATION))
    config.attributes["connection"] = conn
    return config


def chain() -> list[str]:
    """Every revision of this relgate, oldest first (from the script file names): 1..N
    without a gap, and no other script there (Alembic would load it; this would not)."""
    scripts = [p.name for p in (SCRIPT_LOCATION / "versions").glob("*.py")]
    odd = sorted(n for n in scripts if n != "__init__.py" and not REVISION_FILE.fullmatch(n))
    found = sorted(int(m.group(1)) for n in scripts if (m := REVISION_FILE.fullmatch(n)))
    if odd or found != list(range(1, len(found) + 1)):
        raise UsageError(
            "this relgate's migration scripts are not r0001_*.py .. rNNNN_*.py without a gap",
            object=str(SCRIPT_LOCATION / "versions"),
            check=CATALOG_SCHEMA,
            details={"unexpected": odd, "revisions": found},
        )
    return [revision_id(v) for v in found]


def _current(conn: Connection) -> str | None:
    """The revision Alembic recorded (None: no ``alembic_version`` row)."""
    if not inspect(conn).has_table(VERSION_TABLE):
        return None
    heads = conn.execute(text(f"SELECT version_num FROM {VERSION_TABLE}")).scalars().all()  # noqa: S608 - a constant
    return str(heads[0]) if heads else None


def _legacy_version(conn: Connection) -> int | None:
    if not inspect(conn).has_table(LEGACY_TABLE):
        return None
    row = conn.execute(text(f"SELECT MAX(version) FROM {LEGACY_TABLE}")).first()  # noqa: S608
    return int(row[0]) if row and row[0] is not None else None


def pending(conn: Connection) -> list[int]:
    """The versions this relgate has and the catalog lacks, oldest first."""
    revisions = chain()
    current = _current(conn)
    if current is None:
        legacy = _legacy_version(conn)
        current = revision_id(legacy) if legacy is not None else None
    if current is None:
        return [int(r) for r in revisions]
    if current not in revisions:
        raise UsageError(
            f"the catalog is at schema revision {current}, which this relgate does not have:"
            " it was migrated by a newer relgate (upgrade this one)",
            object="catalog",
            check=CATALOG_SCHEMA,
            details={"revision": current, "known": revisions},
        )
    return [int(r) for r in revisions[revisions.index(current) + 1 :]]


def version(conn: Connection) -> int:
    """The catalog's schema version (0: no relgate schema)."""
    current = _current(conn)
    if current is not None:
        return int(current)
    return _legacy_version(conn) or 0


def upgrade(conn: Connection) -> list[int]:
    """Apply every pending revision on ``conn`` (in its transaction); the versions applied."""
    from alembic import command  # noqa: PLC0415 - Alembic loads only to migrate

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
