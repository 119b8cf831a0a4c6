"""Run the benchmarks in bench/: all of them, the quick set, or one with its own sizes.

Each module exposes ``main(**sizes) -> dict`` (keyword arguments with full-size defaults) and
``QUICK: dict[str, int]``, the sizes ``make bench-quick`` uses (a module without it is
left out of the quick run and says so).  Every result is written to
bench/results/<name>.json (``<name>.quick.json`` for quick runs) together with the machine,
and beside it <name>[.quick].png: the module's ``comparisons(result)`` (its figures against
the baselines measured in the same run) drawn by bench/plot.py.

    python -m bench                       # every module, full size
    python -m bench --quick               # every module at its QUICK sizes
    python -m bench snapshots --members 2000000
    python -m bench releases gc           # several modules, full size
"""

from __future__ import annotations

import importlib
import inspect
import json
import os
import pkgutil
import platform
import sys
import time
from pathlib import Path
from types import ModuleType
from typing import Any

import click

from bench.plot import png_path, write_png
from bench.record import BenchRecord, Machine

RESULTS = Path(__file__).parent / "results"
# bench/ modules that are the runner's library, not benchmarks
LIBRARY = frozenset({"plot", "record"})


def machine() -> dict[str, object]:
    return {
        "cpu_count": os.cpu_count(),
        "platform": platform.platform(),
        "python": platform.python_version(),
        "processor": platform.processor(),
    }


def modules() -> list[str]:
    return sorted(
        m.name
        for m in pkgutil.iter_modules([str(Path(__file__).parent)])
        if not m.name.startswith("_") and m.name not in LIBRARY
    )


def sizes_of(module: ModuleType) -> dict[str, Any]:
    """The module's size parameters: main's keyword arguments and their defaults."""
    params = inspect.signature(module.main).parameters.values()
    return {p.name: p.default for p in params if p.default is not inspect.Parameter.empty}


def run(name: str, sizes: dict[str, Any], *, quick: bool) -> dict[str, Any]:
    module = importlib.import_module(f"bench.{name}")
    chosen = {**sizes_of(module), **(getattr(module, "QUICK", {}) if quick else {}), **sizes}
    print(f"== bench {name} {json.dumps(chosen, sort_keys=True)}", flush=True)
    started = time.time()
    result: dict[str, Any] = module.main(**chosen)
    record = BenchRecord(
        benchmark=name,
        sizes=chosen,
        quick=quick,
        started=started,
        machine=Machine.model_validate(machine()),
        result=result,
    )
    RESULTS.mkdir(parents=True, exist_ok=True)
    target = RESULTS / (f"{name}.quick.json" if quick else f"{name}.json")
    target.write_text(record.dumps())
    print(json.dumps(result, indent=2, sort_keys=True), flush=True)
    print(f"== bench {name}: {write_png(record, png_path(target))}", flush=True)
    return result


def _number(value: str) -> Any:
    """``"4096"`` -> 4096, ``"0.95"`` -> 0.95, anything else stays the string it is."""
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _parse_sizes(extra: list[str]) -> dict[str, Any]:
    """``--members 1000 --versions 20`` -> ``{"members": 1000, "versions": 20}``."""
    sizes: dict[str, Any] = {}
    it = iter(extra)
    for flag in it:
        if not flag.startswith("--"):
            raise click.UsageError(f"expected --size VALUE, got {flag!r}")
        key = flag[2:].replace("-", "_")
        value = next(it, None)
        if value is None:
            raise click.UsageError(f"{flag} needs a value")
        sizes[key] = _number(value)
    return sizes


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True})
@click.option("--quick", is_flag=True, help="Use each module's QUICK sizes (make bench-quick).")
@click.option("--list", "list_only", is_flag=True, help="Print the modules and their sizes.")
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def cli(quick: bool, list_only: bool, args: tuple[str, ...]) -> None:
    """Run benchmark modules; size options (--members N ...) apply to the named module."""
    names = [a for a in args if not a.startswith("--") and a in modules()]
    extra = list(args[len(names) :]) if names and list(args[: len(names)]) == names else []
    if not names and args:
        raise click.UsageError(
            f"unknown benchmark in {' '.join(args)}; have {', '.join(modules())}"
        )
    if list_only:
        for name in names or modules():
            module = importlib.import_module(f"bench.{name}")
            click.echo(f"{name}: {sizes_of(module)} quick={getattr(module, 'QUICK', {})}")
        return
    sizes = _parse_sizes(extra)
    if sizes and len(names) != 1:
        raise click.UsageError("size options need exactly one benchmark name")
    for name in names or modules():
        if quick and not hasattr(importlib.import_module(f"bench.{name}"), "QUICK"):
            click.echo(f"== bench {name}: no QUICK sizes, left out of the quick run")
            continue
        run(name, sizes, quick=quick)


if __name__ == "__main__":
    sys.exit(cli())
