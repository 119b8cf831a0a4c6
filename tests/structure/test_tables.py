"""One store per table: each catalog table is written by exactly one module, its store,
and that store sits on a floor at or below every module whose SQL names the table.

So a reader can always import the store's records and names, and the writer never
depends on one of its readers.  A table several floors read (runs, permits, aliases,
fence hits, the GC ledger) therefore has its store in ``relgate/catalog/``.  Read from
the SQL text in each module's string literals (f-strings included); the row lock the
gate transaction takes (``... FOR UPDATE``) names no data and is not a read.
"""

from __future__ import annotations

import ast
import re
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path

from tests.structure.test_layers import FLOOR_OF, ROOT

_NAMED = re.compile(r"\b(FROM|INTO|UPDATE|JOIN)\s+([a-z_]+)\b")
_DELETED = re.compile(r"\bDELETE\s+FROM\s+([a-z_]+)\b")
_MIGRATIONS = ROOT / "relgate" / "catalog" / "migrations.py"
TABLES = frozenset(re.findall(r"CREATE TABLE ([a-z_]+)", _MIGRATIONS.read_text()))


def _strings(path: Path) -> Iterator[str]:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.value
        elif isinstance(node, ast.JoinedStr):
            yield "".join(v.value if isinstance(v, ast.Constant) else "?" for v in node.values)


def uses(source: str) -> Iterator[tuple[str, bool]]:
    """(table, written) for every table one SQL text names."""
    if "FOR UPDATE" in source:
        return
    for match in _NAMED.finditer(source):
        if match.group(2) in TABLES:
            yield match.group(2), match.group(1) in ("INTO", "UPDATE")
    for match in _DELETED.finditer(source):
        if match.group(1) in TABLES:
            yield match.group(1), True


def _table_uses() -> dict[str, dict[str, bool]]:
    """table -> {module path: whether it writes the table}."""
    found: dict[str, dict[str, bool]] = defaultdict(dict)
    for path in sorted((ROOT / "relgate").rglob("*.py")):
        if path == _MIGRATIONS:
            continue
        module = str(path.relative_to(ROOT / "relgate"))
        for source in _strings(path):
            for table, written in uses(source):
                found[table][module] = found[table].get(module, False) or written
    return found


def _floor(module: str) -> int:
    return FLOOR_OF[module.split("/", maxsplit=1)[0].removesuffix(".py")]


def test_every_table_has_one_writer() -> None:
    wrong = {
        table: sorted(m for m, w in modules.items() if w)
        for table, modules in _table_uses().items()
        if sum(modules.values()) != 1
    }
    assert wrong == {}


def test_a_tables_store_sits_at_or_below_every_reader() -> None:
    wrong = []
    for table, modules in sorted(_table_uses().items()):
        writers = [m for m, w in modules.items() if w]
        for module in sorted(modules):
            if writers and _floor(module) < _floor(writers[0]):
                wrong.append(f"{module} reads {table} below its store {writers[0]}")
    assert wrong == []


def test_the_reader_sees_writes_and_reads() -> None:
    """The SQL reader is not blind: it sees an insert, an update, a delete and a join,
    and it skips the gate's row lock."""
    sql = "UPDATE runs SET x = 1 WHERE run_id IN (SELECT run_id FROM permits JOIN pins ON 1)"
    assert sorted(uses(sql)) == [("permits", False), ("pins", False), ("runs", True)]
    assert list(uses("DELETE FROM leases WHERE 1")) == [("leases", False), ("leases", True)]
    assert list(uses("INSERT INTO fence_hits (a) VALUES (1)")) == [("fence_hits", True)]
    assert list(uses("SELECT id FROM fences WHERE id = 1 FOR UPDATE")) == []
