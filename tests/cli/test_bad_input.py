"""Bad input at the command line is a usage error or a refusal (exit 2 or 3) that names the
argument, file or object and the check, never an internal error (exit 1).  Run in-process
through click's CliRunner on a real seeded workspace (cheap: no subprocess per command)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from click.testing import CliRunner, Result
from support.workspaces import make_workspace

from relgate.cli.main import main
from relgate.snapshot.build import EMPTY_SELECTION, SOURCE_UNKNOWN
from relgate.workspace import Workspace


@pytest.fixture(scope="module")
def ws(tmp_path_factory: pytest.TempPathFactory) -> Workspace:
    ws = make_workspace(tmp_path_factory.mktemp("bad-input") / "home")
    ws.config["sources"].append({"id": "nothing", "kind": "object-prefix", "prefix": "raw/none/"})
    ws.save()
    return ws


def cli(home: Path, *args: str, env: dict[str, str] | None = None) -> Result:
    return CliRunner().invoke(main, ["--home", str(home), *args, "--json"], env=env)


def refused(result: Result, code: int = 3) -> dict[str, object]:
    """The one JSON object a refusal printed (asserting its exit code)."""
    assert result.exit_code == code, (result.exit_code, result.output, result.exception)
    lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert len(lines) == 1, result.stdout
    body: dict[str, object] = json.loads(lines[0])
    return body


# -- item 7: refuse what cannot be meant ------------------------------------------------------


def test_an_unknown_source_is_refused_before_anything_is_pinned(ws: Workspace) -> None:
    body = refused(cli(ws.home, "snapshot", "build", "--source", "forum", "--source", "nope"))
    assert body["check"] == SOURCE_UNKNOWN
    assert body["object"] == "source 'nope'"
    # even with --allow-empty: a typo is not an empty selection
    body = refused(cli(ws.home, "snapshot", "build", "--source", "nope", "--allow-empty"))
    assert body["check"] == SOURCE_UNKNOWN


def test_an_empty_selection_is_refused_unless_allowed(ws: Workspace) -> None:
    before = cli(ws.home, "snapshot", "list").stdout
    body = refused(cli(ws.home, "snapshot", "build", "--source", "nothing"))
    assert (body["check"], body["object"]) == (EMPTY_SELECTION, "selection")
    assert cli(ws.home, "snapshot", "list").stdout == before  # no snapshot was recorded
    built = cli(ws.home, "snapshot", "build", "--source", "nothing", "--allow-empty")
    assert built.exit_code == 0, built.output
    assert json.loads(built.stdout)["members"] == 0


def test_a_workspace_without_sources_builds_nothing(tmp_path: Path) -> None:
    bare = make_workspace(tmp_path / "bare", seed=False)
    body = refused(cli(bare.home, "snapshot", "build"))
    assert (body["check"], body["object"]) == (EMPTY_SELECTION, "sources")
