"""The ``simulate`` command: run a fleet scenario through every design (relgate_agent.sim)."""

from __future__ import annotations

from pathlib import Path

import click

from relgate_agent.cli.params import common, output


@click.command("simulate", help="simulate a fleet scenario (TOML); compare relgate with baselines")
@common
@click.argument("scenario", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--plots", "plots_dir", type=click.Path(file_okay=False, path_type=Path), default=None
)
@click.option(
    "--design",
    "designs",
    multiple=True,
    type=click.Choice(["relgate", "naive", "tree", "swarm"]),
    help="run only these designs (default: all)",
)
def simulate(scenario: Path, plots_dir: Path | None, designs: tuple[str, ...]) -> int:
    """Flow-level simulation of one distribution; prints one JSON object with --json."""
    from relgate_agent.sim.comparison import plot
    from relgate_agent.sim.comparison import simulate as run
    from relgate_agent.sim.designs import DESIGNS
    from relgate_agent.sim.scenario import load_scenario

    sim = run(load_scenario(scenario), designs or DESIGNS)
    doc = sim.to_json()
    if plots_dir is not None:
        doc["plots"] = [str(p) for p in plot(sim, plots_dir)]
    output().emit(doc)
    return 0
