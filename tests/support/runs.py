"""Run admission as the JSON object the CLI prints: what the run tests index."""

from __future__ import annotations

from typing import Any

from relgate.integrity.contract import JsonObject
from relgate.runs.admission import admit_run
from relgate.workspace import Workspace


def create_run(ws: Workspace, **admission: Any) -> JsonObject:
    """:func:`relgate.runs.admission.admit_run`, as its wire object."""
    return admit_run(ws, **admission).to_json()
