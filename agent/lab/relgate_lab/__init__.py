"""relgate_lab: the network-namespace lab and fault injection for tests and benchmarks.

Not part of the installed ``relgate_agent`` distribution: tests (``agent/tests/conftest.py``)
and the benchmarks put this directory on ``sys.path``; processes the lab starts get it on
``PYTHONPATH`` (:func:`lab_env`).
"""

from __future__ import annotations

import os
from pathlib import Path

LAB_ROOT = Path(__file__).resolve().parent.parent


def lab_env(env: dict[str, str] | None = None) -> dict[str, str]:
    """``env`` (default: this process's) with the lab tree on ``PYTHONPATH``."""
    out = dict(os.environ if env is None else env)
    parts = [p for p in out.get("PYTHONPATH", "").split(os.pathsep) if p]
    if str(LAB_ROOT) not in parts:
        parts.insert(0, str(LAB_ROOT))
    out["PYTHONPATH"] = os.pathsep.join(parts)
    return out
