"""Pictures of bench results: one PNG beside each JSON, drawn from its typed comparisons.

Each comparison is one panel of horizontal bars: the measured figure and the baseline(s)
measured in the same run, each baseline bar annotated with measured / baseline.  The title
is the bench, the workload and the machine.  ``python -m bench`` writes the PNG after the
JSON; for results already on disk:

    python -m bench.plot bench/results/*.json
"""

from __future__ import annotations

import sys
import textwrap
from pathlib import Path

import click
import matplotlib as mpl

mpl.use("Agg")
import matplotlib.pyplot as plt
from matplotlib.axes import Axes

from bench.record import BenchRecord, Comparison

MEASURED_COLOR = "tab:blue"
BASELINE_COLOR = "tab:gray"
# a panel whose bars span more than this factor is drawn on a log axis
LOG_SPAN = 50.0


def png_path(json_path: Path) -> Path:
    """bench/results/gc.quick.json -> bench/results/gc.quick.png"""
    return json_path.with_suffix(".png")


def _title(record: BenchRecord) -> str:
    kind = " (quick)" if record.quick else ""
    machine = f"{record.machine.cpu_count} CPUs, Python {record.machine.python}"
    workload = textwrap.fill(record.workload, width=110)
    return f"bench {record.benchmark}{kind} — {machine}\n{workload}"


def _panel(ax: Axes, c: Comparison) -> None:
    bars = [c.measured, *c.baselines]
    names = [f"{c.measured.name} (measured)", *(b.name for b in c.baselines)]
    values = [b.value for b in bars]
    colors = [MEASURED_COLOR] + [BASELINE_COLOR] * len(c.baselines)
    ys = list(range(len(bars)))[::-1]
    ax.barh(ys, values, color=colors)
    ax.set_yticks(ys, names)
    positive = [v for v in values if v > 0]
    if positive and max(positive) / min(positive) > LOG_SPAN:
        ax.set_xscale("log")
    better = "higher" if c.higher_is_better else "lower"
    ax.set_title(f"{c.quantity} ({c.unit}; {better} is better)", fontsize=10, loc="left")
    right = max(values) if values else 1.0
    for y, bar in zip(ys, bars, strict=True):
        label = f"{bar.value:,.0f}" if abs(bar.value) >= 1000 else f"{bar.value:.4g}"
        if bar is not c.measured:
            ratio = c.ratio(bar)
            label += "" if ratio is None else f"   measured/baseline = {ratio:.3g}x"
        ax.text(bar.value if bar.value > 0 else 0, y, f" {label}", va="center", fontsize=8)
    if ax.get_xscale() == "log":
        ax.set_xlim(min(positive) / 2, right * 30)
    else:
        ax.set_xlim(0, right * 1.6 if right > 0 else 1.0)


def write_png(record: BenchRecord, target: Path) -> Path:
    """Draw ``record``'s comparisons into ``target`` (a PNG) and return it."""
    comparisons = record.comparisons()
    if not comparisons:
        raise ValueError(f"bench {record.benchmark}: the result has no comparison to draw")
    heights = [0.45 * (1 + len(c.baselines)) + 0.6 for c in comparisons]
    fig, axes = plt.subplots(
        len(comparisons),
        1,
        figsize=(10, 1.4 + sum(heights)),
        gridspec_kw={"height_ratios": heights},
        squeeze=False,
    )
    for ax, c in zip(axes[:, 0], comparisons, strict=True):
        _panel(ax, c)
    fig.suptitle(_title(record), fontsize=9, x=0.01, ha="left")
    fig.tight_layout()
    target.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(target, dpi=100)
    plt.close(fig)
    return target


@click.command()
@click.argument("results", nargs=-1, required=True, type=click.Path(exists=True, path_type=Path))
def cli(results: tuple[Path, ...]) -> None:
    """Write <result>.png beside each bench result JSON, from the JSON alone."""
    for path in results:
        written = write_png(BenchRecord.load(path), png_path(path))
        click.echo(str(written))


if __name__ == "__main__":
    sys.exit(cli())


__all__ = ["png_path", "write_png"]
