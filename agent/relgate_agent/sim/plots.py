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
    for path, key, ylabel, scale in (
        (paths[1], "ready", "hosts READY", 1.0),
        (paths[2], "origin", "origin bytes / S", 1.0 / sc.checkpoint_bytes),
    ):
        fig, ax = plt.subplots(figsize=(6, 4))
        for name, r in runs.items():
            ys = r.trace.ready if key == "ready" else r.trace.origin_bytes
            ax.plot(r.trace.times, np.asarray(ys, dtype=float) * scale, label=name)
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


__all__ = ["PLOT_NAMES", "write_plots"]
