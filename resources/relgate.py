"""The one resource every relgate asset uses: an opened workspace."""

import os

import dagster as dg

from relgate.workspace import Workspace


class RelgateResource(dg.ConfigurableResource):  # type: ignore[type-arg]  # Dagster's generic resource base
    """Opens the relgate workspace at ``home`` (default: ``$RELGATE_HOME`` or ./var/relgate)."""

    home: str = ""
    actor: str = "dagster"

    def workspace(self) -> Workspace:
        home = self.home or os.environ.get("RELGATE_HOME") or "var/relgate"
        return Workspace.init(home)
