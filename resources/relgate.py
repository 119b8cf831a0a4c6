"""The one resource every relgate asset uses: an opened workspace.

The workspace is opened (never created, migrated or rewritten: ``relgate init`` and
``relgate migrate`` do that) once per process or step, on first use, and closed when the
step's resources are torn down.  Opening reads ``relgate.json`` and nothing is written to
the workspace directory, so a read-only mount of an initialised workspace serves every
asset, sensor and job (docs/deploy.md).  Deployments set ``home`` with
``dg.EnvVar("RELGATE_HOME")``.

Who acted: the gate records the Dagster run's launcher when the run names one (the
``dagster/user`` or ``user`` tag), else the schedule or sensor that requested the run,
else ``actor``.
"""

from __future__ import annotations

import os

import dagster as dg
from pydantic import Field, PrivateAttr

from relgate.workspace import Workspace

#: Run tags that name the person who launched a run, first match wins.
USER_TAGS = ("dagster/user", "user")
#: Run tags that name the automation that requested a run: (tag, actor prefix).
AUTOMATION_TAGS = (("dagster/schedule_name", "schedule"), ("dagster/sensor_name", "sensor"))


def run_actor(tags: dict[str, str], default: str) -> str:
    """Who a run acts for, from its tags (see the module docstring)."""
    for tag in USER_TAGS:
        if tags.get(tag):
            return tags[tag]
    for tag, kind in AUTOMATION_TAGS:
        if tags.get(tag):
            return f"{kind}:{tags[tag]}"
    return default


class RelgateResource(dg.ConfigurableResource):  # type: ignore[type-arg]  # Dagster's generic resource base
    """Opens the relgate workspace at ``home`` once per step (default: ``$RELGATE_HOME`` or
    ./var/relgate) and records gate actions as the run's launcher."""

    home: str = Field(
        default="",
        description="The workspace directory ('' = $RELGATE_HOME, else ./var/relgate); set it"
        " with dg.EnvVar('RELGATE_HOME') in a deployment.",
    )
    actor: str = Field(
        default="dagster",
        description="Who the gate records when the run names no user, schedule or sensor.",
    )
    _ws: Workspace | None = PrivateAttr(default=None)
    _run_actor: str | None = PrivateAttr(default=None)

    def setup_for_execution(self, context: dg.InitResourceContext) -> None:
        run = context.run
        self._run_actor = run_actor(dict(run.tags), self.actor) if run is not None else None

    def teardown_after_execution(self, context: dg.InitResourceContext) -> None:
        if self._ws is not None:
            self._ws.close()
            self._ws = None

    @property
    def workspace_home(self) -> str:
        return self.home or os.environ.get("RELGATE_HOME") or "var/relgate"

    def workspace(self) -> Workspace:
        """The opened workspace (opened on first use, kept for the step)."""
        if self._ws is None:
            self._ws = Workspace.open(self.workspace_home)
        return self._ws

    def run_actor(self) -> str:
        """Who this step acts for (the run's launcher, schedule or sensor, else ``actor``)."""
        return self._run_actor or self.actor
