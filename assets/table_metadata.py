"""Rows as Dagster table metadata: ``MetadataValue.table`` with a ``TableSchema``.

Every table the assets report goes through :func:`typed_table`, so the UI shows typed
columns (numbers sort as numbers) instead of markdown, and an empty table still names its
columns.
"""

import re
from collections.abc import Mapping, Sequence

import dagster as dg

Cell = bool | int | float | str
#: ``dagster/row_count``: the standard row-count key, which the UI plots per materialization.
ROW_COUNT = "dagster/row_count"
#: ``dagster/column_schema``: the standard key of a table asset's columns.
COLUMN_SCHEMA = "dagster/column_schema"
#: Every metadata key the code location reports: Dagster's own (``dagster/...``) or
#: camelCase, optionally followed by dotted qualifiers that are data (an alias name, a
#: verifier count's name): ``generation.default-release``, ``count.missing_members``.
METADATA_KEY = re.compile(r"^(dagster/[a-z_]+|[a-z][A-Za-z0-9]*(\.[A-Za-z0-9_-]+)*)$")


def _type(value: object) -> str:
    if isinstance(value, bool):
        return "bool"
    if isinstance(value, int):
        return "int"
    if isinstance(value, float):
        return "float"
    return "string"


def _cell(value: object) -> Cell:
    return value if isinstance(value, bool | int | float | str) else str(value)


def typed_table(
    rows: Sequence[Mapping[str, object]], columns: Sequence[tuple[str, str]] = ()
) -> dg.MetadataValue:
    """A table over ``rows``: ``columns`` as (name, type) when given, else every key the
    rows use, typed from the first non-empty value (an absent cell is the empty string)."""
    if not columns:
        names = list(dict.fromkeys(k for r in rows for k in r))
        columns = [
            (n, next((_type(r[n]) for r in rows if r.get(n) not in (None, "")), "string"))
            for n in names
        ]
    schema = dg.TableSchema(columns=[dg.TableColumn(n, t) for n, t in columns])
    records = [dg.TableRecord({n: _cell(r.get(n, "")) for n, _ in columns}) for r in rows]
    return dg.MetadataValue.table(records, schema=schema)
