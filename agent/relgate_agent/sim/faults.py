"""Faults: a scenario's faults resolved to hosts and times, the same for every design.

Hosts for ``fail``/``slow``/``rate_limit`` are drawn once from the scenario's seed
(distinct hosts across faults), so every compared design meets the same fleet.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relgate_agent.sim.network import Fabric
from relgate_agent.sim.scenario import Scenario


@dataclass(frozen=True)
class Incident:
    at_s: float
    kind: str  # fail | slow | rate_limit | failover | root_fail
    hosts: tuple[int, ...] = ()
    direction: str = "rx"
    factor: float = 1.0
    rate: float = 0.0
    pause_s: float = 0.0
    stripe: int = 0


def plan_incidents(sc: Scenario) -> list[Incident]:
    rng = np.random.default_rng(sc.seed)
    pool = [int(h) for h in rng.permutation(sc.hosts)]
    out: list[Incident] = []
    for f in sc.faults:
        hosts: tuple[int, ...] = ()
        if f.count:
            hosts, pool = tuple(pool[: f.count]), pool[f.count :]
        out.append(
            Incident(f.at_s, f.kind, hosts, f.direction, f.factor, f.rate, f.pause_s, f.stripe)
        )
    return sorted(out, key=lambda i: i.at_s)


def apply_capacity(fabric: Fabric, inc: Incident) -> None:
    """A slow host (NIC at ``factor`` in rx or tx) or a rate-limited serving host (tx)."""
    for h in inc.hosts:
        if inc.kind == "slow":
            if inc.direction in ("rx", "both"):
                fabric.caps[fabric.rx(h)] *= inc.factor
            if inc.direction in ("tx", "both"):
                fabric.caps[fabric.tx(h)] *= inc.factor
        elif inc.kind == "rate_limit":
            fabric.caps[fabric.tx(h)] = min(fabric.caps[fabric.tx(h)], inc.rate)


__all__ = ["Incident", "apply_capacity", "plan_incidents"]
