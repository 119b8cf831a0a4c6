"""Report: a run's figures per design, the seed's back-of-envelope, and the JSON object.

Percentiles are over the hosts that did not fail (a dead host never becomes READY and is
reported in ``hostsFailed``); a host that never finished counts as +inf, so a design
that leaves a live host behind shows it in ``p995Seconds``/``maxSeconds``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from relgate_agent.sim.designs import DesignRun
from relgate_agent.sim.faults import plan_incidents
from relgate_agent.sim.scenario import Scenario

SEED_FLOOR_S = 80.0  # the seed's envelope: S / NIC for 800 GB at 100 Gbps (plus slack)
SEED_GOOD_S = 120.0  # "~2 min for a good design"


@dataclass(frozen=True)
class Figures:
    hosts: int
    hosts_ready: int
    hosts_failed: int
    p50_s: float
    p995_s: float
    # over the hosts whose own receive side is not capped by a fault: a host at 30% of its
    # NIC in rx cannot finish before S / (0.3 x B) whatever the design (``rxFloorSeconds``)
    p995_unimpaired_s: float
    max_s: float
    origin_bytes_over_s: float
    splices: int
    demotions: int = 0  # hosts the coordinator demoted to leaves
    # ... of which no fault slowed (not slow in rx or tx, not rate-limited): misjudged
    false_demotions: int = 0

    def to_json(self) -> dict[str, object]:
        def num(x: float) -> float | None:
            return None if not math.isfinite(x) else round(x, 3)

        return {
            "hosts": self.hosts,
            "hostsReady": self.hosts_ready,
            "hostsFailed": self.hosts_failed,
            "p50Seconds": num(self.p50_s),
            "p995Seconds": num(self.p995_s),
            "p995UnimpairedSeconds": num(self.p995_unimpaired_s),
            "maxSeconds": num(self.max_s),
            "originBytesOverS": round(self.origin_bytes_over_s, 4),
            "splices": self.splices,
            "demotions": self.demotions,
            "falseDemotions": self.false_demotions,
        }


def rx_impaired(sc: Scenario) -> list[int]:
    """Hosts whose own receive side a fault caps (slow in rx)."""
    return sorted(
        h
        for i in plan_incidents(sc)
        if i.kind == "slow" and i.direction in ("rx", "both")
        for h in i.hosts
    )


def slowed(sc: Scenario) -> set[int]:
    """Hosts a fault slows, in either direction (slow rx or tx, a rate-limited uploader):
    the only hosts a demotion may rightly name."""
    return {h for i in plan_incidents(sc) if i.kind in ("slow", "rate_limit") for h in i.hosts}


def rx_floor_s(sc: Scenario) -> float | None:
    """The soonest an rx-slowed host can finish: S / (factor x NIC x efficiency)."""
    factors = [f.factor for f in sc.faults if f.kind == "slow" and f.direction in ("rx", "both")]
    return (
        round(sc.checkpoint_bytes / (min(factors) * sc.nic * sc.efficiency), 1) if factors else None
    )


def figures(sc: Scenario, run: DesignRun) -> Figures:
    live = ~run.failed
    done = np.where(np.isnan(run.done_at), np.inf, run.done_at)
    t = done[live]
    unimpaired = live.copy()
    unimpaired[rx_impaired(sc)] = False

    def pct(q: float, x: np.ndarray = t) -> float:
        return float(np.percentile(x, q, method="higher")) if len(x) else math.inf

    return Figures(
        hosts=sc.hosts,
        hosts_ready=int((~np.isnan(run.done_at)).sum()),
        hosts_failed=int(run.failed.sum()),
        p50_s=pct(50),
        p995_s=pct(99.5),
        p995_unimpaired_s=pct(99.5, done[unimpaired]),
        max_s=float(t.max()) if len(t) else math.inf,
        origin_bytes_over_s=run.origin_bytes / sc.checkpoint_bytes,
        splices=run.splices,
        demotions=len(run.demoted),
        false_demotions=len(set(run.demoted) - slowed(sc)),
    )


def envelope(sc: Scenario) -> dict[str, float | None]:
    """S/B (one NIC's worth), the seed's 80 s floor and ~2 min good design, for comparison,
    and the floor of a host slowed in rx (none without such a fault)."""
    return {
        "sOverBSeconds": round(sc.checkpoint_bytes / sc.nic, 3),
        "seedFloorSeconds": SEED_FLOOR_S,
        "seedGoodDesignSeconds": SEED_GOOD_S,
        "rxFloorSeconds": rx_floor_s(sc),
    }


def summary(sc: Scenario, runs: dict[str, DesignRun], elapsed_s: float) -> dict[str, object]:
    """The one JSON object: ours at the top level, every design under ``designs``."""
    ours = figures(sc, runs["relgate"]).to_json() if "relgate" in runs else {}
    return {
        "scenario": sc.name,
        "checkpointBytes": sc.checkpoint_bytes,
        "stripes": sc.stripes,
        "efficiency": sc.efficiency,
        **ours,
        "hosts": sc.hosts,
        "designs": {name: figures(sc, r).to_json() for name, r in runs.items()},
        "envelope": envelope(sc),
        "simSeconds": round(elapsed_s, 2),
    }


__all__ = ["Figures", "envelope", "figures", "slowed", "summary"]
