"""Malformed values for every option and argument of the snapshot, release, run, pin and
fence commands: whatever the value, the exit code is never 1 (an internal error).

In-process through click's CliRunner on one real seeded workspace (a snapshot built,
approved and activated, a release built, verified, approved and published), so an example
costs milliseconds unless it happens to run a real build.  The examples are derandomized
(the same ones every run) and bounded per command group.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from support.workspaces import make_workspace

from relgate.cli.main import main

#: The groups the issue names (and alias, retention); ``run worker`` serves a training rank until its run ends
#: (it is driven by tests/release), so it is not fed here.
GROUPS = ("snapshot", "release", "run", "pin", "fence", "alias", "retention")
SKIPPED = {("run", "worker")}
EXAMPLES_PER_TARGET = 24
#: Commands that may do real work (a build, a verification, a replay): fewer examples.
SLOW = {("snapshot", "build"), ("snapshot", "replay"), ("release", "build"), ("release", "verify")}
SLOW_EXAMPLES = 6

#: Values no option means: empty, signs, overflow, not-a-number, bad digests, paths that
#: are not there or not JSON, control characters and terminal escapes, surrogates, huge.
MALFORMED = [
    "",
    " ",
    "-",
    "0",
    "-1",
    "99999999999999999999999",
    "1e309",
    "nan",
    "sha256:",
    "sha256:zz",
    "sha256:" + "0" * 64,
    "deadbeef",
    "../../etc/passwd",
    "/nonexistent/file.json",
    "\x1b[31mred\x1b[0m",
    "a\nb",
    "bell\x07",
    "\u202eevil",
    "\udcff",
    "é" * 700,
    "{}",
    "30d",
    "2027-13-45T99:00:00Z",
    "=",
    "v1=/nonexistent",
]


def _commands(
    group: click.Group, prefix: tuple[str, ...]
) -> list[tuple[tuple[str, ...], click.Command]]:
    found: list[tuple[tuple[str, ...], click.Command]] = []
    for name, cmd in sorted(group.commands.items()):
        path = (*prefix, name)
        if isinstance(cmd, click.Group):
            found += _commands(cmd, path)
        elif path[:2] not in SKIPPED:
            found.append((path, cmd))
    return found


@pytest.fixture(scope="module")
def home(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """The workspace and the real values (digests, ids, files) examples may draw."""
    tmp = tmp_path_factory.mktemp("fuzz")
    ws = make_workspace(tmp / "home")
    runner = CliRunner()

    def ok(*args: str) -> dict[str, object]:
        result = runner.invoke(main, ["--home", str(ws.home), *args, "--json"])
        assert result.exit_code == 0, (args, result.output)
        body: dict[str, object] = json.loads(result.stdout)
        return body

    snap = str(ok("snapshot", "build", "--alias", "fuzz")["snapshot"])
    ok("snapshot", "approve", snap, "--approver", "carol")
    ok("snapshot", "activate", snap, "--alias", "fuzz")
    root = str(ok("release", "build", snap, "--records-per-shard", "64")["release"])
    ok("release", "verify", root, "--workers", "0")
    ok("release", "approve", root, "--approver", "carol")
    ok("release", "publish", root, "--alias", "fuzz-train")
    not_json = tmp / "not.json"
    not_json.write_text("{ not json")
    real = [snap, snap[7:19], root, root[7:19], "fuzz", "fuzz-train", "forum/0000001", "2"]
    real += ["demo-model-training", "carol", "1", "0"]
    real += [str(not_json), str(tmp), str(ws.home / "relgate.json")]
    ws.close()
    return ws.home, real


def _value(draw: st.DrawFn, real: list[str], *, malformed: bool = False) -> str:
    pools = [
        st.sampled_from(MALFORMED),
        st.text(st.characters(exclude_characters="\x00"), max_size=40),  # argv holds no NUL
        st.integers(min_value=-(2**70), max_value=2**70).map(str),
    ]
    if draw(st.integers(0, 3)):  # mostly: a listed malformed value / a meaningful one
        return draw(st.sampled_from(MALFORMED if malformed else real))
    return draw(st.one_of(pools))


#: Every (command, parameter) of the groups: each is the target of its own examples.
TARGETS = [
    pytest.param(path, param.name, id=f"{' '.join(path)} {param.name}")
    for group in GROUPS
    for path, cmd in _commands(main.commands[group], (group,))  # type: ignore[arg-type]
    for param in cmd.params
    if param.name != "as_json"
]


@st.composite
def invocations(draw: st.DrawFn, path: tuple[str, ...], target: str, real: list[str]) -> list[str]:
    """The command at ``path`` with ``target`` given a malformed value (a flag: present),
    every other required parameter a drawn value and some optional ones too."""
    cmd = main
    for name in path:
        cmd = cmd.commands[name]  # type: ignore[attr-defined]
    args, positional = [*path, "--json"], ["--"]
    for param in cmd.params:
        chosen = param.name == target
        if param.name == "as_json" or not (chosen or param.required or draw(st.booleans())):
            continue
        if isinstance(param, click.Option) and param.is_flag:
            args.append(param.opts[0])
            continue
        value = _value(draw, real, malformed=chosen)
        if isinstance(param, click.Option):
            args += [param.opts[0], value]
        else:  # after "--", so that a value starting with "-" is not read as an option
            positional.append(value)
    return args + positional


@pytest.mark.parametrize(("path", "target"), TARGETS)
def test_no_malformed_value_is_an_internal_error(
    path: tuple[str, ...], target: str, home: tuple[Path, list[str]]
) -> None:
    workspace, real = home

    @settings(
        max_examples=SLOW_EXAMPLES if tuple(path) in SLOW else EXAMPLES_PER_TARGET,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    @given(invocations(path, target, real))
    def check(args: list[str]) -> None:
        result = CliRunner().invoke(main, ["--home", str(workspace), *args])
        assert result.exit_code != 1, (args, result.output, repr(result.exception))
        assert result.exit_code in (0, 2, 3, 4), (args, result.exit_code, result.output)

    check()
