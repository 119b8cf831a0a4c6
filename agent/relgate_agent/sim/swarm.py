"""Swarm: a BitTorrent-like baseline (random peers, rarest-first, per-peer upload slots).

The checkpoint is ``swarm_pieces`` pieces (coarser than chunks: the model's cost is
hosts x peers x pieces per round). Each round every unfinished host with a free download
slot asks ``swarm_peers`` random peers plus the origin (a seed) for the rarest piece
they hold that it lacks; an uploader serves at most ``swarm_slots`` requests at once
(unchoke slots; the origin as many as its cap holds NICs' worth, at least that).
Transfers share the fabric max-min fairly; a round lasts until the first transfer ends
(at least ``step_s``). No tracker or control plane: failover and root faults do not
apply; a dead peer's transfers are dropped and re-asked elsewhere.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relgate_agent.sim.engine import EPS, MAX_SIM_S, Trace, record
from relgate_agent.sim.faults import Incident, apply_capacity
from relgate_agent.sim.flows import Floats, Ints, max_min_rates
from relgate_agent.sim.network import ORIGIN_SRC, Fabric
from relgate_agent.sim.scenario import Scenario


@dataclass(frozen=True)
class SwarmResult:
    done_at: Floats
    failed: np.ndarray
    origin_bytes: float
    trace: Trace


class Swarm:
    def __init__(self, sc: Scenario, fabric: Fabric, incidents: list[Incident]) -> None:
        self.sc, self.fabric = sc, fabric
        self.rng = np.random.default_rng(sc.seed + 1)
        n = fabric.hosts
        self.pieces = max(1, min(sc.swarm_pieces, sc.num_chunks))
        self.piece_bytes = sc.checkpoint_bytes / self.pieces
        self.have = np.zeros((n + 1, self.pieces), dtype=bool)
        self.have[n] = True  # the origin (row n) seeds everything
        self.pending = np.zeros((n, self.pieces), dtype=bool)
        self.alive = np.ones(n, dtype=bool)
        self.done_at = np.full(n, np.nan)
        self.src = np.zeros(0, dtype=np.int64)  # n = the origin
        self.dst = np.zeros(0, dtype=np.int64)
        self.piece = np.zeros(0, dtype=np.int64)
        self.left = np.zeros(0)
        self.origin_slots = max(sc.swarm_slots, int(sc.swarm_slots * sc.origin_cap / sc.nic))
        self.incidents = sorted(incidents, key=lambda i: i.at_s)
        self.t, self.origin_bytes = 0.0, 0.0
        self.trace = Trace()

    def _ask(self) -> None:
        n, slots = self.fabric.hosts, self.sc.swarm_slots
        busy = np.bincount(self.dst, minlength=n)
        askers = np.flatnonzero(self.alive & np.isnan(self.done_at) & (busy < slots))
        if not len(askers):
            return
        c = self.sc.swarm_peers
        cand = np.concatenate(
            [self.rng.integers(0, n, size=(len(askers), c)), np.full((len(askers), 1), n)], axis=1
        )
        ok = np.append(self.alive, True)[cand] & (cand != askers[:, None])
        need = self.have[cand] & ~(self.have[askers] | self.pending[askers])[:, None, :]
        need &= ok[:, :, None]
        rarity = self.have[:n][self.alive].sum(axis=0) + self.rng.random(self.pieces)
        # peers first: the origin (last candidate) only for what no asked peer offers
        penalty = np.zeros(c + 1)
        penalty[c] = n + 1
        score = np.where(need, rarity[None, None, :] + penalty[None, :, None], np.inf)
        best = score.argmin(axis=2)  # per (asker, candidate): its rarest useful piece
        best_score = np.take_along_axis(score, best[:, :, None], axis=2)[:, :, 0]
        order = np.argsort(best_score, axis=1)
        free = slots - busy[askers]
        rows, cols = np.nonzero(np.arange(c + 1)[None, :] < free[:, None])
        pick = order[rows, cols]
        valid = np.isfinite(best_score[rows, pick])
        a, src, pc = askers[rows][valid], cand[rows, pick][valid], best[rows, pick][valid]
        _, first = np.unique(a * self.pieces + pc, return_index=True)  # one source per piece
        a, src, pc = a[first], src[first], pc[first]
        self._accept(a, src, pc)

    def _accept(self, a: Ints, src: Ints, pc: Ints) -> None:
        """Upload slots: each uploader serves at most its slots (random order of asks)."""
        n = self.fabric.hosts
        perm = self.rng.permutation(len(a))
        a, src, pc = a[perm], src[perm], pc[perm]
        uploading = np.bincount(self.src, minlength=n + 1)
        order = np.argsort(src, kind="stable")
        rank = np.empty(len(src), dtype=np.int64)
        sorted_src = src[order]
        starts = np.searchsorted(sorted_src, sorted_src, side="left")
        rank[order] = np.arange(len(src)) - starts
        limit = np.where(src == n, self.origin_slots, self.sc.swarm_slots)
        keep = uploading[src] + rank < limit
        a, src, pc = a[keep], src[keep], pc[keep]
        self.src = np.concatenate([self.src, src])
        self.dst = np.concatenate([self.dst, a])
        self.piece = np.concatenate([self.piece, pc])
        self.left = np.concatenate([self.left, np.full(len(a), self.piece_bytes)])
        self.pending[a, pc] = True

    def _drop_dead(self) -> None:
        alive = np.append(self.alive, True)
        keep = alive[self.src] & self.alive[self.dst]
        self.pending[self.dst[~keep], self.piece[~keep]] = False
        self.src, self.dst, self.piece = self.src[keep], self.dst[keep], self.piece[keep]
        self.left = self.left[keep]

    def _fire(self) -> None:
        while self.incidents and self.incidents[0].at_s <= self.t + EPS:
            inc = self.incidents.pop(0)
            if inc.kind == "fail":
                self.alive[list(inc.hosts)] = False
                self._drop_dead()
            elif inc.kind in ("slow", "rate_limit"):
                apply_capacity(self.fabric, inc)

    def _step(self) -> bool:
        self._fire()
        self._ask()
        if not len(self.dst):
            return False
        n = self.fabric.hosts
        src = np.where(self.src == n, ORIGIN_SRC, self.src)
        paths = self.fabric.paths(src, self.dst)
        rates = max_min_rates(paths, self.fabric.caps, np.full(len(self.dst), np.inf))
        with np.errstate(divide="ignore"):
            finish = np.where(rates > 0, self.left / rates, np.inf)
        dt = max(self.sc.step_s, float(finish.min()))
        if self.incidents:
            dt = max(min(dt, self.incidents[0].at_s - self.t), EPS)
        moved = np.minimum(rates * dt, self.left)
        self.left -= moved
        self.origin_bytes += float(moved[self.src == n].sum())
        ready = int((~np.isnan(self.done_at)).sum())
        record(self.trace, self.fabric, (self.t, ready, self.origin_bytes), paths, moved / dt)
        done = self.left <= EPS
        self.have[self.dst[done], self.piece[done]] = True
        self.pending[self.dst[done], self.piece[done]] = False
        self.src, self.dst, self.piece = self.src[~done], self.dst[~done], self.piece[~done]
        self.left = self.left[~done]
        self.t += dt
        full = self.have[:n].all(axis=1) & np.isnan(self.done_at) & self.alive
        self.done_at[full] = self.t
        return True

    def run(self) -> SwarmResult:
        while self.t < MAX_SIM_S and not (~np.isnan(self.done_at) | ~self.alive).all():
            if not self._step():
                if not self.incidents:
                    break
                self.t = self.incidents[0].at_s
        return SwarmResult(self.done_at, ~self.alive, self.origin_bytes, self.trace)


def run_swarm(sc: Scenario, fabric: Fabric, incidents: list[Incident]) -> SwarmResult:
    return Swarm(sc, fabric, incidents).run()


__all__ = ["SwarmResult", "run_swarm"]
