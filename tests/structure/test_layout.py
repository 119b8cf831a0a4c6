"""The structure's own rules, checked on every test run (issue 15's acceptance, kept so).

ruff enforces the layering (TID251) and function-local imports (PLC0415); these tests hold
what no linter rule states: function length, one PAE encoder and one spelling of
object-key prefixes (the floors of the core are held by test_layers.py).
"""

from __future__ import annotations

import ast
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
MAX_FUNCTION_LINES = 80
#: The relgate distribution: the core and the Dagster layer.
CORE_TREES = ("relgate/", "assets/", "resources/", "sensors/", "pipelines/")


def _python_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "*.py"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout.split()
    return [f for f in listed if "/proto/" not in f and (ROOT / f).exists()]


def _long_functions(path: str) -> list[str]:
    tree = ast.parse((ROOT / path).read_text(), filename=path)
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
            length = (node.end_lineno or node.lineno) - node.lineno + 1
            if length > MAX_FUNCTION_LINES:
                found.append(f"{path}:{node.lineno} {node.name} ({length} lines)")
    return found


def test_no_function_is_longer_than_80_lines() -> None:
    offenders = [hit for path in _python_files() for hit in _long_functions(path)]
    assert offenders == []


def test_one_pae_encoder() -> None:
    """DSSE's pre-authentication encoding is written once, in relgate-trust's dsse module."""
    spelled = [
        f
        for f in _python_files()
        if not f.startswith(("tests/", "agent/tests/", "trust/tests/"))
        and 'b"DSSEv1' in (ROOT / f).read_text()
    ]
    assert spelled == ["trust/relgate_trust/dsse.py"]


def test_object_key_prefixes_are_spelled_only_in_the_layout_module() -> None:
    """``manifests/``, ``cas/sha256/`` and ``shards/sha256/`` appear in one core module."""
    prefixes = ('"manifests/', '"cas/sha256/', '"shards/sha256/')
    spelled = [
        f
        for f in _python_files()
        if f.startswith(CORE_TREES) and any(p in (ROOT / f).read_text() for p in prefixes)
    ]
    assert spelled == ["relgate/objects/layout.py"]
