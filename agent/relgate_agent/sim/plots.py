"""Plots: PNGs of a run (matplotlib, Agg): completion CDF, hosts ready over time, origin
bytes over time, and per-tier link utilisation of the relgate design."""

from __future__ import annotations

from pathlib import Path

import matplotlib as mpl

mpl.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
from matplotlib.figure import Figure

from relgate_agent.sim.designs import DesignRun
from relgate_agent.sim.scenario import Scenario

PLOT_NAMES = ("completion-cdf.png", "hosts-ready.png", "origin-bytes.png", "link-utilization.png")


def ready_curve(sc: Scenario, run: DesignRun) -> tuple[np.ndarray, np.ndarray]:
    """(times, hosts READY) as a step curve from the hosts' own completion times: the
    figures the report's table gives, exact however long a simulation step is (the trace
    is sampled once per step: a naive pull is one long step, which the old plot drew as
    every host ready at its start)."""
    done = np.sort(run.done_at[~np.isnan(run.done_at)])
    return np.concatenate(([0.0], done)), np.arange(0, len(done) + 1, dtype=float)


def _save(fig: Figure, path: Path) -> None:
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write_plots(
    sc: Scenario, runs: dict[str, DesignRun], out: Path, horizon_s: float
) -> list[Path]:
    """Write the four PNGs into ``out``; time axes stop at ``horizon_s``."""
    out.mkdir(parents=True, exist_ok=True)
    paths = [out / n for n in PLOT_NAMES]
    fig, ax = plt.subplots(figsize=(6, 4))
    for name, r in runs.items():
        t = np.sort(r.done_at[~np.isnan(r.done_at)])
        ax.step(t, np.arange(1, len(t) + 1) / sc.hosts, where="post", label=name)
    ax.set(xlabel="seconds", ylabel="fraction of hosts READY", title=f"{sc.name}: completion CDF")
    ax.set_xlim(0, horizon_s)
    ax.legend()
    _save(fig, paths[0])
    for path, ylabel, steps in (
        (paths[1], "hosts READY", True),
        (paths[2], "origin bytes / S", False),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, r in runs.items():
            if steps:
                ax.step(*ready_curve(sc, r), where="post", label=name)
            else:
                origin = np.asarray(r.trace.origin_bytes, dtype=float) / sc.checkpoint_bytes
                ax.plot(r.trace.times, origin, label=name)
        ax.set(xlabel="seconds", ylabel=ylabel, title=f"{sc.name}: {ylabel} over time")
        ax.set_xlim(0, horizon_s)
        ax.legend()
        _save(fig, path)
    fig, ax = plt.subplots(figsize=(6, 4))
    ours = runs.get("relgate") or next(iter(runs.values()))
    for tier, ys in ours.trace.tiers.items():
        ax.plot(ours.trace.times, ys, label=tier)
    ax.set(
        xlabel="seconds",
        ylabel="utilisation (load / capacity)",
        title=f"{sc.name}: {ours.name} links",
    )
    ax.set_xlim(0, horizon_s)
    ax.legend()
    _save(fig, paths[3])
    return paths


__all__ = ["PLOT_NAMES", "ready_curve", "write_plots"]
