"""Migrations through Alembic on PostgreSQL: two migrators started at once on an empty
catalog apply the baseline exactly once between them (the advisory lock), and both leave
the catalog current."""

from concurrent.futures import ThreadPoolExecutor

import pytest
from support.postgres import fresh_database

from relgate.catalog.db import Database
from relgate.catalog.migrations import MIGRATIONS

pytestmark = pytest.mark.postgres


def test_two_migrators_at_once_apply_each_revision_once(pg_dsn: str) -> None:
    with fresh_database(pg_dsn) as url:
        databases = [Database(url), Database(url)]
        try:
            assert databases[0].pending() == [m.version for m in MIGRATIONS]
            with ThreadPoolExecutor(2) as pool:
                applied = list(pool.map(lambda db: db.migrate(), databases))
            assert sorted(applied) == [[], [m.version for m in MIGRATIONS]]
            for db in databases:
                assert db.pending() == [] and db.schema_version() == MIGRATIONS[-1].version
        finally:
            for db in databases:
                db.dispose()
