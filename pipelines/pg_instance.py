"""The Dagster instance on PostgreSQL: the connection URL ``dagster.postgres.yaml`` reads.

``dagster.postgres.yaml`` takes the whole connection from ``DAGSTER_PG_URL``
(``postgres_url: {env: DAGSTER_PG_URL}``), so no host, port or database is written in it.
dagster-postgres hands that URL to SQLAlchemy as it is, and SQLAlchemy 2.1 maps a bare
``postgresql://`` to psycopg 3, on which Dagster's ``NOTIFY run_events, %s`` fails; Dagster
needs the psycopg2 driver.  :func:`dagster_pg_url` is that rule: any PostgreSQL spelling
(``postgres://``, ``postgresql://``, ``postgresql+psycopg://``) becomes
``postgresql+psycopg2://``.  ``make demo`` and ``make ui`` apply it (the demo in process,
``make ui`` through ``python -m pipelines.pg_instance``, which prints the URL to use).
"""

from __future__ import annotations

import os
from collections.abc import MutableMapping

import click

PG_URL_ENV = "DAGSTER_PG_URL"
#: The SQLAlchemy driver dagster-postgres 0.29 works with.
PSYCOPG2 = "postgresql+psycopg2"
_POSTGRES_SCHEMES = frozenset({"postgres", "postgresql", "postgresql+psycopg", PSYCOPG2})


def dagster_pg_url(url: str) -> str:
    """``url`` with the psycopg2 driver; ValueError unless it is a PostgreSQL URL."""
    scheme, sep, rest = url.strip().partition("://")
    if not sep or scheme.lower() not in _POSTGRES_SCHEMES or not rest:
        raise ValueError(
            f"{PG_URL_ENV} must be a PostgreSQL URL (postgresql://user:password@host:port/db),"
            f" not {scheme or url!r}"
        )
    return f"{PSYCOPG2}://{rest}"


def use_pg_url(environ: MutableMapping[str, str] = os.environ) -> str | None:
    """Rewrite ``DAGSTER_PG_URL`` in ``environ`` to the psycopg2 driver; None when unset."""
    url = environ.get(PG_URL_ENV)
    if not url:
        return None
    environ[PG_URL_ENV] = dagster_pg_url(url)
    return environ[PG_URL_ENV]


@click.command(help=f"Print ${PG_URL_ENV} as the URL dagster-postgres needs (psycopg2 driver).")
def main() -> None:
    try:
        url = use_pg_url()
    except ValueError as exc:
        raise click.UsageError(str(exc)) from exc
    if url is None:
        raise click.UsageError(f"{PG_URL_ENV} is not set")
    click.echo(url)


if __name__ == "__main__":
    main()
