"""Progress bars on the long commands: drawn on a terminal, never under --json or a pipe.

The real ``relgate`` process runs with its stderr on a pseudo-terminal (``pty``), on a
pipe, and with ``--json``; the bars (rich, on stderr) appear only in the first case, and
stdout is the same one JSON object in every case.
"""

import json
import os
import pty
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from relgate.progress import reporting, task, track

RELGATE = [sys.executable, "-m", "relgate.cli"]


@pytest.fixture(scope="module")
def home(tmp_path_factory):
    path = tmp_path_factory.mktemp("progress") / "home"
    for args in (("init",), ("demo", "seed", "--tickets", "80")):
        subprocess.run([*RELGATE, "--home", str(path), *args], check=True, capture_output=True)
    return path


def _on_a_terminal(home: Path, *args: str) -> tuple[int, str, str]:
    """(exit code, stdout, what reached the terminal on stderr)."""
    master, slave = pty.openpty()
    env = {**os.environ, "TERM": "xterm-256color", "COLUMNS": "120"}
    proc = subprocess.Popen(
        [*RELGATE, "--home", str(home), *args],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=slave,
        env=env,
    )
    os.close(slave)
    chunks: list[bytes] = []

    def drain() -> None:  # a pty has a small buffer: read while the command writes
        while True:
            try:
                data = os.read(master, 65536)
            except OSError:  # EIO: the last writer closed the terminal
                return
            if not data:
                return
            chunks.append(data)

    reader = threading.Thread(target=drain, daemon=True)
    reader.start()
    out, _ = proc.communicate(timeout=300)
    reader.join(timeout=30)
    os.close(master)
    return proc.returncode, out.decode(), b"".join(chunks).decode(errors="replace")


def _on_a_pipe(home: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [*RELGATE, "--home", str(home), *args],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "TERM": "xterm-256color"},
    )


def test_snapshot_build_validate_and_gc_plan_and_sweep_draw_bars_on_a_terminal(home):
    code, out, terminal = _on_a_terminal(home, "snapshot", "build", "--alias", "bars")
    assert code == 0, terminal
    assert "select members" in terminal
    assert "recompute sources" in terminal  # build validates: 3 sources recomputed
    assert "3/3" in terminal
    digest = next(line for line in out.splitlines() if "sha256:" in line)
    assert digest
    code, _out, terminal = _on_a_terminal(home, "gc", "plan")
    assert code == 0, terminal
    assert "list stored objects" in terminal and "mark retained versions" in terminal
    code, _out, terminal = _on_a_terminal(home, "gc", "sweep", "--yes", "--grace", "0s")
    assert code == 0, terminal
    assert "mark retained versions" in terminal and "sweep batches" in terminal


def test_a_command_without_a_long_loop_draws_nothing_on_a_terminal(home):
    code, out, terminal = _on_a_terminal(home, "fence", "show")
    assert code == 0 and terminal == ""
    assert "tombstoneWatermark: 0" in out


def test_no_bars_under_json_even_on_a_terminal(home):
    code, out, terminal = _on_a_terminal(home, "snapshot", "build", "--alias", "quiet", "--json")
    assert code == 0, terminal
    assert "select members" not in terminal and "recompute sources" not in terminal
    doc = json.loads(out)
    assert doc["snapshot"].startswith("sha256:")
    code, out, terminal = _on_a_terminal(home, "gc", "plan", "--json")
    assert code == 0 and terminal == ""
    assert json.loads(out)["mode"] == "plan"


def test_no_bars_when_stderr_is_not_a_terminal(home):
    proc = _on_a_pipe(home, "gc", "plan")
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    assert "list stored objects" not in proc.stdout


class _Recorder:
    """A real :class:`relgate.progress.Reporter` that remembers what it was told."""

    def __init__(self) -> None:
        self.events: list[tuple[str, object, object]] = []

    def begin(self, description, total):
        self.events.append(("begin", description, total))
        return len(self.events)

    def advance(self, handle, steps):
        self.events.append(("advance", handle, steps))

    def end(self, handle):
        self.events.append(("end", handle, None))


def test_tasks_reach_the_installed_reporter_and_nobody_else():
    assert list(track(range(3), "unheard")) == [0, 1, 2]  # nobody listens: just the items
    recorder = _Recorder()
    with reporting(recorder):
        assert list(track(iter("ab"), "letters", total=2)) == ["a", "b"]
        with task("open-ended") as open_ended:
            open_ended.advance(5)
    assert recorder.events == [
        ("begin", "letters", 2),
        ("advance", 1, 1),
        ("advance", 1, 1),
        ("end", 1, None),
        ("begin", "open-ended", None),
        ("advance", 5, 5),
        ("end", 5, None),
    ]
    assert list(track(range(2), "after")) == [0, 1]
    assert len(recorder.events) == 7  # the reporter was uninstalled with the block


def test_release_build_and_verify_draw_bars_on_a_terminal(home):
    built = _on_a_pipe(home, "snapshot", "build", "--alias", "rel", "--json")
    digest = json.loads(built.stdout)["snapshot"]
    assert _on_a_pipe(home, "snapshot", "approve", digest, "--approver", "ann").returncode == 0
    release = _on_a_pipe(home, "release", "build", digest, "--shard-mb", "1", "--json")
    assert release.returncode == 0 and release.stderr == ""
    root = json.loads(release.stdout)["release"]
    # The same build again on a terminal (the same root: its objects already stored).
    code, out, terminal = _on_a_terminal(home, "release", "build", digest, "--shard-mb", "1")
    assert code == 0 and "write shards" in terminal and root in out
    code, _out, terminal = _on_a_terminal(home, "release", "verify", root)
    assert code == 0 and "verify shards" in terminal
