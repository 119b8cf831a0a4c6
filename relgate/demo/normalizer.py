"""The demo's pinned transforms: build their wheels, register them, tag them.

Each transform is its own small distribution (``relgate/demo/normalize_transform/`` for
the text corpus, ``relgate/demo/identity_transform/`` for the token-id and image corpora;
never imported by relgate).  ``relgate demo seed`` and ``make demo`` build its wheel with pip
(``pip wheel --no-deps --no-build-isolation`` with the ``flit_core`` backend, in a copy of the source so the tree stays
clean, ``SOURCE_DATE_EPOCH`` fixed so the same source gives the same wheel digest),
register it in the workspace and point ``registry.local/normalize:v1`` at its digest.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Final

from relgate.documents.transform_spec import WheelTransform
from relgate.errors import RelgateError
from relgate.snapshot.transform_tags import tag_transform
from relgate.transforms.registry import register_wheel
from relgate.workspace import Workspace

PACKAGE_DIR: Final = Path(__file__).with_name("normalize_transform")
DEMO_TAG: Final = "registry.local/normalize:v1"
#: Every demo transform: tag -> its package directory (text demo: normalize; token-id and
#: image demos: identity).
DEMO_PACKAGES: Final = {
    DEMO_TAG: PACKAGE_DIR,
    "registry.local/identity:v1": Path(__file__).with_name("identity_transform"),
}
#: 1980-01-01, the earliest time a zip can hold: reproducible wheels.
_EPOCH: Final = "315532800"


def _pip_wheel(out: Path, source: Path) -> list[str]:
    """``pip wheel`` for ``source``: no build isolation when the backend (flit_core, a dev
    dependency) is installed here, else pip fetches it into an isolated build env."""
    isolation = (
        []
        if importlib.util.find_spec("flit_core") is None
        else ["--no-build-isolation", "--no-index"]
    )
    return [
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        *isolation,
        "-q",
        "-w",
        str(out),
        str(source),
    ]


def build_demo_wheel(out: Path, source: Path = PACKAGE_DIR) -> Path:
    """Build the wheel of ``source`` (a package directory) into ``out``; its path."""
    with tempfile.TemporaryDirectory(prefix="relgate-wheel-") as tmp:
        copy = Path(tmp) / "src"
        shutil.copytree(
            source, copy, ignore=shutil.ignore_patterns("build", "*.egg-info", "__pycache__")
        )
        proc = subprocess.run(  # noqa: S603 this Python's pip on a directory we just copied
            _pip_wheel(out, copy),
            env={**os.environ, "SOURCE_DATE_EPOCH": _EPOCH, "PIP_DISABLE_PIP_VERSION_CHECK": "1"},
            capture_output=True,
            text=True,
            check=False,
        )
    wheels = sorted(out.glob("*.whl"))
    if proc.returncode != 0 or len(wheels) != 1:
        raise RelgateError(
            "building the demo transform wheel failed",
            object=str(source),
            check="demo-wheel",
            details={"exitCode": proc.returncode, "stderr": proc.stderr[-2000:]},
        )
    return wheels[0]


def register_demo_transforms(ws: Workspace) -> dict[str, WheelTransform]:
    """Build, register and tag every demo transform; tag -> pin."""
    pins = {}
    for tag, source in DEMO_PACKAGES.items():
        with tempfile.TemporaryDirectory(prefix="relgate-demo-wheel-") as tmp:
            spec = register_wheel(ws.db, ws.cas, build_demo_wheel(Path(tmp), source))
        tag_transform(ws.db, tag, spec.pin)
        pins[tag] = spec
    return pins
