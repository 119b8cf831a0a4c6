"""The fleet simulator on a shipped scenario: relgate's striped chains beside the other designs.

Workload: ``relgate-agent simulate agent/scenarios/<scenario>.toml --json`` in a fresh
process (the seed's fleet by default: 4,096 hosts in 128 racks of 32, 800 GB, 100 Gbps
NICs, 64 MB chunks, 4 MB blocks, k = 8, 2% of hosts failing or slow). The simulator runs
naive pull, a single tree and a BitTorrent-like swarm in the same run; those are the
baselines, and the seed's back-of-envelope (S/B floor, ~2 min for a good design) is
printed beside. The ratio is relgate's p50 over the S/B floor of the scenario.
"""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from bench.record import Comparison, compare

SCENARIOS = Path(__file__).resolve().parents[1] / "agent" / "scenarios"
QUICK: dict[str, Any] = {"scenario": "lab-16"}
TARGETS = {
    "seed-800g-4096": (
        "p50 <= 100 s, 99.5% <= 130 s (p995UnimpairedSeconds: hosts slowed in rx are held to "
        "rxFloorSeconds by their own NIC), origin <= 1.01 x S per DC (seed: 180 s / 300 s)"
    ),
    "lab-16": "p50 <= 1.10 x S/B, all hosts <= 1.20 x S/B, origin <= 1.02 x S",
}
FIGURES = (
    "p50Seconds",
    "p995Seconds",
    "p995UnimpairedSeconds",
    "maxSeconds",
    "originBytesOverS",
    "hostsReady",
)


def _simulate(path: Path) -> tuple[dict[str, Any], float]:
    started = time.perf_counter()
    proc = subprocess.run(
        [sys.executable, "-m", "relgate_agent", "simulate", str(path), "--json"],
        capture_output=True,
        text=True,
        timeout=900,
        check=False,
    )
    elapsed = time.perf_counter() - started
    if proc.returncode != 0:
        raise RuntimeError(f"simulate {path.name} exited {proc.returncode}: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1]), elapsed


def main(scenario: str = "seed-800g-4096") -> dict[str, Any]:
    path = SCENARIOS / f"{scenario}.toml"
    result, elapsed = _simulate(path)
    envelope = result["envelope"]
    floor = envelope["sOverBSeconds"]
    designs = result["designs"]
    return {
        "workload": f"relgate-agent simulate {path.name} ({result.get('hosts')} hosts, "
        f"{result.get('checkpointBytes')} bytes); simulator wall {elapsed:.1f} s",
        "relgate": {k: result.get(k) for k in FIGURES},
        "baseline": {
            name: {k: figures.get(k) for k in FIGURES}
            for name, figures in designs.items()
            if name != "relgate"
        },
        "seedBackOfEnvelope": envelope,
        "ratio": round(result["p50Seconds"] / floor, 3),
        "ratioMeaning": "relgate p50 / (S/B)",
        "target": TARGETS.get(scenario, TARGETS["seed-800g-4096"]),
        "simulatorSeconds": round(elapsed, 1),
        "peakRssMiB": round(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss / 1024, 1),
    }


def comparisons(result: dict[str, Any]) -> list[Comparison]:
    """The simulated relgate fleet against S/B and the simulated baseline designs."""
    ours, designs = result["relgate"], result["baseline"]
    sb = result["seedBackOfEnvelope"]["sOverBSeconds"]

    def others(key: str) -> list[tuple[str, float]]:
        return [(name, d[key]) for name, d in sorted(designs.items())]

    return [
        compare(
            "p50 READY time",
            "s",
            ("relgate", ours["p50Seconds"]),
            ("S/B", sb),
            *others("p50Seconds"),
        ),
        compare("max READY time", "s", ("relgate", ours["maxSeconds"]), *others("maxSeconds")),
        compare(
            "origin bytes",
            "x S",
            ("relgate", ours["originBytesOverS"]),
            *others("originBytesOverS"),
        ),
    ]
