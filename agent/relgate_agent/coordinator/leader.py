"""Leader: the coordinator's shared state and its leadership (the HA lease).

Replicas share the store and elect a leader through a lease row; only the leader holds
jobs in memory and answers calls (:class:`NotLeader` otherwise). :class:`CoordinatorCore`
is the base the progress, handoff and operator parts of the coordinator build on: the
lock and condition every long-poll waits on, the jobs, the host addresses and health, and
the few helpers that change a job's topology.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import threading
import time
from collections.abc import Callable
from typing import Any

from relgate_trust.datacenter import host_dc
from relgate_trust.errors import ManifestError
from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import CheckpointManifest, verify_envelope

from relgate_agent.contracts import PeerRef
from relgate_agent.coordinator import slowclock, tally
from relgate_agent.coordinator.changefeed import ChangeFeed
from relgate_agent.coordinator.jobstate import (
    ACTIVE_STATES,
    QUARANTINED,
    CoordinatorConfig,
    HostProgress,
    JobState,
    NotFound,
    NotLeader,
    Rejected,
)
from relgate_agent.coordinator.keydiff import KeyLog, Place
from relgate_agent.coordinator.ledger import Ledger
from relgate_agent.coordinator.metrics import SPLICE_DEAD, CoordinatorMetrics
from relgate_agent.coordinator.outbox import EVENT_COMPLETE, Post
from relgate_agent.coordinator.shard import Shard
from relgate_agent.coordinator.store import JobRow, JobStore, StaleTopology
from relgate_agent.coordinator.topology import Topology, TopologyIndex, append_host, splice_all
from relgate_agent.dataplane.manifestread import read_manifest
from relgate_agent.errors import AgentError

log = logging.getLogger(__name__)

# A leader serves (and judges) only while the lease it last renewed is good by its own
# clock, this fraction of the TTL after the renewal began: a renewal that hangs (the
# store cut off with the network) ends its reign before another replica may take over at
# the full TTL, never after (the rest is room for clock drift between the replicas).
LEASE_SELF_FRACTION = 0.8


def _nothing_waiting() -> int:
    return 0  # no server: nobody queues for the lock


class CoordinatorCore:
    def __init__(
        self,
        config: CoordinatorConfig,
        post: Post,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        if config.shard_by_job and not config.ha:  # sharded replicas are replicas
            config = dataclasses.replace(config, ha=True)
        self.config = config
        self.clock = clock  # injectable: the fleet simulator runs the coordinator on simulated time
        self.wall = wall  # instants written for another replica to read (slowclock)
        self.store = JobStore(config.db)
        self.ledger = Ledger(self.store)  # host byte counters, removed targets, host holds
        self.lock = threading.RLock()
        # a long pass under the lock calls this where the state is whole: the calls queued
        # for the lock meanwhile (the server's batched reports, batch.py) are applied there
        self.apply_waiting: Callable[[], int] = _nothing_waiting
        self.tick_applied_s = 0.0  # of the last tick, the seconds spent applying them
        self.changed = ChangeFeed(self.lock)
        self.jobs: dict[str, JobState] = {}
        self.closing = False  # set on shutdown: watches end at once
        self.addresses: dict[str, str] = {}
        # host -> open watch streams on this replica (written by the server's event loop
        # only): a host that holds its watch open is alive, whatever its reports' delay
        self.watching: dict[str, int] = {}
        # host -> when its last watch ended (a reopening agent is between two streams)
        self.watch_ended: dict[str, float] = {}
        self._indexes: dict[str, TopologyIndex] = {}  # job -> lookups of its topology
        # job -> the topology indexed last and the diffs of its versions (keydiff.py)
        self._indexed: dict[str, Topology] = {}
        self._keylogs: dict[str, KeyLog] = {}
        # address changes, counted (_readdress): host -> the count at its last change
        self.place_moves = 0
        self.moved_at: dict[str, int] = {}
        # watch passes: push keys computed, and known unmoved (keydiff.py) so not computed
        self.keys_computed = 0
        self.keys_skipped = 0
        self._peers: dict[str, PeerRef] = {}  # host -> how assignments name it (_peer)
        # host -> (inventory row as last written, when): heartbeats skip unchanged rows
        self._inventory_written: dict[str, tuple[tuple[object, ...], float]] = {}
        self._last_seen_due: dict[str, int] = {}  # host -> wall seconds, flushed per tick
        # (jobs' watch signature, their objects) -> host -> its active jobs (watch passes)
        self._by_host_cache: tuple[tuple[Any, ...], dict[str, list[JobState]]] | None = None
        # host -> (health text, data-plane refusals) from its last heartbeat or report
        self.health: dict[str, tuple[str, int]] = {}
        self.control_refusals = 0
        self.metrics = CoordinatorMetrics()
        self.metrics.watch(self)
        self._post = post
        self.replica_id = (
            config.replica_id or f"{os.uname().nodename}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        self.epoch = 0
        self._leader = False
        self._lease_renewed = 0.0
        # sharded by job: this replica's job leases (coordinator/shard.py); else None
        self.shard = (
            Shard(self.store, self.replica_id, config.lease_ttl_s) if config.shard_by_job else None
        )
        if not config.ha:
            self._become_leader(0)

    # ------------------------------------------------------------------ leadership
    @property
    def leader(self) -> bool:
        """This replica leads: it holds the lease and, in HA mode, its last renewal is still
        good by its own clock (LEASE_SELF_FRACTION): a leader whose renewal hangs stops
        serving and judging before the lease can pass on, whatever the store call does."""
        if not self._leader or not self.config.ha:
            return self._leader
        return self.clock() - self._lease_renewed < self.config.lease_ttl_s * LEASE_SELF_FRACTION

    def _become_leader(self, epoch: int) -> None:
        """Load durable state; progress is rebuilt from the agents' next reports."""
        rows = self.store.load_jobs(ACTIVE_STATES)
        # each job's manifest is read (bounded, with a deadline) before the lock is taken:
        # a slow or hostile manifest URI never holds up the coordinator's other calls
        envelopes = {row.job_id: _read_envelope(row) for row in rows}
        with self.lock:
            self.jobs.clear()
            self._resume(rows, envelopes)
            self.epoch = epoch
            self._leader = True
            self.changed.notify_all()
        log.info(
            "coordinator %s leads (epoch %d, %d active jobs)",
            self.replica_id,
            epoch,
            len(self.jobs),
        )

    def _resume(self, rows: list[JobRow], envelopes: dict[str, bytes | AgentError]) -> None:
        """Load ``rows`` into memory (the caller holds the lock); a job that cannot be
        resumed is FAILED."""
        for host_id, _rack, _labels, address in self.store.hosts():
            self._readdress(host_id, address)
        for row in rows:
            try:
                self.jobs[row.job_id] = self._load_job(row, envelopes[row.job_id])
            except AgentError as exc:
                log.error("job %s cannot be resumed: %s", row.job_id, exc)
                self.store.update_job(row.job_id, state="FAILED")

    def _step_down(self, reason: str = "lost the lease") -> None:
        with self.lock:
            if self._leader:
                log.warning("coordinator %s %s; stepping down", self.replica_id, reason)
            self._leader = False
            self.jobs.clear()
            self.changed.notify_all()

    def maintain_lease(self) -> None:
        """Called from the sweeper: take/renew the lease (HA mode), step down when lost."""
        if not self.config.ha:
            return
        if self.shard is not None:
            self._maintain_shard(self.shard)
            return
        now = self.clock()
        if self._leader and now - self._lease_renewed < self.config.lease_ttl_s / 3:
            return
        try:
            epoch = self.store.acquire_lease(self.replica_id, self.config.lease_ttl_s)
        except Exception as exc:  # any failure: we cannot prove we still lead, so step down
            log.warning(
                "replica %s: lease renewal failed (%s: %s); stepping down",
                self.replica_id,
                type(exc).__name__,
                exc,
            )
            epoch = None
        if epoch is None:
            self._step_down()
            return
        self._lease_renewed = now
        if not self._leader or epoch != self.epoch:
            self._become_leader(epoch)

    def _maintain_shard(self, shard: Shard) -> None:
        """Sharded by job: renew this replica's job leases and take free ones up to its
        share (coordinator/shard.py); keep in memory exactly the jobs whose leases it holds,
        each at its lease's epoch. Any failure: it cannot prove it leads anything."""
        now = self.clock()
        if self._leader and now - self._lease_renewed < self.config.lease_ttl_s / 3:
            return
        try:
            held = shard.renew()
            held |= shard.take_share(held)
        except Exception as exc:  # the store is unreachable: lead nothing
            log.warning(
                "replica %s: job lease renewal failed (%s: %s); stepping down",
                self.replica_id,
                type(exc).__name__,
                exc,
            )
            self._step_down()
            shard.epochs.clear()
            return
        self._lease_renewed = now
        self._adopt(shard, held)

    def _adopt(self, shard: Shard, held: dict[str, int]) -> None:
        """Lead exactly the jobs of ``held`` (job -> lease epoch): drop the others, load the
        new ones (or one whose epoch moved: another replica led it meanwhile)."""
        with self.lock:
            for job_id in list(self.jobs):
                if held.get(job_id) != shard.epochs.get(job_id):
                    log.warning("replica %s no longer leads job %s", self.replica_id, job_id)
                    del self.jobs[job_id]
            shard.epochs.clear()
            shard.epochs.update(held)
            missing = set(held) - set(self.jobs)
            self._leader = True
        rows = [r for r in self.store.load_jobs() if r.job_id in missing]
        for row in rows:
            if row.state not in ACTIVE_STATES:  # it finished: nothing to lead
                shard.release(row.job_id)
        rows = [r for r in rows if r.state in ACTIVE_STATES]
        envelopes = {row.job_id: _read_envelope(row) for row in rows}  # never under the lock
        with self.lock:
            self._resume(rows, envelopes)
            self.changed.notify_all()
        if rows:
            log.info(
                "replica %s leads %d jobs (took %s)",
                self.replica_id,
                len(self.jobs),
                ", ".join(f"{r.job_id}@{held[r.job_id]}" for r in rows),
            )

    def epoch_of(self, job_id: str) -> int:
        """The lease epoch ``job_id``'s assignments are stamped with: its own lease's when
        sharded, the replica-wide lease's otherwise."""
        if self.shard is not None:
            return self.shard.epochs.get(job_id, 0)
        return self.epoch

    def elsewhere(self, job_id: str) -> None:
        """Raise NotLeader (naming the leader) when ``job_id``, not in memory here, is an
        active job another replica leads (sharded only; otherwise nothing)."""
        if self.shard is not None and (refusal := self.shard.redirect(job_id)) is not None:
            raise refusal

    def release(self) -> None:
        if self.shard is not None:
            self._step_down("is shutting down")
            self.shard.leave()
            return
        if self.config.ha and self._leader:
            self._step_down("is shutting down")
            self.store.release_lease(self.replica_id)

    def require_leader(self) -> None:
        if not self.leader:
            raise NotLeader(f"coordinator {self.replica_id} is not the leader")

    # ------------------------------------------------------------------ jobs
    def _verify(self, envelope: bytes) -> CheckpointManifest:
        if self.config.trusted_keys is None:
            raise Rejected(
                "coordinator has no trusted key set; refusing to plan an unverifiable job",
                check="trusted-keys",
            )
        try:
            return verify_envelope(envelope, self.config.trusted_keys)
        except ManifestError as exc:
            raise Rejected(str(exc), check=getattr(exc, "check", "") or "manifest-invalid") from exc

    def _load_job(self, row: JobRow, envelope: bytes | AgentError) -> JobState:
        spec = JobSpec.from_stored(row.spec)
        if isinstance(envelope, AgentError):
            raise envelope
        manifest = self._verify(envelope)
        if manifest.digest != row.manifest_digest:
            raise Rejected(
                f"manifest at {spec.manifest_uri} changed: {manifest.digest} != {row.manifest_digest}",
                check="manifest-changed",
            )
        job = JobState(
            row.job_id,
            spec,
            row.state,
            manifest,
            envelope,
            row.targets,
            row.topology,
            set(row.ready_hosts),
            row.completion_emitted,
            float(row.created_at),
        )
        for event in self.store.job_events(row.job_id):  # what the deployer was (or will be) told
            job.completion_enqueued |= event.kind == EVENT_COMPLETE
            job.announced.update(event.hosts)
        # Rebuilt cache: everyone gets a grace period of one dead interval to report again.
        enrolled = self.store.enrolled()
        for h, rack in row.targets.items():
            dc = host_dc(enrolled[h][1]) if h in enrolled else row.topology.dc(h)
            job.hosts[h] = HostProgress(
                h, rack, self.addresses.get(h, ""), dc=dc, last_seen=self.clock()
            )
            if h in job.ready:
                job.hosts[h].ready = True
                job.hosts[h].state = "READY"
        for h, at in self.store.quarantined(row.job_id).items():
            if h in job.hosts:
                job.hosts[h].state, job.hosts[h].removed_at = QUARANTINED, at
        job.restore_removed(self.ledger.removed(job.job_id))
        for h, hp in job.hosts.items():
            # every other target was in the chains from the job's creation on (a late one
            # joins them): missing from them, it was spliced out as dead by an earlier
            # leader. Left PENDING outside the chains, no sweep judged it again and the job
            # waited on it (bench chaos: h02 and h09 PENDING to the end)
            if hp.state == "PENDING" and not hp.ready and h not in job.topology.racks:
                hp.state = "DEAD"
                hp.errors.append("spliced out before the takeover (not in the stored topology)")
        tally.restore(self.ledger, job)
        slowclock.restore(self.store, job, self.clock(), self.wall(), self.config.slow_after_s)
        job.resumed_at = self.clock()  # no host judged on the takeover's silence (failover.py)
        return job

    def _job(self, job_id: str) -> JobState:
        job = self.jobs.get(job_id)
        if job is None:
            self.elsewhere(job_id)
            raise NotFound(f"job {job_id} is unknown or finished")
        return job

    def _set_topology(self, job: JobState, topo: Topology) -> None:
        if topo is job.topology:
            return
        try:
            self.store.save_topology(job.job_id, job.topology.version, topo, job.targets)
        except StaleTopology:
            # another replica moved the topology on: we are not the leader any more (of
            # this job only, when sharded: its lease passed on; the others stand)
            if self.shard is None:
                self._step_down()
            else:
                self.jobs.pop(job.job_id, None)
                self.shard.epochs.pop(job.job_id, None)
                self.changed.notify_all()
            raise NotLeader(f"coordinator {self.replica_id} lost a topology race") from None
        job.topology = topo
        self.changed.notify_all()

    def _splice(self, job: JobState, *hosts: str) -> Topology:
        """``job``'s topology without ``hosts``, no slow host promoted into their places."""
        return splice_all(job.topology, hosts, job.slow_hosts(self.config.slow_fraction))

    def _append(self, job: JobState, topo: Topology, host: str, rack: str) -> Topology:
        """``topo`` with ``host`` at its rack's tail, hung from no leaf or slow host."""
        avoid = job.slow_hosts(self.config.slow_fraction) - {host}
        return append_host(topo, host, rack, job.hosts[host].dc, avoid)

    def _mark_dead(self, job: JobState, host: str, why: str) -> None:
        self._mark_dead_all(job, {host: why})

    def _mark_dead_all(self, job: JobState, dead: dict[str, str]) -> None:
        """Splice every host of ``dead`` (host -> why) out, as one new topology version."""
        gone = []
        for host, why in dead.items():
            hp = job.hosts[host]
            if hp.state == "DEAD":
                continue
            hp.state = "DEAD"
            hp.errors.append(f"spliced out: {why}")
            log.warning("job %s: splicing %s out (%s)", job.job_id, host, why)
            gone.append(host)
        if gone:
            self._set_topology(job, self._splice(job, *gone))
            self.metrics.splices.labels(SPLICE_DEAD).inc(len(gone))

    def _figures(self, job: JobState) -> dict[str, object]:
        """What GetJob keeps reporting after the job left memory (HandoffService's)."""
        raise NotImplementedError

    def _fail_job(self, job: JobState, error: str) -> None:
        """Mark a job FAILED with the error that ended it (caller holds the lock)."""
        log.error("job %s FAILED: %s", job.job_id, error)
        job.state = "FAILED"
        job.error = error
        self.store.update_job(job.job_id, state="FAILED")  # fenced: a deposed leader stops here
        # frozen as a finished job's are: a next leader or a restart still reports why,
        # and every host's errors (a FAILED job is never resumed into memory)
        self.store.save_figures(job.job_id, {**self._figures(job), "failure": error})
        self.changed.notify_all()

    def _readdress(self, host: str, address: str, hp: HostProgress | None = None) -> None:
        """``host`` is at ``address`` now (and so is ``hp``, its place in one job): every
        change is counted, so a watch pass knows whose peers to tell even when an address
        moved and came back between two topology versions (keydiff.py)."""
        if self.addresses.get(host) != address or (hp is not None and hp.address != address):
            self.place_moves += 1
            self.moved_at[host] = self.place_moves
        self.addresses[host] = address
        if hp is not None:
            hp.address = address

    def _place(self, job: JobState, host: str) -> Place:
        """Where ``host``'s peers are told it is: (address, rack, DC) (keydiff.py)."""
        hp = job.hosts.get(host)
        address = (hp.address if hp else "") or self.addresses.get(host, "")
        return address, (hp.rack if hp else ""), job.topology.dc(host)

    def _peer(self, job: JobState, host: str) -> PeerRef:
        address, rack, _ = self._place(job, host)
        # the same reference while the host's address and rack stay: a push to every host
        # of a 4,096-host job names ~32 peers each (building them was 60 % of a pass)
        ref = self._peers.get(host)
        if ref is None or ref.address != address or ref.rack != rack:
            ref = self._peers[host] = PeerRef(host_id=host, address=address, rack=rack)
        return ref


def _read_envelope(row: JobRow) -> bytes | AgentError:
    """A stored job's manifest envelope, or why it cannot be read (the job then FAILED)."""
    try:
        return read_manifest(JobSpec.from_stored(row.spec).manifest_uri)
    except AgentError as exc:
        return exc


__all__ = ["CoordinatorCore", "Post"]
