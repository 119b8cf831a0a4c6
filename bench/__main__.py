"""Run every benchmark module in bench/ (or those named on the command line).

Each module exposes ``main() -> dict``; its result is written to bench/results/<name>.json
together with the machine it ran on.
"""

from __future__ import annotations

import importlib
import json
import os
import pkgutil
import platform
import sys
import time
from pathlib import Path

RESULTS = Path(__file__).parent / "results"


def machine() -> dict[str, object]:
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor(),
    }


def main(argv: list[str]) -> int:
    names = argv or sorted(
        m.name
        for m in pkgutil.iter_modules([str(Path(__file__).parent)])
        if not m.name.startswith("_")
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    for name in names:
        module = importlib.import_module(f"bench.{name}")
        started = time.time()
        print(f"== bench {name}", flush=True)
        result = module.main()
        out = {"benchmark": name, "started": started, "machine": machine(), "result": result}
        (RESULTS / f"{name}.json").write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
        print(json.dumps(result, indent=2, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
