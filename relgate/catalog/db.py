"""Database access shared by the catalog and the gate.

SQLAlchemy Core with plain SQL keeps one code path for SQLite and PostgreSQL.  Two kinds
of transaction exist:

* :meth:`Database.tx` for ordinary catalog reads and writes;
* :meth:`Database.gate_tx` for the linearizable gate: on SQLite every write transaction
  is ``BEGIN IMMEDIATE`` (one writer at a time, so gate transactions are totally ordered);
  on PostgreSQL the gate advisory lock is taken exclusively and the single ``fences`` row
  is locked ``FOR UPDATE``, which orders every gate transaction behind the previous one;
* :meth:`Database.admission_tx` for admissions, which commute with each other: on
  PostgreSQL they take the gate advisory lock shared.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sqlalchemy import Connection, create_engine, event, text
from sqlalchemy.engine import Engine
from sqlalchemy.exc import DBAPIError, InterfaceError, OperationalError, ProgrammingError
from sqlalchemy.pool import NullPool

from relgate.catalog import schema
from relgate.errors import ConflictError, RelgateError, UsageError

#: The PostgreSQL advisory lock every gate transaction takes (shared by admissions).
GATE_LOCK = 7244
#: The catalog database could not be reached, or the connection was lost mid-command.
CATALOG_UNAVAILABLE = "catalog-unavailable"
#: The catalog database is reachable but holds no relgate schema (the wrong database).
CATALOG_SCHEMA = schema.CATALOG_SCHEMA
#: What SQLite and PostgreSQL say when a table is missing.
_MISSING_TABLE = ("no such table", "undefinedtable", "does not exist")


class CatalogUnavailableError(ConflictError):
    """The catalog database was unreachable or dropped the connection (server killed,
    network lost, database locked past the busy timeout).  A transaction that lost its
    connection is rolled back by the server and every gate write is CAS-checked, so the
    command can be retried as it was given (exit 4)."""

    code = "catalog_unavailable"


def catalog_error(exc: BaseException, url: str = "catalog") -> RelgateError | None:
    """The typed error a database failure means, or ``None`` when it is not one of
    these: a missing table is the wrong database (``catalog-schema``, exit 2), a lost or
    refused connection is :class:`CatalogUnavailableError` (``catalog-unavailable``)."""
    if not isinstance(exc, DBAPIError):
        return None
    said = f"{type(exc.orig).__name__}: {exc.orig}".lower()
    if isinstance(exc, OperationalError | ProgrammingError) and any(
        m in said for m in _MISSING_TABLE
    ):
        return UsageError(
            "the catalog database holds no relgate schema: was the workspace created with"
            " RELGATE_CATALOG_URL set (set it again), or not initialised (`relgate init`)?",
            object=url,
            check=CATALOG_SCHEMA,
            details={"database": str(exc.orig).splitlines()[0] if str(exc.orig) else ""},
        )
    if isinstance(exc, OperationalError | InterfaceError) or exc.connection_invalidated:
        first = str(exc.orig).strip().splitlines()
        return CatalogUnavailableError(
            "the catalog database is unavailable or dropped the connection; nothing was"
            " committed by the lost transaction, retry the command",
            object=url,
            check=CATALOG_UNAVAILABLE,
            details={"database": first[0] if first else type(exc.orig).__name__},
        )
    return None


def utcnow() -> str:
    return dt.datetime.now(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


class Database:
    def __init__(self, url: str) -> None:
        self.url = url
        if url.startswith("sqlite"):
            self.dialect = "sqlite"
            self.engine: Engine = create_engine(
                url, connect_args={"timeout": 60, "isolation_level": None}, poolclass=NullPool
            )

            @event.listens_for(self.engine, "connect")
            def _on_connect(dbapi_conn: Any, _record: Any) -> None:
                cur = dbapi_conn.cursor()
                cur.execute("PRAGMA journal_mode=WAL")
                cur.execute("PRAGMA foreign_keys=ON")
                cur.execute("PRAGMA busy_timeout=60000")
                cur.close()

            @event.listens_for(self.engine, "begin")
            def _on_begin(conn: Connection) -> None:
                conn.exec_driver_sql("BEGIN IMMEDIATE")

        elif url.startswith("postgresql"):
            self.dialect = "postgresql"
            self.engine = create_engine(url, isolation_level="READ COMMITTED", pool_pre_ping=True)
        else:
            raise UsageError(
                "unsupported catalog URL (sqlite:/// or postgresql+psycopg://)",
                object=url,
                check="db-url",
            )

    def __repr__(self) -> str:
        return f"Database({self.shown_url})"

    @property
    def shown_url(self) -> str:
        """The URL without its password (what errors name)."""
        return self.engine.url.render_as_string(hide_password=True)

    @contextmanager
    def _typed_errors(self) -> Iterator[None]:
        """Lost connections and a missing schema as typed errors (see :func:`catalog_error`)."""
        try:
            yield
        except DBAPIError as exc:
            mapped = catalog_error(exc, self.shown_url)
            if mapped is None:
                raise
            raise mapped from exc

    def require_schema(self) -> None:
        """Refuse a catalog database without relgate's schema (``catalog-schema``, exit 2)
        before a command reads it; a SQLite file that does not exist is not created."""
        if self.dialect == "sqlite":
            path = self.engine.url.database
            if path and path != ":memory:" and not Path(path).exists():
                raise UsageError(
                    "the catalog database does not exist: was the workspace created with"
                    " RELGATE_CATALOG_URL set (set it again), or not initialised (`relgate init`)?",
                    object=self.shown_url,
                    check=CATALOG_SCHEMA,
                )
        behind = self.pending()
        if behind:
            raise UsageError(
                f"the catalog schema lacks migrations {behind} that this relgate needs:"
                " run `relgate migrate` (opening a workspace never migrates it)",
                object=self.shown_url,
                check=CATALOG_SCHEMA,
                details={"schemaVersion": self.schema_version(), "pending": behind},
            )

    @contextmanager
    def tx(self) -> Iterator[Connection]:
        with self._typed_errors(), self.engine.begin() as conn:
            yield conn

    @contextmanager
    def gate_tx(self) -> Iterator[Connection]:
        with self._typed_errors(), self.engine.begin() as conn:
            if self.dialect == "postgresql":
                conn.execute(text(f"SELECT pg_advisory_xact_lock({GATE_LOCK})"))
                conn.execute(text("SELECT id FROM fences WHERE id = 1 FOR UPDATE"))
            yield conn

    @contextmanager
    def admission_tx(self) -> Iterator[Connection]:
        """A gate transaction for admissions only: they read gate state (fences, aliases,
        hits, release state) that only :meth:`gate_tx` writes, and write rows of their
        own (permits, runs) that only :meth:`gate_tx` reads.  So on PostgreSQL they share
        the gate lock with each other and exclude every other gate transaction; the
        order is still total up to admissions commuting.  On SQLite it is
        :meth:`gate_tx` (one writer at a time)."""
        with self._typed_errors(), self.engine.begin() as conn:
            if self.dialect == "postgresql":
                conn.execute(text(f"SELECT pg_advisory_xact_lock_shared({GATE_LOCK})"))
            yield conn

    # -- migrations (Alembic: relgate.catalog.schema) -----------------------------------
    def migrate(self) -> list[int]:
        """Apply pending migrations; returns the versions applied now."""
        with self._typed_errors(), self.engine.begin() as conn:
            return schema.upgrade(conn)

    def pending(self) -> list[int]:
        """The versions of this relgate's migrations the catalog has not applied (a catalog
        with no relgate schema at all is ``catalog-schema``, from :meth:`schema_version`)."""
        with self.tx() as conn:
            return schema.pending(conn)

    def schema_version(self) -> int:
        with self.tx() as conn:
            return schema.version(conn)

    def dispose(self) -> None:
        self.engine.dispose()


def rows(
    conn: Connection, sql: str, params: Mapping[str, Any] | None = None
) -> list[dict[str, Any]]:
    return [dict(r._mapping) for r in conn.execute(text(sql), dict(params or {}))]


def one(
    conn: Connection, sql: str, params: Mapping[str, Any] | None = None
) -> dict[str, Any] | None:
    row = conn.execute(text(sql), dict(params or {})).first()
    return dict(row._mapping) if row is not None else None


def execute(conn: Connection, sql: str, params: Mapping[str, Any] | None = None) -> int:
    return conn.execute(text(sql), dict(params or {})).rowcount
