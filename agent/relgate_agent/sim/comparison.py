"""Comparison: one scenario through every design (the ``simulate`` command's body)."""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from relgate_agent.sim.designs import DESIGNS, DesignRun, run_design
from relgate_agent.sim.report import summary
from relgate_agent.sim.scenario import Scenario


@dataclass(frozen=True)
class Simulation:
    scenario: Scenario
    runs: dict[str, DesignRun]
    elapsed_s: float

    def to_json(self) -> dict[str, object]:
        return summary(self.scenario, self.runs, self.elapsed_s)

    def horizon_s(self) -> float:
        """The plots' time axis: 1.5 x ours' last READY (the slow baselines run off it)."""
        ours = self.runs.get("relgate")
        done = ours.done_at[~np.isnan(ours.done_at)] if ours is not None else np.zeros(0)
        last = float(done.max()) if len(done) else 0.0
        return 1.5 * last if last > 0 and math.isfinite(last) else 1.0


def simulate(sc: Scenario, designs: tuple[str, ...] = DESIGNS) -> Simulation:
    start = time.monotonic()
    runs = {name: run_design(sc, name) for name in designs}
    return Simulation(sc, runs, time.monotonic() - start)


def plot(sim: Simulation, out: Path) -> list[Path]:
    from relgate_agent.sim.plots import write_plots  # noqa: PLC0415 - matplotlib only when asked

    return write_plots(sim.scenario, sim.runs, out, sim.horizon_s())


__all__ = ["Simulation", "plot", "simulate"]
