"""Designs: the distribution schemes compared in one run, on the same fabric and faults.

``relgate``: striped rack-aware chains run by the real coordinator (:mod:`.agents`).
``naive``: every host pulls the whole checkpoint from the origin. ``tree``: one
pipelined fanout tree over the hosts (host order, rack-unaware), a dead node spliced
out (``topology.splice``) after ``dead_after_s``. ``swarm``: a BitTorrent-like model
(:mod:`.swarm`).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relgate_agent.coordinator.topology import StripeChain, Topology, splice
from relgate_agent.sim.agents import CoordinatorController, host_names
from relgate_agent.sim.engine import ABSENT, ChainRun, Forest, Trace
from relgate_agent.sim.faults import Incident, plan_incidents
from relgate_agent.sim.flows import Floats
from relgate_agent.sim.network import ORIGIN_SRC, build_fabric
from relgate_agent.sim.scenario import Scenario
from relgate_agent.sim.swarm import run_swarm

DESIGNS = ("relgate", "naive", "tree", "swarm")


@dataclass(frozen=True)
class DesignRun:
    name: str
    done_at: Floats  # per host: seconds to READY (nan: never)
    failed: np.ndarray  # per host: died during the run
    origin_bytes: float
    trace: Trace
    splices: int = 0
    demoted: tuple[int, ...] = ()  # hosts the coordinator demoted to leaves (relgate only)


class StaticController:
    """A fixed forest; a dead host is spliced out of it ``dead_after_s`` after it died."""

    def __init__(self, sc: Scenario, topo: Topology | None, names: list[str]) -> None:
        self.sc, self.topo, self.names = sc, topo, names
        self.index = {h: i for i, h in enumerate(names)}
        self.due: list[tuple[float, int]] = []
        self.splices = 0

    def _forest(self) -> Forest:
        n = len(self.names)
        if self.topo is None:  # naive pull: everyone from the origin
            return Forest(np.full((1, n), ORIGIN_SRC, dtype=np.int64), np.full((1, n), np.inf))
        parent = np.full((1, n), ABSENT, dtype=np.int64)
        for h, p in self.topo.stripes[0].parent.items():
            parent[0, self.index[h]] = ORIGIN_SRC if p is None else self.index[p]
        return Forest(parent, np.full((1, n), np.inf))

    def start(self, run: ChainRun) -> Forest:
        return self._forest()

    def next_event(self, t: float) -> float:
        return min((d for d, _ in self.due), default=np.inf)

    def on_incident(self, run: ChainRun, inc: Incident) -> None:
        dead = np.flatnonzero(~run.alive).tolist()
        self.due += [
            (run.t + self.sc.dead_after_s, h) for h in dead if h not in {x for _, x in self.due}
        ]

    def on_time(self, run: ChainRun) -> Forest | None:
        ripe = [h for d, h in self.due if d <= run.t + 1e-9]
        if not ripe or self.topo is None:
            self.due = [x for x in self.due if x[1] not in ripe]
            return None
        for h in ripe:
            self.topo = splice(self.topo, self.names[h])
            self.splices += 1
        self.due = [x for x in self.due if x[1] not in ripe]
        return self._forest()


def fanout_tree(names: list[str], racks: list[str], fanout: int) -> Topology:
    """Host i's parent is host (i - 1) // fanout; host 0 reads the origin."""
    chain = StripeChain()
    for i, h in enumerate(names):
        chain.parent[h] = None if i == 0 else names[(i - 1) // fanout]
        chain.order.append(h)
    return Topology(1, [chain], dict(zip(names, racks, strict=True)))


def _chain_run(
    sc: Scenario, name: str, k: int, ctl: CoordinatorController | StaticController
) -> DesignRun:
    fabric = build_fabric(sc)
    incidents = plan_incidents(sc)
    sb = np.full(k, 0.0)
    per = np.bincount(np.arange(sc.num_chunks) % k, minlength=k)
    sb[:] = per * sc.chunk_bytes
    sb[(sc.num_chunks - 1) % k] -= sc.num_chunks * sc.chunk_bytes - sc.checkpoint_bytes
    run = ChainRun(sc, fabric, sb, ctl, incidents).run()
    demoted = tuple(sorted(ctl.demoted)) if isinstance(ctl, CoordinatorController) else ()
    return DesignRun(
        name, run.done_at, ~run.alive, run.origin_bytes, run.trace, ctl.splices, demoted
    )


def run_design(sc: Scenario, name: str) -> DesignRun:
    fabric = build_fabric(sc)
    names, racks = host_names(sc, fabric.rack_of)
    if name == "relgate":
        ctl = CoordinatorController(sc, names, racks)
        try:
            return _chain_run(sc, name, sc.stripes, ctl)
        finally:
            ctl.close()
    if name == "naive":
        return _chain_run(sc, name, 1, StaticController(sc, None, names))
    if name == "tree":
        tree = fanout_tree(names, racks, sc.tree_fanout)
        return _chain_run(sc, name, 1, StaticController(sc, tree, names))
    if name == "swarm":
        res = run_swarm(sc, fabric, plan_incidents(sc))
        return DesignRun(name, res.done_at, res.failed, res.origin_bytes, res.trace)
    raise ValueError(f"unknown design {name!r}")


__all__ = ["DESIGNS", "DesignRun", "StaticController", "fanout_tree", "run_design"]
