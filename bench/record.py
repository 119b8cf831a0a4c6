"""The typed record of one bench run, as written to ``bench/results/<name>[.quick].json``.

A bench module's ``main(**sizes)`` returns its own result (a JSON object whose shape is the
module's business); ``python -m bench`` wraps it in a :class:`BenchRecord` together with the
sizes, the start time and the machine.  Each module also exposes
``comparisons(result) -> list[Comparison]``: the figures it measured against the baselines
it measured in the same run.  That function is the one place that knows where in a module's
result those figures are; the picture (``bench/plot.py``) is drawn from the typed
comparisons alone.
"""

from __future__ import annotations

import importlib
import json
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator


class Measure(BaseModel):
    """One named figure: ``relgate p50`` = 31.7."""

    model_config = ConfigDict(frozen=True)

    name: str
    value: float = Field(allow_inf_nan=False)


class Comparison(BaseModel):
    """A measured figure and the same-run baseline(s) it is judged against, in one unit."""

    model_config = ConfigDict(frozen=True)

    quantity: str
    unit: str
    measured: Measure
    baselines: tuple[Measure, ...] = Field(min_length=1)
    higher_is_better: bool = False

    def ratio(self, baseline: Measure) -> float | None:
        """measured / baseline, or None where the baseline is zero."""
        return self.measured.value / baseline.value if baseline.value else None


def compare(
    quantity: str,
    unit: str,
    measured: tuple[str, float],
    *baselines: tuple[str, float],
    higher_is_better: bool = False,
) -> Comparison:
    """Shorthand for the bench modules: ``compare("p50", "s", ("relgate", 31.7), ("S/B", 21.5))``."""
    return Comparison(
        quantity=quantity,
        unit=unit,
        measured=Measure(name=measured[0], value=measured[1]),
        baselines=tuple(Measure(name=n, value=v) for n, v in baselines),
        higher_is_better=higher_is_better,
    )


class Machine(BaseModel):
    cpu_count: int | None = None
    platform: str = ""
    python: str = ""
    processor: str = ""


class BenchRecord(BaseModel):
    """``python -m bench``'s JSON for one module.  ``sizes`` and ``quick`` are absent from
    records written before they were recorded (bench/results/transport.json)."""

    benchmark: str
    sizes: dict[str, Any] = Field(default_factory=dict)
    quick: bool = False
    started: float
    machine: Machine
    result: dict[str, Any]

    @field_validator("benchmark")
    @classmethod
    def _module_name(cls, v: str) -> str:
        if not v.isidentifier():
            raise ValueError(f"benchmark {v!r} is not a bench module name")
        return v

    @classmethod
    def load(cls, path: Path) -> BenchRecord:
        return cls.model_validate_json(path.read_bytes())

    def dumps(self) -> str:
        """The file's text: indented, sorted keys, as results have always been written."""
        return json.dumps(self.model_dump(mode="json"), indent=2, sort_keys=True) + "\n"

    @property
    def workload(self) -> str:
        """The result's own workload line where it has one (a text), else the sizes."""
        text = self.result.get("workload")
        if isinstance(text, str):
            return text
        return ", ".join(f"{k}={v}" for k, v in sorted(self.sizes.items())) or "default sizes"

    def comparisons(self) -> list[Comparison]:
        """The module's ``comparisons(result)``: every bench module defines one."""
        module = importlib.import_module(f"bench.{self.benchmark}")
        return list(module.comparisons(self.result))


__all__ = ["BenchRecord", "Comparison", "Machine", "Measure", "compare"]
