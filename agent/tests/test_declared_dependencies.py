"""relgate-agent and relgate-trust install on their own: every third-party distribution
their code imports (function-level imports included) is declared in their pyproject, in
``dependencies`` or in an extra (``s3``, ``postgres``, ``sim``: the feature that needs it).
A clean ``pip install ./agent`` then runs every command the base install offers."""

from __future__ import annotations

import ast
import sys
import tomllib
from importlib.metadata import packages_distributions
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).resolve().parents[2]
#: Packages of this repository (installed editable, declared by name).
OWN = {"relgate_agent": "relgate-agent", "relgate_trust": "relgate-trust"}


def _imported(package: Path) -> set[str]:
    names: set[str] = set()
    for path in package.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
            if isinstance(node, ast.Import):
                names |= {a.name.split(".")[0] for a in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
                names.add(node.module.split(".")[0])
    return names


def _declared(pyproject: Path) -> set[str]:
    project = tomllib.loads(pyproject.read_text())["project"]
    specs = list(project.get("dependencies", []))
    for extra in project.get("optional-dependencies", {}).values():
        specs += extra
    return {Requirement(s).name.lower().replace("_", "-") for s in specs}


def _distributions(modules: set[str], own: str) -> dict[str, str]:
    """Third-party top-level module -> the distribution that provides it."""
    provided = packages_distributions()
    found = {}
    for module in sorted(modules - set(sys.stdlib_module_names) - {own, "__future__"}):
        if module in OWN:
            found[module] = OWN[module]
            continue
        dists = provided.get(module)
        assert dists, f"{module} is imported but no installed distribution provides it"
        found[module] = dists[0].lower().replace("_", "-")
    return found


@pytest.mark.parametrize(
    ("package", "pyproject"),
    [
        ("agent/relgate_agent", "agent/pyproject.toml"),
        ("trust/relgate_trust", "trust/pyproject.toml"),
    ],
)
def test_every_imported_distribution_is_declared(package: str, pyproject: str) -> None:
    own = Path(package).name
    needed = _distributions(_imported(ROOT / package), own)
    declared = _declared(ROOT / pyproject)
    missing = {m: d for m, d in needed.items() if d not in declared}
    assert missing == {}
