"""Agents: simulated hosts driving the real coordinator on simulated time.

The coordinator is the real :class:`~relgate_agent.coordinator.service.Coordinator` over
a temporary SQLite store, with an injected clock (the simulation's time). Simulated
agents enroll, heartbeat, register and report every ``report_interval_s`` (rx/tx/origin
counters and the measured rx rate; READY with the full have-bitmap and the placed
digest), report a stalled upstream as a suspect, and re-register when told. The
sweeper's ``tick`` splices dead hosts and demotes slow ones with its own rules; chains
follow the coordinator's topology, and a host's upstream and origin rate come from its
``_assignment`` (the plan an agent receives). A failover pauses the control plane
(the data plane keeps its assignments), then a new coordinator loads the job from the
store and rebuilds progress from the agents' next reports.

Simplifications, on purpose: the manifest's signature is not checked (``_verify``
returns the synthetic manifest); intermediate reports carry no have-bitmap (its decode
is the coordinator's cost the control-plane bench measures, not a distribution figure).
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import CheckpointManifest, ChunkEntry, FileEntry

from relgate_agent.contracts import STRIPE_DONE, ProgressReport
from relgate_agent.coordinator.jobstate import CoordinatorConfig, JobState
from relgate_agent.coordinator.service import Coordinator
from relgate_agent.coordinator.topology import Topology
from relgate_agent.dataplane.pacing import TokenBucket
from relgate_agent.sim.engine import ABSENT, ChainRun, Forest
from relgate_agent.sim.faults import Incident
from relgate_agent.sim.network import ORIGIN_SRC
from relgate_agent.sim.scenario import Scenario

SIM_MODEL, SIM_VERSION = "sim-model", "v1"


def sim_manifest(sc: Scenario) -> CheckpointManifest:
    chunks = []
    for i in range(sc.num_chunks):
        off = i * sc.chunk_bytes
        size = min(sc.chunk_bytes, sc.checkpoint_bytes - off)
        chunks.append(
            ChunkEntry(i, off, size, "sha256:" + "0" * 64, (0,) * -(-size // sc.block_bytes))
        )
    return CheckpointManifest(
        SIM_MODEL,
        SIM_VERSION,
        sc.checkpoint_bytes,
        sc.chunk_bytes,
        sc.block_bytes,
        (FileEntry("model.bin", 0, sc.checkpoint_bytes),),
        tuple(chunks),
    )


class SimCoordinator(Coordinator):
    """The real coordinator; only the manifest signature check is replaced."""

    def __init__(
        self, config: CoordinatorConfig, manifest: CheckpointManifest, clock: SimClock
    ) -> None:
        self.sim_manifest = manifest  # before super(): a rebuild loads the job at once
        # the wall clock is the simulation's too: slow clocks a takeover restores are wall
        # instants (slowclock.py), and real time credited a new leader ~0 s of the old one's
        super().__init__(
            config, post=lambda _url, _body, _headers: None, clock=clock, wall=clock.wall
        )

    def _verify(self, envelope: bytes) -> CheckpointManifest:
        return self.sim_manifest


class SimClock:
    """Monotonic seconds = a base + the simulation's time."""

    def __init__(self) -> None:
        self.base = 1_000_000.0
        self.t = 0.0

    def __call__(self) -> float:
        return self.base + self.t

    def wall(self) -> float:
        """Unix seconds in the simulation: a fixed epoch + its time."""
        return 1_790_000_000.0 + self.t


def host_names(sc: Scenario, rack_of: np.ndarray) -> tuple[list[str], list[str]]:
    names, racks, seen = [], [], [0] * sc.racks
    for r in rack_of.tolist():
        names.append(f"r{r:04d}-h{seen[r]:03d}")
        racks.append(f"rack{r:04d}")
        seen[r] += 1
    return names, racks


class CoordinatorController:
    """The striped rack-aware chains, run by the real coordinator (design ``relgate``)."""

    def __init__(self, sc: Scenario, names: list[str], racks: list[str]) -> None:
        self.sc, self.names, self.racks = sc, names, racks
        self.index = {h: i for i, h in enumerate(names)}
        self.tmp = tempfile.TemporaryDirectory(prefix="relgate-sim-")
        self.clock = SimClock()
        self.manifest = sim_manifest(sc)
        self.full_have = bytes([0xFF]) * (-(-self.manifest.num_chunks // 8))
        self.config = CoordinatorConfig(
            db=str(Path(self.tmp.name) / "coordinator.sqlite"),
            default_stripes=sc.stripes,
            dead_after_s=sc.dead_after_s,
            report_interval_s=sc.report_interval_s,
            slow_fraction=sc.slow_fraction,
            slow_after_s=sc.slow_after_s,
            host_ttl_s=1e9,
        )
        self.coord = SimCoordinator(self.config, self.manifest, self.clock)
        self.job_id = ""
        self.next_report = 0.0
        self.paused_until = -1.0
        self.rebuild_pending = False
        self.reported_ready: set[int] = set()
        self.last_rx = np.zeros(sc.hosts)
        self.last_tx = np.zeros(sc.hosts)
        self.last_got: np.ndarray | None = None  # per stripe and host, at the last report
        self.version = 0
        self.shares: tuple[int, ...] = ()  # the origin shares the last forest carries
        self.splices = 0
        self.failovers = 0
        # host index -> the coordinator's reason, for every host it demoted to a leaf
        # (the report counts those no fault slowed: false demotions)
        self.demoted: dict[int, str] = {}

    # ------------------------------------------------------------------ setup
    def start(self, run: ChainRun) -> Forest:
        for h, r in zip(self.names, self.racks, strict=True):
            self.coord.enroll(h, r, {})
            # the heartbeat as opening a watch records it
            self.coord.store.upsert_host(h, r, {}, f"{h}:7070", [])
            self.coord.addresses[h] = f"{h}:7070"
        uri = Path(self.tmp.name) / "manifest.json"
        uri.write_bytes(b"{}")  # read by the coordinator; _verify yields the synthetic manifest
        job = self.coord.create_job(
            JobSpec(
                model=SIM_MODEL,
                version=SIM_VERSION,
                manifest_uri=str(uri),
                origin_cap_bytes_per_s=int(self.sc.origin_cap),
                stripes=self.sc.stripes,
            )
        )
        self.job_id = job.job_id
        for h, r in zip(self.names, self.racks, strict=True):
            self.coord.register(self.job_id, h, r, b"", 1 << 40, f"{h}:7070")
        self.next_report = self.sc.report_interval_s
        return self._forest(job, [])  # initial chains: as published; plans for the roots

    def _job(self) -> JobState | None:
        return self.coord.jobs.get(self.job_id)

    def _forest(self, job: JobState, changed: list[str]) -> Forest:
        """Chains as the coordinator publishes them; plans of the changed hosts and roots."""
        topo: Topology = job.topology
        k, n = len(topo.stripes), len(self.names)
        parent = np.full((k, n), ABSENT, dtype=np.int64)
        for s, chain in enumerate(topo.stripes):
            for h, p in chain.parent.items():
                parent[s, self.index[h]] = ORIGIN_SRC if p is None else self.index[p]
        origin_rate = np.full((k, n), np.inf)
        roots = {r for r in (c.root() for c in topo.stripes) if r is not None}
        for h in sorted(roots | (set(changed) & set(topo.racks))):
            plan = self.coord._assignment(job, h)
            for sp in plan.stripes:
                up = sp.upstream.host_id
                parent[sp.stripe, self.index[h]] = self.index.get(up, ORIGIN_SRC)
                if sp.origin_rate_bytes_per_s:
                    bucket = TokenBucket(sp.origin_rate_bytes_per_s)
                    origin_rate[sp.stripe, self.index[h]] = bucket.rate  # its long-run rate
        self.version, self.shares = topo.version, job.origin_shares
        return Forest(parent, origin_rate)

    # ------------------------------------------------------------------ time
    def next_event(self, t: float) -> float:
        if self._job() is None and not self.rebuild_pending:
            return np.inf
        return max(self.next_report, self.paused_until)

    def on_incident(self, run: ChainRun, inc: Incident) -> None:
        if inc.kind == "failover":
            self.paused_until = run.t + inc.pause_s
            self.rebuild_pending = True

    def on_time(self, run: ChainRun) -> Forest | None:
        self.clock.t = run.t
        if run.t < self.paused_until - 1e-9 or run.t < self.next_report - 1e-9:
            return None
        if self.rebuild_pending:
            self.rebuild_pending = False
            self.failovers += 1
            self.coord = SimCoordinator(self.config, self.manifest, self.clock)
        self.next_report = run.t + self.sc.report_interval_s
        job = self._job()
        if job is None:
            return None
        before = {s: dict(c.parent) for s, c in enumerate(job.topology.stripes)}
        self._report_round(run)
        self._suspects(run)
        self.coord.tick()
        job = self._job()
        if job is None:
            return None
        self._note_demotions(job)
        if job.topology.version == self.version:
            if job.origin_shares == self.shares:
                return None
            return self._forest(job, [])  # the roots' origin shares were rebalanced
        self.splices += 1
        changed = [
            h
            for s, c in enumerate(job.topology.stripes)
            for h, p in c.parent.items()
            if s not in before or before[s].get(h, "") != p
        ]
        return self._forest(job, changed)

    def _note_demotions(self, job: JobState) -> None:
        for h, hp in job.hosts.items():
            i = self.index[h]
            if hp.demoted and i not in self.demoted:
                why = next((e for e in hp.errors if e.startswith("DEMOTED")), "DEMOTED")
                self.demoted[i] = why

    def _report_round(self, run: ChainRun) -> None:
        interval = self.sc.report_interval_s
        rx_bps = (run.rx_bytes - self.last_rx) / interval
        tx_bps = (run.tx_bytes - self.last_tx) / interval  # the sweeper reads both ends
        self.last_rx, self.last_tx = run.rx_bytes.copy(), run.tx_bytes.copy()
        # per stripe, as the agent reports it: the rate, or STRIPE_DONE for a whole stripe
        stripe_bps = np.where(
            run.got >= run.sb[:, None] - 1.0,
            STRIPE_DONE,
            (run.got - (self.last_got if self.last_got is not None else 0.0)) / interval,
        ).astype(np.int64)
        self.last_got = run.got.copy()
        for i in np.flatnonzero(run.alive).tolist():
            # a READY host keeps serving and reporting; its full bitmap goes once
            ready = not np.isnan(run.done_at[i])
            first = ready and i not in self.reported_ready
            report = ProgressReport(
                topology_version=self.version,
                have=self.full_have if first else b"",
                rx=int(run.rx_bytes[i]),
                tx=int(run.tx_bytes[i]),
                origin=int(run.origin_by_host[i]),
                rx_bps=int(rx_bps[i]),
                tx_bps=int(tx_bps[i]),
                stripe_rx_bps=tuple(stripe_bps[:, i].tolist()),
                ready=ready,
                placed_manifest_digest=self.manifest.digest if ready else "",
            )
            reply = self.coord.report_progress(self.job_id, self.names[i], report)
            if ready:
                self.reported_ready.add(i)
            if "REREGISTER" in reply.actions:
                self.coord.register(
                    self.job_id, self.names[i], self.racks[i], b"", 1 << 40, f"{self.names[i]}:7070"
                )

    def _suspects(self, run: ChainRun) -> None:
        """A downstream whose upstream went silent and sent nothing reports it, every round:
        an agent reports it on each failed pull (stripes.py), so a new leader hears of it
        too (told once per run, the dead hosts of a takeover stayed in the chains for the
        new leader's whole grace)."""
        par = run.forest.parent
        s, h = np.nonzero((par >= 0) & run.alive[None, :] & (run.rate == 0))
        for si, hi in zip(s.tolist(), h.tolist(), strict=True):
            p = int(par[si, hi])
            if run.alive[p] or not np.isnan(run.done_at[hi]):
                continue
            self.coord.report_suspect(self.job_id, self.names[hi], self.names[p], "UNREACHABLE", si)

    def close(self) -> None:
        self.coord.store.engine.dispose() if hasattr(self.coord.store, "engine") else None
        self.tmp.cleanup()


__all__ = ["CoordinatorController", "SimClock", "SimCoordinator", "host_names", "sim_manifest"]
