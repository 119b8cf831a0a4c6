"""Where a published checkpoint version lives: ``checkpoints/<model>/<version>/`` under the
workspace, holding the immutable ``origin/`` copy and the signed ``manifest.dsse.json``."""

from __future__ import annotations

from pathlib import Path

from relgate_trust.errors import ManifestError
from relgate_trust.manifest import validate_name

from relgate.errors import UsageError
from relgate.workspace import Workspace

ENVELOPE_NAME = "manifest.dsse.json"
ORIGIN_NAME = "origin"


def checkpoint_root(ws: Workspace) -> Path:
    """The directory every published checkpoint version lives under."""
    return ws.home / "checkpoints"


def version_dir(ws: Workspace, model: str, version: str) -> Path:
    """``checkpoints/<model>/<version>`` (names not checked: see :func:`validate_names`)."""
    return checkpoint_root(ws) / model / version


def validate_names(model: str, version: str) -> None:
    """Model and version must be safe path segments (exit 2, check ``checkpoint-name``)."""
    try:
        validate_name("model", model)
        validate_name("version", version)
    except ManifestError as exc:
        raise UsageError(str(exc), object=f"{model}/{version}", check="checkpoint-name") from None
