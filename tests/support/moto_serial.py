"""Run a ``moto_server`` script with werkzeug's threading off: one request at a time.

Usage: ``python moto_serial.py <path to moto_server> [moto_server args...]``.

moto 5.2.5 implements ``If-None-Match: *`` as "look up the key, then store" inside a
threaded server with no lock between the two steps, so two concurrent conditional
creates of one key can both succeed (seen in the 4-process stress: a few double winners
per few hundred contended keys).  Real S3 evaluates the condition atomically.  Serving
requests one at a time makes each request atomic, which is the S3 guarantee the
conditional-create tests rely on; concurrency between clients is unchanged.
"""

from __future__ import annotations

import runpy
import sys
from pathlib import Path
from typing import Any

import werkzeug.serving

_run_simple = werkzeug.serving.run_simple


def _run_simple_serial(*args: Any, **kwargs: Any) -> None:
    kwargs["threaded"] = False
    _run_simple(*args, **kwargs)


if __name__ == "__main__":
    # Running this file put tests/support first on sys.path; nothing there may shadow
    # the moto package.
    sys.path[:] = [p for p in sys.path if Path(p).resolve() != Path(__file__).resolve().parent]
    # Patch before the script imports moto.server (which binds run_simple by name).
    werkzeug.serving.run_simple = _run_simple_serial
    script, *rest = sys.argv[1:]
    sys.argv = [script, *rest]
    runpy.run_path(script, run_name="__main__")
