"""Launch jobs the way the UI does: through ``workspace.yaml``, the instance's run queue and
its run launcher, so every run carries the code location's origin.

A run executed in process (``execute_in_process``) has no code-location origin: the UI
lists it under no job and cannot re-execute it.  :class:`CodeLocationRuns` instead runs
``dagster-daemon`` (which dequeues runs under the instance's limits and launches each in a
process of its own, as in production) for as long as it is open, loads ``workspace.yaml``
once (one code server for every submission, as ``dagster job launch -w workspace.yaml``
would load per run: ~4 s each), queues each run through it and waits, bounded, for it to
finish.  The submission uses the launch command's own steps (``dagster._cli``; dagster is
pinned in requirements.lock).  What a run
did is read back from the instance: its materializations, check evaluations and step
failures from the event log, and asset values through the code location's I/O manager.
The daemon runs in a session of its own, logs to ``$DAGSTER_HOME/logs/daemon.log``, and
is stopped by PID when the context closes.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Any

import click
import dagster as dg
from dagster import __version__ as dagster_version
from dagster._check import CheckError
from dagster._cli.job import _create_run
from dagster._cli.workspace.cli_target import (
    get_code_location_from_workspace,
    get_remote_job_from_remote_repo,
    get_remote_repository_from_code_location,
    get_workspace_from_cli_opts,
)
from dagster._core.workspace.context import WorkspaceRequestContext
from dagster_shared.cli import WorkspaceOpts

ROOT = Path(__file__).resolve().parents[1]
WORKSPACE = ROOT / "workspace.yaml"
#: How long one run may take, from submission to a terminal status.
RUN_TIMEOUT_S = 900.0
POLL_S = 0.5
STOP_GRACE_S = 15.0
TERMINAL = {
    dg.DagsterRunStatus.SUCCESS,
    dg.DagsterRunStatus.FAILURE,
    dg.DagsterRunStatus.CANCELED,
}


class LaunchError(RuntimeError):
    """The run could not be submitted, or did not finish within its bound."""


@dataclass(frozen=True)
class LaunchedRun:
    """A finished run of the code location, read back from the instance."""

    instance: dg.DagsterInstance
    run_id: str
    job: str
    status: dg.DagsterRunStatus

    @property
    def success(self) -> bool:
        return self.status == dg.DagsterRunStatus.SUCCESS

    def _events(self, kind: dg.DagsterEventType) -> list[dg.DagsterEvent]:
        return [
            entry.dagster_event
            for entry in self.instance.all_logs(self.run_id, of_type=kind)
            if entry.dagster_event is not None
        ]

    def metadata(self, asset: str) -> dict[str, Any]:
        """The values of the last materialization of ``asset`` in this run ({} if none)."""
        found: dict[str, Any] = {}
        for event in self._events(dg.DagsterEventType.ASSET_MATERIALIZATION):
            materialization = event.event_specific_data.materialization  # type: ignore[union-attr]
            if materialization.asset_key == dg.AssetKey(asset):
                found = {k: v.value for k, v in materialization.metadata.items()}
        return found

    def check_evaluations(self) -> list[dg.AssetCheckEvaluation]:
        return [
            event.event_specific_data  # type: ignore[misc]
            for event in self._events(dg.DagsterEventType.ASSET_CHECK_EVALUATION)
        ]

    def step_failures(self) -> list[tuple[str, str]]:
        """(step key, the innermost error message) for every failed step."""
        failures = []
        for event in self._events(dg.DagsterEventType.STEP_FAILURE):
            data = event.step_failure_data
            error = data.error if data is not None else None
            while error is not None and error.cause is not None:
                error = error.cause
            message = error.message.strip() if error is not None else "failed"
            failures.append((event.step_key or "?", message))
        return failures


class CodeLocationRuns:
    """Open: a run daemon over ``$DAGSTER_HOME``; :meth:`launch` submits and awaits runs."""

    def __init__(self, instance: dg.DagsterInstance, workspace: Path = WORKSPACE) -> None:
        self.instance = instance
        self.workspace = workspace
        self._daemon: subprocess.Popen[bytes] | None = None
        self._stack = contextlib.ExitStack()
        self._workspace: WorkspaceRequestContext | None = None
        self._bin = Path(sys.executable).parent
        # the daemon, the CLI and every run they start use this instance, whatever the
        # caller's environment says
        self._env = {**os.environ, "DAGSTER_HOME": str(instance.root_directory)}

    def __enter__(self) -> CodeLocationRuns:
        logs = Path(self.instance.root_directory) / "logs"
        logs.mkdir(parents=True, exist_ok=True)
        with (logs / "daemon.log").open("ab") as log:
            self._daemon = subprocess.Popen(  # noqa: S603 - our venv's dagster-daemon
                [str(self._bin / "dagster-daemon"), "run", "-w", str(self.workspace)],
                cwd=self.workspace.parent,
                env=self._env,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        try:
            # workspace.yaml's working_directory "." is the directory Dagster starts in
            with contextlib.chdir(self.workspace.parent):
                self._workspace = self._stack.enter_context(
                    get_workspace_from_cli_opts(
                        self.instance,
                        version=dagster_version,
                        workspace_opts=WorkspaceOpts(workspace=[str(self.workspace)]),
                        log_level="WARNING",  # its start and stop are not news
                    )
                )
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        self._workspace = None
        try:
            self._stack.close()  # the code server the submissions used
        finally:
            self._stop_daemon()

    def _stop_daemon(self) -> None:
        daemon, self._daemon = self._daemon, None
        if daemon is None or daemon.poll() is not None:
            return
        os.killpg(daemon.pid, signal.SIGTERM)
        try:
            daemon.wait(timeout=STOP_GRACE_S)
        except subprocess.TimeoutExpired:
            os.killpg(daemon.pid, signal.SIGKILL)
            daemon.wait(timeout=STOP_GRACE_S)

    def submit(
        self, job: str, run_config: Mapping[str, object], tags: Mapping[str, str] | None = None
    ) -> str:
        """Queue one run of ``job`` through the workspace; its run id."""
        if self._workspace is None:
            raise LaunchError(f"{job}: the workspace is not open")
        try:
            location = get_code_location_from_workspace(self._workspace, None)
            repo = get_remote_repository_from_code_location(location, None)
            run: dg.DagsterRun = _create_run(
                instance=self.instance,
                code_location=location,
                remote_repo=repo,
                remote_job=get_remote_job_from_remote_repo(repo, job),
                run_config=run_config,
                tags=dict(tags or {}),
                op_selection=None,
                run_id=str(uuid.uuid4()),
            )
            self.instance.submit_run(run.run_id, self._workspace)
        except (dg.DagsterError, click.UsageError, CheckError) as exc:
            # an unknown job or a code location that failed to load is click's UsageError
            raise LaunchError(f"{job}: not queued: {exc}") from exc
        return str(run.run_id)

    def wait(self, run_id: str, timeout_s: float = RUN_TIMEOUT_S) -> LaunchedRun:
        deadline = time.monotonic() + timeout_s
        while True:
            run = self.instance.get_run_by_id(run_id)
            if run is not None and run.status in TERMINAL:
                return LaunchedRun(self.instance, run_id, run.job_name, run.status)
            if self._daemon is None or self._daemon.poll() is not None:
                raise LaunchError(f"run {run_id}: the run daemon is not running")
            if time.monotonic() > deadline:
                raise LaunchError(f"run {run_id}: not finished within {timeout_s:.0f} s")
            time.sleep(POLL_S)

    def launch(
        self, job: str, run_config: Mapping[str, object], tags: Mapping[str, str] | None = None
    ) -> LaunchedRun:
        return self.wait(self.submit(job, run_config, tags))
