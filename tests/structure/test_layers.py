"""The floors of the core: a package imports only packages on lower floors.

Read from the code's own ``import`` statements (function-level ones included), so an arrow
that runs back up, or across one floor, fails here and in ``make test``.  The order is the
one docs/architecture.md draws; changing it is a design change, made there and here
together.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: Bottom floor first.  Packages on one floor do not import each other.
FLOORS: tuple[frozenset[str], ...] = tuple(
    frozenset(floor.split())
    for floor in (
        "errors heap progress",
        "integrity",
        "objects records",
        "documents",
        "catalog",
        "workspace",
        "holds sources",
        "gate transforms",
        "snapshot",
        "release",
        "runs",
        "lifecycle checkpoint",
        "demo",
        "cli",
    )
)
FLOOR_OF = {package: level for level, floor in enumerate(FLOORS) for package in floor}
#: The package's own entry points sit above every floor.
ENTRY_POINTS = frozenset({"__init__", "__main__"})


def _package(path: Path) -> str:
    """``relgate/gate/aliases.py`` -> ``gate``; ``relgate/workspace.py`` -> ``workspace``."""
    return path.relative_to(ROOT / "relgate").parts[0].removesuffix(".py")


def _imports(path: Path) -> Iterator[tuple[int, str]]:
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            yield node.lineno, node.module


def _arrows() -> Iterator[tuple[str, int, str, str]]:
    """(file, line, from-package, to-package) for every import of another core package."""
    for path in sorted((ROOT / "relgate").rglob("*.py")):
        source = _package(path)
        for line, module in _imports(path):
            parts = module.split(".")
            if parts[0] == "relgate" and len(parts) > 1 and parts[1] != source:
                yield str(path.relative_to(ROOT)), line, source, parts[1]


def test_every_core_package_has_a_floor() -> None:
    packages = {_package(p) for p in (ROOT / "relgate").rglob("*.py")} - ENTRY_POINTS
    assert sorted(packages - FLOOR_OF.keys()) == []


def test_imports_only_run_down_the_floors() -> None:
    wrong = [
        f"{path}:{line} {source} (floor {FLOOR_OF.get(source, '?')}) imports {target}"
        f" (floor {FLOOR_OF.get(target, '?')})"
        for path, line, source, target in _arrows()
        if source not in ENTRY_POINTS and FLOOR_OF.get(target, 99) >= FLOOR_OF.get(source, -1)
    ]
    assert wrong == []


def test_the_check_sees_an_arrow_that_runs_back_up(tmp_path: Path) -> None:
    """The reader of imports is not blind: an upward import in a function body is found."""
    module = tmp_path / "probe.py"
    module.write_text("def f():\n    from relgate.cli.main import main\n    return main\n")
    assert list(_imports(module)) == [(2, "relgate.cli.main")]


def _external(tree: Path, prefix: str) -> list[tuple[str, int, str]]:
    return [
        (str(path.relative_to(ROOT)), line, module)
        for path in sorted(tree.rglob("*.py"))
        for line, module in _imports(path)
        if module == prefix or module.startswith(prefix + ".")
    ]


def test_the_core_reaches_the_agent_only_from_checkpoint() -> None:
    """The core is the agent's client (the coordinator client, the local fleet) in
    ``relgate/checkpoint/`` and nowhere else; shared rules come from relgate_trust."""
    outside = [
        f"{path}:{line} {module}"
        for path, line, module in _external(ROOT / "relgate", "relgate_agent")
        if not path.startswith("relgate/checkpoint/")
    ]
    assert outside == []


def test_trust_imports_neither_product() -> None:
    found = [
        f"{path}:{line} {module}"
        for prefix in ("relgate", "relgate_agent", "dagster", "dagster_pipes")
        for path, line, module in _external(ROOT / "trust" / "relgate_trust", prefix)
    ]
    assert found == []
