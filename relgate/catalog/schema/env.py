"""Alembic's environment for the catalog: always online, on the connection (and in the
transaction) that :func:`relgate.catalog.schema.upgrade` opened."""

from alembic import context

connection = context.config.attributes["connection"]
context.configure(connection=connection, target_metadata=None)
with context.begin_transaction():
    context.run_migrations()
