"""Progress: the agent side of the coordinator (watch, register, assignment, reports).

Agents watch for their jobs and stripe assignments (one stream each, pushed in batches), register (have-bitmap, data
address) and report progress; the coordinator keeps the per-host progress cache, splices a
dead or twice-reported host out of the chains, and answers FindPeers for chunk repair.
"""

from __future__ import annotations

import logging
import random
import time
from typing import Any, NamedTuple

from relgate_trust.datacenter import host_dc

from relgate_agent.contracts import (
    ACTION_QUARANTINE,
    ORIGIN_PEER,
    STRIPE_DONE,
    SUSPECT_REASONS,
    AssignmentPlan,
    JobRef,
    PeerRef,
    PeerSet,
    ProgressReply,
    ProgressReport,
    Registration,
    StripePlan,
    SuspectReply,
    WatchCursor,
    WatchUpdate,
)
from relgate_agent.coordinator import removal, tally
from relgate_agent.coordinator.attest import HandoffSigning
from relgate_agent.coordinator.budget import origin_rate
from relgate_agent.coordinator.complaints import corroboration, suspect_reporter, withdraw
from relgate_agent.coordinator.failover import stopped_reporting
from relgate_agent.coordinator.jobstate import (
    ACTIVE_STATES,
    GONE_STATES,
    QUARANTINED,
    REMOVED,
    TERMINAL_STATES,
    HostProgress,
    JobState,
    NotEnrolled,
    NotFound,
    ReadyRefused,
    parse_selector,
    selector_matches,
)
from relgate_agent.coordinator.keydiff import KeyLog
from relgate_agent.coordinator.leader import CoordinatorCore
from relgate_agent.coordinator.metrics import (
    SPLICE_DEMOTED,
    SPLICE_QUARANTINED,
    SPLICE_SERVING,
)
from relgate_agent.coordinator.topology import (
    TopologyIndex,
    bypass_peer,
    index_topology,
    members_changed,
    standby_hosts,
)
from relgate_agent.errors import KIND_CHUNK_FAILED, KIND_HOST_FAILED, KIND_NO_SPACE
from relgate_agent.identity.authz import ready_refusal
from relgate_agent.staging.storage import count_bits, merge_delta, stripe_resume_blocks

log = logging.getLogger(__name__)

WATCH_BATCH = 128  # watch cursors computed per hold of the coordinator lock
LOCK_GAP_S = 0.001  # between two holds

ENVELOPE_SOURCES = 3  # hosts a registering agent may fetch the envelope from
UNSERVED_WINDOW_S = 3.0  # a live upstream reported as not serving for this long: a leaf
QUARANTINE_REPORTERS = 2  # independent receivers of bad data before a host is quarantined


class StripePeers(NamedTuple):
    """A host's peers in one stripe as its assignment names them (None upstream: the
    origin, with the root's share of the origin budget): what a push key compares."""

    upstream: PeerRef | None
    downstreams: tuple[PeerRef, ...]
    origin_rate: int
    bypass: PeerRef | None
    standby: tuple[PeerRef, ...]


def _dead(job: JobState, host: str) -> bool:
    hp = job.hosts.get(host)
    return hp is not None and hp.state == "DEAD"


class ProgressService(CoordinatorCore, HandoffSigning):
    # ------------------------------------------------------------------ watch
    def heartbeat(
        self,
        host_id: str,
        rack: str,
        address: str,
        held: list[str],
        *,
        health: str = "",
        data_refusals: int = 0,
    ) -> list[JobRef]:
        """An agent opened its watch: record it as live (address, held versions, health),
        let it join matching active jobs, and answer its active jobs."""
        self.require_leader()
        enrolled = self.store.enrollment(host_id)
        if enrolled is None:
            raise NotEnrolled(f"host {host_id} is not enrolled")
        if enrolled[0] != rack:
            raise NotEnrolled(f"host {host_id} is enrolled in rack {enrolled[0]}, not {rack!r}")
        labels = dict(enrolled[1])  # the enrollment's labels, never what the host claims
        self.health[host_id] = (health[:500], int(data_refusals))
        # the inventory row is rewritten when it changes, or before its last_seen could
        # age a live host out (a third of the host TTL): a watch reopened every 20 s by
        # 4,096 hosts is not 200 transactions a second
        seen = (rack, tuple(sorted(labels.items())), address, tuple(held))
        now = self.clock()
        last = self._inventory_written.get(host_id)
        if last is None or last[0] != seen:
            self.store.upsert_host(host_id, rack, labels, address, held)
            self._inventory_written[host_id] = (seen, now)
        elif now - last[1] >= self.config.host_ttl_s / 3:
            # only its last_seen is due: batched, written by the sweeper's next tick in one
            # transaction (flush_last_seen), long before it could age the host out
            with self.lock:
                self._last_seen_due[host_id] = int(self.wall())
            self._inventory_written[host_id] = (seen, now)
        with self.lock:
            self.require_leader()
            self._readdress(host_id, address)
            for job in self.jobs.values():  # heard from by this leader (failover.py)
                if (hp := job.hosts.get(host_id)) is not None:
                    hp.reported = True
            self._late_join(host_id, rack, labels, held)
            return self._jobs_of(host_id)

    def _jobs_of(self, host_id: str) -> list[JobRef]:
        return [
            JobRef(j.job_id, j.manifest.model, j.manifest.version, j.state, j.spec.priority)
            for j in self.jobs.values()
            if host_id in j.targets and j.state in ACTIVE_STATES and not j.hosts[host_id].removed
        ]

    def watch_updates(self, cursors: list[WatchCursor]) -> list[WatchUpdate | None]:
        """For each watch cursor, what its stream has not been told yet (None: nothing), and
        the cursor advanced past it: a burst of topology changes costs one computation per
        host, not one per change. The lock is taken per WATCH_BATCH cursors, not for the
        whole fleet: a pass over 4,096 hosts must not hold every report behind it."""
        self.require_leader()
        out: list[WatchUpdate | None] = []
        ended: dict[str, AssignmentPlan] = {}
        for start in range(0, len(cursors), WATCH_BATCH):
            if start:
                # the lock hands over to no one by itself (the releasing thread takes it
                # again first): a moment without it lets the reports queued on it in
                time.sleep(LOCK_GAP_S)
            with self.lock:
                self.require_leader()
                self.apply_waiting()  # and the reports that queued anyway: applied here
                out += self._watch_batch(cursors[start : start + WATCH_BATCH], ended)
        return out

    def _watch_batch(
        self, cursors: list[WatchCursor], ended: dict[str, AssignmentPlan]
    ) -> list[WatchUpdate | None]:
        out: list[WatchUpdate | None] = []
        # everything a push depends on: which jobs, their state, topology version,
        # targets and removals; a cursor brought up to date under the same signature
        # has no news (a report's poke wakes the hub, not 4,096 evaluations)
        sig = tuple(
            (j.job_id, j.state, j.topology.version, len(j.targets), j.removals, j.registrations)
            for j in self.jobs.values()
        )
        by_host: dict[str, list[JobState]] | None = None
        for cur in cursors:
            if cur.seen == sig:
                out.append(None)
                continue
            cur.seen = sig
            if by_host is None:
                by_host = self._jobs_by_host_at(sig)
            jobs = by_host.get(cur.host_id, [])
            refs = tuple(
                JobRef(j.job_id, j.manifest.model, j.manifest.version, j.state, j.spec.priority)
                for j in jobs
            )
            plans = self._changed_plans(cur, jobs)
            live = {j.job_id for j in jobs}
            for job_id in [j for j in cur.versions if j not in live]:
                # told about before, active no more: say how it ended, once
                plan = self._removed_plan(job_id, cur.host_id)
                if plan is None:
                    if job_id not in ended:
                        ended[job_id] = self._ended(job_id)
                    plan = ended[job_id]
                if plan.job_state not in ACTIVE_STATES:
                    plans.append(plan)
                    del cur.versions[job_id]
            if cur.jobs == frozenset(live) and not plans:
                out.append(None)
                continue
            cur.jobs = frozenset(live)
            for p in plans:
                if not p.cancelled:
                    cur.versions[p.job_id] = p.topology_version
            out.append(WatchUpdate(refs, tuple(plans)))
        return out

    def _changed_plans(self, cur: WatchCursor, jobs: list[JobState]) -> list[AssignmentPlan]:
        """The assignments of ``jobs`` newer than ``cur`` holds that change something its
        host acts on (its push key differs from the last one pushed on this stream)."""
        plans = []
        for j in jobs:
            version = j.topology.version
            if version <= cur.versions.get(j.job_id, 0):
                continue
            self._index(j)  # the job's key log up to this version
            if self._key_unmoved(j, cur):  # most hosts, after a splice: nothing to compute
                cur.checked[j.job_id] = version
                self.keys_skipped += 1
                continue
            key = self.push_key(j, cur.host_id)
            self.keys_computed += 1
            cur.checked[j.job_id] = version
            if cur.keys.get(j.job_id) != key:  # never pushed on this stream, or changed
                cur.keys[j.job_id] = key
                plans.append(self._assignment(j, cur.host_id))
        return plans

    def refresh_watching(self) -> int:
        """A host holding its watch open is alive: its last_seen is due like a heartbeat's
        (a third of the host TTL), batched into the next flush, so a watch may outlive
        the TTL's third (4,096 reopens every 20 s cost a sixth of a core). How many."""
        now, wall = self.clock(), int(self.wall())
        due = 0
        with self.lock:
            for h in list(self.watching):  # written by the event loop: a copy, then read
                last = self._inventory_written.get(h)
                if last is not None and now - last[1] >= self.config.host_ttl_s / 3:
                    self._last_seen_due[h] = wall
                    self._inventory_written[h] = (last[0], now)
                    due += 1
        return due

    def flush_last_seen(self) -> int:
        """Write the batched last_seen refreshes (one transaction); how many."""
        with self.lock:
            due, self._last_seen_due = self._last_seen_due, {}
        if due:
            self.store.touch_hosts(due)
        return len(due)

    def _jobs_by_host_at(self, sig: tuple[Any, ...]) -> dict[str, list[JobState]]:
        """:meth:`_jobs_by_host`, kept while the jobs' signature stays the same (every pass
        of a reconnect storm reads it; it changes only with the jobs, targets, removals)."""
        # the same jobs, not only equal ones: a takeover loads new JobState objects
        key = (sig, tuple(id(j) for j in self.jobs.values()))
        cached = self._by_host_cache
        if cached is None or cached[0] != key:
            cached = self._by_host_cache = (key, self._jobs_by_host())
        return cached[1]

    def _jobs_by_host(self) -> dict[str, list[JobState]]:
        """Host -> the active jobs it is a target of and not removed from."""
        by_host: dict[str, list[JobState]] = {}
        for job in self.jobs.values():
            if job.state in ACTIVE_STATES:
                for h in job.targets:
                    if not job.hosts[h].removed:  # told the job ended for it (below)
                        by_host.setdefault(h, []).append(job)
        return by_host

    def _removed_plan(self, job_id: str, host_id: str) -> AssignmentPlan | None:
        """The end of a job for a host removed from it (it stops; its staging is kept)."""
        job = self.jobs.get(job_id)
        hp = job.hosts.get(host_id) if job is not None else None
        if job is None or hp is None or not hp.removed:
            return None
        return AssignmentPlan(job_id, job.topology.version, (), REMOVED, cancelled=True)

    def _ended(self, job_id: str) -> AssignmentPlan:
        """The assignment of a job this coordinator no longer runs: finished or cancelled
        (the agent keeps or discards its staging by the state), or still active elsewhere."""
        job = self.jobs.get(job_id)
        if job is not None:
            return self._assignment(job, "")
        state = self.store.job_state(job_id) or "GONE"
        return AssignmentPlan(job_id, 0, (), state, cancelled=True, leader_epoch=self.epoch)

    def _late_join(self, host_id: str, rack: str, labels: dict[str, str], held: list[str]) -> None:
        holds = None
        for job in self.jobs.values():
            if host_id in job.targets or job.state not in ACTIVE_STATES:
                continue
            if not selector_matches(parse_selector(job.spec.target_selector), rack, labels):
                continue
            if holds is None:  # read once, and only when the host would join a job
                holds = self.ledger.holds()
            if host_id in holds:  # kept out of new jobs until an operator clears it
                return
            job.targets[host_id] = rack
            hp = HostProgress(
                host_id,
                rack,
                self.addresses.get(host_id, ""),
                dc=host_dc(labels),
                last_seen=self.clock(),
            )
            job.hosts[host_id] = hp
            if f"{job.manifest.model}/{job.manifest.version}" in held and host_id in (
                self.store.hosts_holding(
                    job.manifest.model, job.manifest.version, job.manifest.digest
                )
            ):
                hp.ready, hp.state = True, "READY"
                job.ready.add(host_id)
                self.store.update_job(job.job_id, ready_hosts=sorted(job.ready))
                # persist the new target set (stored with the topology) under a new version
                self._set_topology(job, job.topology.copy(job.topology.version + 1))
            else:
                self._set_topology(job, self._append(job, job.topology, host_id, rack))
            log.info("job %s: late host %s joined", job.job_id, host_id)
            self.changed.notify_all()

    # ------------------------------------------------------------------ register
    def register(
        self,
        job_id: str,
        host_id: str,
        rack: str,
        have: bytes,
        free_disk: int,
        address: str,
        *,
        serving_rate: int = 0,
        envelope_from_peers: bool = False,
    ) -> Registration:
        self.require_leader()
        with self.lock:
            job = self._job(job_id)
            if host_id not in job.targets:
                raise NotFound(f"host {host_id} is not a target of job {job_id}")
            hp = job.hosts[host_id]
            if hp.state == QUARANTINED:
                raise NotFound(f"host {host_id} is quarantined in job {job_id}")
            if hp.removed:
                raise NotFound(f"host {host_id} was removed from job {job_id}: {hp.removed}")
            moved = bool(address) and address != hp.address
            hp.rack = rack or hp.rack
            self._readdress(host_id, address or hp.address, hp)
            hp.have = bytes(have[: (job.manifest.num_chunks + 7) // 8])  # bounded: hostile length
            hp.verified = count_bits(hp.have, job.manifest.num_chunks)
            hp.last_seen, hp.reported = self.clock(), True
            hp.registrations += 1
            job.registrations += 1
            if hp.state in ("DEAD", "PENDING") and not hp.ready:
                hp.state = "TRANSFERRING"
            if not hp.ready and hp.state != QUARANTINED and host_id not in job.topology.racks:
                # a rejoining host goes to the tail of its rack chain: it never blocks anyone ahead
                self._set_topology(job, self._append(job, job.topology, host_id, hp.rack))
            elif moved and host_id in job.topology.racks:
                # a restarted agent listens on a new address: bump the version so its
                # downstreams refetch their assignment and reconnect
                self._set_topology(job, job.topology.copy(job.topology.version + 1))
            if serving_rate > 0 and not hp.demoted and host_id in job.topology.racks:
                # a host that caps its upload (it serves inference, say) would throttle
                # everyone behind it: a leaf at its rack tail in every stripe from the start
                hp.demoted = True
                hp.errors.append(f"LEAF declared serving rate {serving_rate} B/s")
                idx = self._index(job)
                if any(idx.downstreams(s, host_id) for s in range(job.stripes)):
                    self._set_topology(
                        job, self._append(job, self._splice(job, host_id), host_id, hp.rack)
                    )
                    self.metrics.splices.labels(SPLICE_SERVING).inc()
            sources = self._envelope_sources(job, hp) if envelope_from_peers else ()
            if not any(s.rack == hp.rack for s in sources):
                # 2.5 MB for a 12,500-chunk manifest: sent once per rack, the rack's first
                # registrant; the others fetch it from it (or any source named)
                sources = ()
                self._add_envelope_source(job, hp)
            return Registration(
                manifest_envelope=b"" if sources else job.envelope,
                manifest_digest=job.manifest.digest,
                origin_uri=job.spec.origin_uri,
                topology_version=job.topology.version,
                stripes=job.stripes,
                manifest_sources=sources,
            )

    def _envelope_sources(self, job: JobState, hp: HostProgress) -> tuple[PeerRef, ...]:
        """Up to ENVELOPE_SOURCES hosts that hold the job's manifest or were sent it (they
        hold it verified within moments; an agent retries one that does not yet): same
        rack first, then any rack, reporters of it first, each tier drawn at random so a
        registration storm spreads (a bounded sample: constant work per Register)."""
        same = job.envelope_sources.get(hp.rack, [])
        others = [h for r, hs in job.envelope_sources.items() if r != hp.rack for h in hs[:8]]
        picked: list[PeerRef] = []
        for pool in (same, others):
            drawn = random.sample(pool, min(len(pool), 4 * ENVELOPE_SOURCES))
            drawn.sort(key=lambda h: not job.hosts[h].holds_envelope)  # stable: random within
            for h in drawn:
                p = job.hosts[h]
                # the two pools are different racks: nobody is drawn twice
                if h != hp.host_id and p.address and p.state not in GONE_STATES:
                    picked.append(self._peer(job, h))
                if len(picked) == ENVELOPE_SOURCES:
                    return tuple(picked)
        return tuple(picked)

    @staticmethod
    def _add_envelope_source(job: JobState, hp: HostProgress) -> None:
        rack = job.envelope_sources.setdefault(hp.rack, [])
        if hp.host_id not in rack:
            rack.append(hp.host_id)

    # ------------------------------------------------------------------ assignment
    def _index(self, job: JobState) -> TopologyIndex:
        """The lookups of the job's topology, built once per version; building one also logs
        which hosts' push keys the change from the last one may have moved (keydiff.py)."""
        idx = self._indexes.get(job.job_id)
        if idx is None or idx.version != job.topology.version:
            topo = job.topology
            new = self._indexes[job.job_id] = index_topology(topo)
            places = {h: self._place(job, h) for h in topo.racks}
            log = self._keylogs.setdefault(job.job_id, KeyLog())
            before = self._indexed.get(job.job_id)
            if idx is not None and before is not None and before.version == idx.version:
                readdressed = {h for h, n in self.moved_at.items() if n > log.moves_seen}
                log.record(before, idx, topo, new, places, readdressed)
            else:
                log.start(places)
            log.moves_seen = self.place_moves
            self._indexed[job.job_id] = topo
            if idx is not None and members_changed(
                idx.members, new.members, lambda h: _dead(job, h)
            ):
                job.members_gen += 1
            idx = new
        return idx

    def _key_head(self, job: JobState, host_id: str) -> tuple[object, ...]:
        """What a push key holds beside the stripes: the job's state, member generation and
        leader epoch, and the host's Registers (read after :meth:`_index`)."""
        hp = job.hosts.get(host_id)
        return (
            job.state,
            job.members_gen,
            hp.registrations if hp else 0,
            self.epoch_of(job.job_id),
        )

    def _key_unmoved(self, job: JobState, cur: WatchCursor) -> bool:
        """Whether the key last pushed on ``cur`` is still the host's: the head is the same
        and no topology change since the version it was last checked at moved the host."""
        pushed, since = cur.keys.get(job.job_id), cur.checked.get(job.job_id)
        if pushed is None or since is None:
            return False
        head = self._key_head(job, cur.host_id)
        if pushed[: len(head)] != head:
            return False
        log = self._keylogs.get(job.job_id)
        return log is not None and log.unmoved(cur.host_id, since, job.topology.version)

    def push_key(self, job: JobState, host_id: str) -> tuple[object, ...]:
        """Everything of ``host_id``'s assignment it acts on, but the topology version and
        its resume blocks (read only when it dials a new upstream, which changes the key):
        per stripe its peers (:meth:`_stripe_peers`); the job's state, member generation
        and the host's Registers. Equal keys: the newer version is not pushed to this host
        (its held assignment says the same; its peers' versions may run ahead of it, and
        the data plane's member checks allow every pair the key leaves unchanged)."""
        idx = self._index(job)  # first: a new index may move the member generation
        head = self._key_head(job, host_id)
        if host_id not in job.topology.racks:
            return head
        return (*head, *(self._stripe_peers(job, idx, s, host_id) for s in range(job.stripes)))

    def _stripe_peers(self, job: JobState, idx: TopologyIndex, s: int, host: str) -> StripePeers:
        topo = job.topology
        chain = topo.stripes[s]
        up = chain.parent.get(host)
        skip_to = bypass_peer(topo, chain, host)
        return StripePeers(
            upstream=self._peer(job, up) if up else None,
            downstreams=tuple(self._peer(job, d) for d in idx.downstreams(s, host)),
            # the root's share of the job's origin budget (budget.py)
            origin_rate=origin_rate(job, s) if up is None else 0,
            bypass=self._peer(job, skip_to) if skip_to else None,
            standby=tuple(self._peer(job, g) for g in standby_hosts(idx, s, host, topo)),
        )

    def _assignment(self, job: JobState, host_id: str) -> AssignmentPlan:
        topo = job.topology
        idx = self._index(job)
        stripes: list[StripePlan] = []
        if host_id in topo.racks:
            resume = self._resume_blocks(job, host_id)
            for s, chain in enumerate(topo.stripes):
                p = self._stripe_peers(job, idx, s, host_id)
                stripes.append(
                    StripePlan(
                        stripe=s,
                        upstream=p.upstream or ORIGIN_PEER,
                        downstreams=p.downstreams,
                        resume_block=resume[s],
                        origin_rate_bytes_per_s=p.origin_rate,
                        compress=topo.crosses_dc(chain.parent.get(host_id), host_id),
                        bypass=p.bypass,
                        standby=p.standby,
                    )
                )
        return AssignmentPlan(
            job_id=job.job_id,
            topology_version=topo.version,
            stripes=tuple(stripes),
            job_state=job.state,
            # FAILED stops the agents too (they keep staging and journal for a retry)
            cancelled=job.state in ("CANCELLED", "FAILED"),
            members=idx.members,
            leader_epoch=self.epoch_of(job.job_id),
        )

    @staticmethod
    def _resume_blocks(job: JobState, host: str) -> list[int]:
        hp, m = job.hosts.get(host), job.manifest
        last = len(m.chunks[-1].block_crc32c) if m.chunks else 0
        return stripe_resume_blocks(
            hp.have if hp else b"", m.num_chunks, job.stripes, m.blocks_per_chunk, last
        )

    # ------------------------------------------------------------------ progress
    def report_progress(self, job_id: str, host_id: str, report: ProgressReport) -> ProgressReply:
        self.require_leader()
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                self.elsewhere(job_id)  # active, led by another replica: NotLeader naming it
                # CANCEL: discard staging; STOP: the job finished, keep what is placed
                cancelled = self.store.job_state(job_id) == "CANCELLED"
                return ProgressReply(0, ("CANCEL" if cancelled else "STOP",))
            hp = job.hosts.get(host_id)
            if hp is None:
                return ProgressReply(job.topology.version, ("REREGISTER",))
            if hp.removed:  # its last counters still count; the job ended for it
                tally.merge_report(hp, report)
                return ProgressReply(job.topology.version, ("STOP",))
            whole = self._record(job, hp, report)
            self.health[host_id] = (report.health[:500], int(report.data_refusals))
            if job.state == "FAILED":
                return ProgressReply(job.topology.version, ("STOP",))
            if hp.state == QUARANTINED:  # never READY again in this job
                return ProgressReply(job.topology.version, (ACTION_QUARANTINE,))
            actions: list[str] = [] if whole else ["FULL_PROGRESS"]
            if report.ready and not hp.ready:
                self._accept_ready(job, hp, report)
            elif not hp.ready:
                if hp.state == "DEAD":
                    actions.append("REREGISTER")  # it was spliced out; rejoin at a rack tail
                elif hp.state == "PENDING":
                    hp.state = "TRANSFERRING"
            return ProgressReply(
                job.topology.version, tuple(actions), job.origin_by_root.get(host_id, ())
            )

    def _record(self, job: JobState, hp: HostProgress, report: ProgressReport) -> bool:
        """Counters, have-bitmap and errors of one report into the progress cache.

        False when a delta did not bring the cached bitmap to the agent's count (a delta that
        is malformed, or on top of a bitmap this coordinator does not hold, e.g. after a
        takeover): the agent is asked for its whole bitmap.
        """
        hp.last_seen, hp.reported = self.clock(), True
        job.fresh_rates.add(hp.host_id)
        if hp.rates_since is None:
            hp.rates_since = hp.last_seen
        holds = report.manifest_digest == job.manifest.digest
        if holds and not hp.holds_envelope:
            self._add_envelope_source(job, hp)
        hp.holds_envelope = holds
        whole = self._merge_have(job, hp, report)
        tally.merge_report(hp, report)  # cumulative (journaled by the agent): only grows
        hp.rx_bps, hp.tx_bps = report.rx_bps, report.tx_bps
        # hostile length: one rate per stripe at most; a short list judges fewer stripes
        # a stripe pulled from the bypass peer says nothing of the hop the topology names
        # (nor of the host's own receive): not judged, like a stripe held whole
        bypassed = frozenset(report.bypassed_stripes)
        hp.stripe_rx_bps = tuple(
            STRIPE_DONE if s in bypassed else int(r)
            for s, r in enumerate(report.stripe_rx_bps[: job.stripes])
        )
        hp.bypassed = tuple(sorted(s for s in bypassed if 0 <= s < job.stripes))
        if report.data_address:
            self._readdress(hp.host_id, report.data_address, hp)
        for e in report.errors:
            hp.errors.append(e)
            # no hangs: a chunk that failed N times from the origin / every peer ends the
            # job (the agent names chunk, file and origin object); a host that gave up is
            # FAILED (a straggler, the others go on)
            if e.startswith(KIND_CHUNK_FAILED) and job.state not in TERMINAL_STATES:
                self._fail_job(job, f"{hp.host_id}: {e}")
            elif e.startswith(KIND_NO_SPACE) and not hp.ready:
                # out of disk (it freed its staging): out of the job, downstreams re-fed
                removal.remove_host(self, job, hp.host_id, e)
            elif e.startswith(KIND_HOST_FAILED) and not hp.ready and hp.state != "FAILED":
                if hp.host_id in job.topology.racks:  # its downstreams must not wait for it
                    self._mark_dead(job, hp.host_id, "the host gave up (HOST_FAILED)")
                hp.state = "FAILED"
        return whole

    @staticmethod
    def _merge_have(job: JobState, hp: HostProgress, report: ProgressReport) -> bool:
        n = job.manifest.num_chunks
        if report.have or report.verified_count <= 0:  # a whole bitmap
            hp.have = bytes(report.have[: (n + 7) // 8])  # a longer one is not kept
            hp.verified = count_bits(hp.have, n)
            return True
        merged = merge_delta(hp.have, report.verified_delta, n)
        if merged is None:
            return False
        # the cached count is of hp.have's first n bits: it grows by the chunks new to it
        hp.have, hp.verified = merged[0], hp.verified + merged[1]
        return hp.verified == report.verified_count

    def _accept_ready(self, job: JobState, hp: HostProgress, report: ProgressReport) -> None:
        why = ready_refusal(
            hp.verified, job.manifest.num_chunks, report.placed_manifest_digest, job.manifest.digest
        )
        if why is not None:
            job.ready_refusals += 1
            hp.errors.append(why)
            log.warning("job %s: %s from %s", job.job_id, why, hp.host_id)
            raise ReadyRefused(f"{why} (job {job.job_id}, host {hp.host_id})")
        self._accept_attestation(job, hp, report)  # refuses READY with a forged one
        hp.ready, hp.state = True, "READY"
        job.ready.add(hp.host_id)
        self.store.update_job(job.job_id, ready_hosts=sorted(job.ready))
        self.store.mark_host_version(
            hp.host_id, job.manifest.model, job.manifest.version, job.manifest.digest
        )
        tally.save(self.ledger, job, self.clock(), hosts=(hp.host_id,))  # it stops reporting
        log.info(
            "job %s: %s READY (%d/%d)", job.job_id, hp.host_id, len(job.ready), len(job.targets)
        )
        self.changed.notify_all()

    # ------------------------------------------------------------------ repair
    def report_suspect(
        self, job_id: str, reporter: str, suspect: str, reason: str, stripe: int
    ) -> SuspectReply:
        self.require_leader()
        with self.lock:
            job = self._job(job_id)
            if reporter not in job.targets:
                raise NotFound(f"host {reporter} is not a target of job {job_id}")
            self.metrics.suspects.labels(reason if reason in SUSPECT_REASONS else "other").inc()
            hp = job.hosts.get(suspect)
            if hp is not None and suspect in job.topology.racks:
                self._judge_suspect(job, hp, reporter, reason)
            chain = job.topology.stripes[stripe] if 0 <= stripe < job.stripes else None
            up = chain.parent.get(reporter) if chain else None
            return SuspectReply(job.topology.version, self._peer(job, up) if up else ORIGIN_PEER)

    def _judge_suspect(self, job: JobState, hp: HostProgress, reporter: str, reason: str) -> None:
        suspect = hp.host_id
        upstream_of_reporter = any(c.parent.get(reporter) == suspect for c in job.topology.stripes)
        if reason == "BAD_DATA" and not upstream_of_reporter:
            # only a host's own upstream can have sent it bad data
            hp.errors.append(f"BAD_DATA from non-downstream {reporter} ignored")
        elif reason == "BAD_DATA":
            hp.bad_data_reporters.add(reporter)
            hp.errors.append(f"BAD_DATA reported by {reporter}")
            if self._judge_parties(job, reporter, suspect):
                return  # the reporter was the suspect: its complaints are withdrawn
            if len(hp.bad_data_reporters) >= QUARANTINE_REPORTERS:
                self._quarantine(job, hp)
        elif not self.config.splice_on_suspect:
            return
        elif stopped_reporting(hp, self.clock(), self.config):
            # the suspect also stopped reporting to us: treat as dead, splice now
            self._mark_dead(job, suspect, f"{reason} from {reporter}")
        elif upstream_of_reporter:
            self._judge_unserving(job, hp, reporter, reason)

    def _judge_parties(self, job: JobState, reporter: str, accused: str) -> bool:
        """Remove whichever of the two is the suspect of its complaints (complaints.py);
        True when the reporter was (its complaint then counts for nothing)."""
        for host in (reporter, accused):
            why = suspect_reporter(job, host)
            if why is None:
                continue
            hp = job.hosts[host]
            hp.unserved.clear()
            hp.unserved_reason.clear()
            withdraw(job, host)
            removal.remove_host(self, job, host, why)  # logged, spliced, kept in the ledger
            return host == reporter
        return False

    def _judge_unserving(self, job: JobState, hp: HostProgress, reporter: str, reason: str) -> None:
        """A host that reports to us but does not serve its downstreams (stalled, refusing,
        resetting) blocks them as surely as a dead one: once a downstream has kept
        reporting it for ``unserved_window``, and the complaint is corroborated (a second
        reporter, or its own rates: complaints.py), it becomes a leaf at its rack tail
        (nobody waits behind it; it still receives). A complaint not repeated within two
        windows expires, so a transient one (a reconnect across a topology change) never
        adds up."""
        now, window = self.clock(), self._unserved_window()
        hp.unserved = {  # expired complaints first: an old one must not date this one
            r: (f, last) for r, (f, last) in hp.unserved.items() if now - last <= 2 * window
        }
        hp.unserved_reason = {r: w for r, w in hp.unserved_reason.items() if r in hp.unserved}
        first, _ = hp.unserved.get(reporter, (now, now))
        hp.unserved[reporter] = (first, now)
        hp.unserved_reason[reporter] = reason
        if self._judge_parties(job, reporter, hp.host_id) or hp.state == REMOVED:
            return
        if hp.demoted:
            return
        lasting = sorted(  # a reporter spliced out (dead, removed) has no word left
            r
            for r, (f, _) in hp.unserved.items()
            if now - f >= window and r in job.hosts and job.hosts[r].state not in GONE_STATES
        )
        evidence = next((e for r in lasting if (e := corroboration(job, hp, r))), None)
        if evidence is None:
            return  # one host's word: a dispute, not evidence against this one
        reporters = ", ".join(sorted(hp.unserved))
        log.warning(
            "job %s: %s does not serve (%s from %s; %s): a leaf now",
            job.job_id,
            hp.host_id,
            reason,
            reporters,
            evidence,
        )
        hp.errors.append(f"DEMOTED not serving: {reason} from {reporters} ({evidence})")
        hp.demoted = True
        hp.unserved.clear()
        hp.unserved_reason.clear()
        moved = self._append(job, self._splice(job, hp.host_id), hp.host_id, hp.rack)
        self._set_topology(job, moved)
        self.metrics.splices.labels(SPLICE_DEMOTED).inc()

    def _unserved_window(self) -> float:
        """How long downstreams must keep reporting a live host before it is a leaf."""
        return max(UNSERVED_WINDOW_S, 3 * self.config.report_interval_s)

    def _quarantine(self, job: JobState, hp: HostProgress) -> None:
        """Two independent receivers saw bad data from ``hp`` (likely bad disk or memory):
        spliced out for good, no longer READY nor trusted to hold the version; its next
        report is answered QUARANTINE (scrub staging, re-verify what it holds)."""
        host, reporters = hp.host_id, sorted(hp.bad_data_reporters)
        log.warning("job %s: quarantining %s (BAD_DATA from %s)", job.job_id, host, reporters)
        hp.errors.append(f"{QUARANTINED}: BAD_DATA from {', '.join(reporters)}")
        hp.state, hp.removed_at = QUARANTINED, int(self.wall())
        self.store.quarantine_host(job.job_id, host, reporters, hp.removed_at)
        removal.hold_host(  # no target of a new job until an operator clears it
            self.ledger,
            host,
            removal.HOLD_QUARANTINED,
            f"BAD_DATA from {', '.join(reporters)}",
            job.job_id,
        )
        if hp.ready:
            hp.ready = False
            job.ready.discard(host)
            self.store.update_job(job.job_id, ready_hosts=sorted(job.ready))
            self.store.forget_host_version(host, job.manifest.model, job.manifest.version)
        self._set_topology(job, self._splice(job, host))
        self.metrics.splices.labels(SPLICE_QUARANTINED).inc()

    def find_peers(
        self, job_id: str, host_id: str, chunk: int, exclude: set[str], limit: int
    ) -> PeerSet:
        self.require_leader()
        with self.lock:
            job = self._job(job_id)
            if host_id not in job.targets:
                raise NotFound(f"host {host_id} is not a target of job {job_id}")
            me = job.hosts.get(host_id)
            out = [
                hp
                for h, hp in job.hosts.items()
                if h != host_id
                and h not in exclude
                and hp.state not in GONE_STATES
                and hp.address
                and hp.holds(chunk)
            ]
            # same rack first, then the most complete (least likely to be busy repairing)
            out.sort(key=lambda hp: (hp.rack != (me.rack if me else ""), -hp.verified, hp.host_id))
            named = tuple(self._peer(job, hp.host_id) for hp in out[: max(limit, 1)])
            return PeerSet(named, len(out))


__all__ = ["ProgressService"]
