"""Engine: time-stepped, flow-level run of pipelined stripe forests over a fabric.

State is the bytes each host holds of each stripe (``got``, K x N). Every step the
active flows (upstream has more than the downstream, both alive) get max-min fair rates;
a downstream within one block of its upstream is capped at the upstream's rate (it can
only forward what arrived), and after the step its bytes are clamped to its upstream's,
so a downstream never holds more of a stripe than its upstream. Steps are ``step_s``
long, cut at fault and controller events; with no controller event pending and only
nobody fed by a peer (naive pull), a step jumps to the next flow completion (naive pull runs in a few
steps however long it takes).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Protocol

import numpy as np
from numpy.typing import NDArray

from relgate_agent.sim.faults import Incident, apply_capacity
from relgate_agent.sim.flows import Floats, Ints, link_load, max_min_rates
from relgate_agent.sim.network import ORIGIN_SRC, Fabric
from relgate_agent.sim.scenario import Scenario

ABSENT = -2  # not in this stripe's chain (spliced out)
EPS = 1e-6
MAX_SIM_S = 1e7
IDLE_STEPS = 2  # steps with nothing moving and nothing pending before a run gives up


@dataclass
class Forest:
    parent: Ints  # K x N: upstream host index, ORIGIN_SRC, or ABSENT
    origin_rate: Floats  # K x N: a stripe root's origin cap (token bucket rate); inf if none


@dataclass
class Trace:
    times: list[float] = field(default_factory=list)
    ready: list[int] = field(default_factory=list)
    origin_bytes: list[float] = field(default_factory=list)
    tiers: dict[str, list[float]] = field(default_factory=dict)


def record(
    trace: Trace, fabric: Fabric, point: tuple[float, int, float], paths: Ints, rates: Floats
) -> None:
    """One sample: (time, hosts ready, origin bytes so far) and each tier's utilisation."""
    trace.times.append(point[0])
    trace.ready.append(point[1])
    trace.origin_bytes.append(point[2])
    load = link_load(paths, rates, fabric.links)
    for tier, sl in fabric.tier_slices().items():
        cap = float(fabric.caps[sl].sum())
        trace.tiers.setdefault(tier, []).append(float(load[sl].sum()) / cap if cap else 0.0)


class Controller(Protocol):
    def start(self, run: ChainRun) -> Forest: ...

    def next_event(self, t: float) -> float: ...

    def on_time(self, run: ChainRun) -> Forest | None: ...


class ChainRun:
    """One design's run: fabric, forest, faults and the controller that moves chains."""

    def __init__(
        self,
        sc: Scenario,
        fabric: Fabric,
        stripe_bytes: Floats,
        controller: Controller,
        incidents: list[Incident],
    ) -> None:
        self.sc, self.fabric, self.sb = sc, fabric, stripe_bytes
        k, n = len(stripe_bytes), fabric.hosts
        self.t = 0.0
        self.got = np.zeros((k, n))
        self.rate = np.zeros((k, n))
        self.alive = np.ones(n, dtype=bool)
        self.done_at = np.full(n, np.nan)
        self.origin_bytes = 0.0
        self.rx_bytes = np.zeros(n)
        self.tx_bytes = np.zeros(n)
        self.origin_by_host = np.zeros(n)
        self.incidents = list(incidents)
        self.controller = controller
        self.trace = Trace()
        self.forest = controller.start(self)

    # ------------------------------------------------------------------ flows
    def _flows(self) -> tuple[Ints, Ints, Ints, Floats, NDArray[np.bool_]]:
        par = self.forest.parent
        s, h = np.nonzero(
            (par != ABSENT) & self.alive[None, :] & (self.got < self.sb[:, None] - EPS)
        )
        p = par[s, h]
        origin = p == ORIGIN_SRC
        pp = np.where(origin, 0, p)
        src_got = np.where(origin, self.sb[s], self.got[s, pp])
        live = self._feeding(s, h, pp, origin, src_got)
        s, h, p, pp, origin, src_got = (
            s[live],
            h[live],
            p[live],
            pp[live],
            origin[live],
            src_got[live],
        )
        cap = np.where(origin, self.forest.origin_rate[s, h], np.inf)
        # caught up with its upstream (less than a block behind): it moves at the upstream's
        # pace this step, not faster (see _pipelined)
        caught = ~origin & (src_got - self.got[s, h] < self.sc.block_bytes) & (src_got < self.sb[s])
        return s, h, p, cap, caught

    def _pipelined(
        self, s: Ints, h: Ints, p: Ints, rates: Floats, caught: NDArray[np.bool_]
    ) -> Floats:
        """Per flow, the cap its pipeline sets this step: a caught-up flow moves no faster
        than the flow feeding its upstream, all the way up the chain, so a chain that speeds
        up does so within the step (on the wire a hop costs a block, not a step); clamping
        to the upstream's *last* rate instead let speed climb one hop per step. Others: inf."""
        k, n = self.got.shape
        flow_of = np.full((k, n), -1, dtype=np.int64)
        flow_of[s, h] = np.arange(len(h))
        up = np.where(caught & (p >= 0), flow_of[s, np.maximum(p, 0)], -1)
        linked = up >= 0
        eff = rates.copy()
        for _ in range(n + 1):  # one level per pass; chains are at most n deep
            new = np.where(linked, np.minimum(rates, eff[np.maximum(up, 0)]), rates)
            if np.array_equal(new, eff):
                break
            eff = new
        return np.where(caught, eff, np.inf)

    def _feeding(
        self, s: Ints, h: Ints, pp: Ints, origin: NDArray[np.bool_], src_got: Floats
    ) -> NDArray[np.bool_]:
        """Flows that move this step: the upstream has more, or (pipelined) it receives now.

        Transitive, so a caught-up chain streams within one step as it does on the wire
        (a hop costs one block, not one step)."""
        base = origin | self.alive[pp]
        flowing = base & (origin | (src_got - self.got[s, h] > EPS))
        mark = np.zeros(self.got.shape, dtype=bool)
        for _ in range(self.got.shape[1] + 1):
            mark[:] = False
            mark[s[flowing], h[flowing]] = True
            more = base & ~flowing & ~origin & mark[s, pp]
            if not more.any():
                break
            flowing |= more
        return flowing

    def _dt(self, p: Ints, rates: Floats, s: Ints, h: Ints) -> float:
        step = self.sc.step_s
        nxt = min([i.at_s for i in self.incidents] + [self.controller.next_event(self.t)])
        if len(p) and not (self.forest.parent >= 0).any() and nxt == np.inf:
            moving = rates > 0
            if moving.any():  # only independent origin flows: jump to the next completion
                left = (self.sb[s] - self.got[s, h])[moving] / rates[moving]
                step = max(step, float(left.min()))
        return max(min(step, nxt - self.t), EPS) if nxt > self.t else step

    def _advance(self, s: Ints, h: Ints, p: Ints, rates: Floats, dt: float) -> None:
        old = self.got[s, h].copy()
        new = np.minimum(old + rates * dt, self.sb[s])
        self.got[s, h] = new
        origin = p == ORIGIN_SRC
        pp = np.where(origin, 0, p)
        for _ in range(self.got.shape[1] + 1):  # clamp to the upstream, level by level
            upstream = np.where(origin, self.sb[s], self.got[s, pp])
            if not (new > upstream + EPS).any():
                break
            new = np.minimum(new, upstream)
            self.got[s, h] = new
        delta = new - old
        self.rate[:] = 0
        self.rate[s, h] = delta / dt
        np.add.at(self.rx_bytes, h, delta)
        np.add.at(self.tx_bytes, pp[~origin], delta[~origin])
        np.add.at(self.origin_by_host, h[origin], delta[origin])
        self.origin_bytes += float(delta[origin].sum())
        self._complete(s, h, old, delta, dt)

    def _complete(self, s: Ints, h: Ints, old: Floats, delta: Floats, dt: float) -> None:
        full = (self.got >= self.sb[:, None] - EPS).all(axis=0)
        new_done = full & np.isnan(self.done_at) & self.alive
        if not new_done.any():
            return
        frac = np.ones(len(h))
        moved = delta > 0
        frac[moved] = np.clip((self.sb[s][moved] - old[moved]) / delta[moved], 0, 1)
        last = np.zeros(self.fabric.hosts)
        np.maximum.at(last, h, frac)
        self.done_at[new_done] = self.t + dt * last[new_done]

    # ------------------------------------------------------------------ loop
    def _fire_incidents(self) -> None:
        while self.incidents and self.incidents[0].at_s <= self.t + EPS:
            inc = self.incidents.pop(0)
            if inc.kind == "fail":
                self.alive[list(inc.hosts)] = False
            elif inc.kind in ("slow", "rate_limit"):
                apply_capacity(self.fabric, inc)
            elif inc.kind == "root_fail":
                root = self._root(inc.stripe)
                if root is not None:
                    self.alive[root] = False
            self.on_incident(inc)

    def on_incident(self, inc: Incident) -> None:
        hook = getattr(self.controller, "on_incident", None)
        if hook is not None:
            hook(self, inc)

    def _root(self, stripe: int) -> int | None:
        par = self.forest.parent[min(stripe, len(self.sb) - 1)]
        roots = np.flatnonzero((par == ORIGIN_SRC) & self.alive)
        return int(roots[0]) if len(roots) else None

    def finished(self) -> bool:
        return bool((~np.isnan(self.done_at) | ~self.alive).all())

    def run(self) -> ChainRun:
        idle = 0
        while not self.finished() and self.t < MAX_SIM_S:
            self._fire_incidents()
            s, h, p, cap, caught = self._flows()
            src = np.where(p == ORIGIN_SRC, ORIGIN_SRC, p)
            paths = self.fabric.paths(src, h)
            rates = max_min_rates(paths, self.fabric.caps, cap)
            if caught.any():  # again, with caught-up flows held to their pipeline's pace
                rates = max_min_rates(
                    paths,
                    self.fabric.caps,
                    np.minimum(cap, self._pipelined(s, h, p, rates, caught)),
                )
            dt = self._dt(p, rates, s, h)
            self._advance(s, h, p, rates, dt)
            ready = int((~np.isnan(self.done_at)).sum())
            # the step's outcome (hosts ready, origin bytes) holds at its end, t + dt
            end = self.t + dt
            record(self.trace, self.fabric, (end, ready, self.origin_bytes), paths, self.rate[s, h])
            self.t += dt
            new = self.controller.on_time(self)
            if new is not None:
                self.forest = new
            pending = self.incidents or self.controller.next_event(self.t) < np.inf
            idle = idle + 1 if not len(s) and not pending else 0
            if idle > IDLE_STEPS:  # nothing can move any more (e.g. every source of someone died)
                break
        return self


__all__ = ["ABSENT", "ChainRun", "Controller", "Forest", "Trace", "record"]
