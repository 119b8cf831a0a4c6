"""Service: the coordinator as the gRPC server drives it, with its operator calls.

The coordinator is never in the data path. It plans striped chains, hands out versioned
assignments, splices dead hosts out, and tells the deployer when enough hosts are ready.
:class:`Coordinator` composes the parts (:mod:`.leader` lease and shared state,
:mod:`.progress` agent calls, :mod:`.handoff` sweeper and webhook) and adds what an
operator calls: create, cancel and report jobs, enroll hosts, list the inventory.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import secrets
import time
from collections.abc import Callable

from relgate_trust.datacenter import host_dc
from relgate_trust.errors import ManifestError
from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import CheckpointManifest, validate_name

from relgate_agent.contracts import (
    DEFAULT_READY_PPM,
    HostReason,
    HostRow,
    InventoryHost,
    JobReport,
    JobSummary,
    JobTopology,
    RemovedHost,
)
from relgate_agent.coordinator import removal, tally, views
from relgate_agent.coordinator.budget import rebalance_origins
from relgate_agent.coordinator.handoff import HandoffService
from relgate_agent.coordinator.jobstate import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    CoordinatorConfig,
    HostProgress,
    JobState,
    NotEnrolled,
    NotFound,
    NotLeader,
    ReadyRefused,
    Rejected,
    default_db_path,
    parse_selector,
    selector_matches,
)
from relgate_agent.coordinator.outbox import Post, http_post
from relgate_agent.coordinator.store import JobRow, StaleTopology
from relgate_agent.coordinator.topology import build_topology
from relgate_agent.dataplane.manifestread import ManifestReadError, read_manifest
from relgate_agent.identity.authz import live_targets
from relgate_agent.pki import PkiError, check_name

log = logging.getLogger(__name__)


class Coordinator(HandoffService):
    def __init__(
        self,
        config: CoordinatorConfig,
        post: Post | None = None,
        clock: Callable[[], float] = time.monotonic,
        wall: Callable[[], float] = time.time,
    ) -> None:
        super().__init__(config, post or http_post, clock, wall)

    # ------------------------------------------------------------------ create
    def _resolve(self, spec: JobSpec, manifest: CheckpointManifest) -> JobSpec:
        """Defaults filled in: origin (the manifest's directory), threshold, webhook, id."""
        uri = spec.manifest_uri
        origin = spec.origin_uri or (uri.rsplit("/", 1)[0] if "/" in uri else ".")
        threshold = min(max(spec.ready_threshold_ppm or DEFAULT_READY_PPM, 1), 1_000_000)
        job_id = spec.job_id
        if not job_id:
            seed = f"{manifest.model}/{manifest.version}/{time.time_ns()}/{secrets.token_hex(4)}"
            job_id = "dj_" + hashlib.sha256(seed.encode()).hexdigest()[:10]
        k = max(1, min(spec.stripes or self.config.default_stripes, manifest.num_chunks))
        return spec.with_(
            origin_uri=origin,
            ready_threshold_ppm=threshold,
            webhook_url=spec.webhook_url or self.config.webhook_url,
            job_id=job_id,
            stripes=k,
        )

    def _checked_manifest(self, spec: JobSpec) -> tuple[CheckpointManifest, bytes]:
        try:
            model = validate_name("model", spec.model)
            version = validate_name("version", spec.version)
        except ManifestError as exc:
            raise Rejected(str(exc), check="checkpoint-name") from exc
        if not spec.manifest_uri:
            raise Rejected("manifest_uri is required", check="manifest-uri")
        try:  # bounded, regular files only, with a deadline; never under the lock
            envelope = read_manifest(spec.manifest_uri)
        except ManifestReadError as exc:
            raise Rejected(str(exc), check=exc.check) from exc
        manifest = self._verify(envelope)
        if (manifest.model, manifest.version) != (model, version):
            raise Rejected(
                f"manifest {manifest.digest} is for {manifest.model}/{manifest.version}, not {model}/{version}",
                check="manifest-subject",
            )
        return manifest, envelope

    def create_job(self, spec: JobSpec) -> JobState:
        self.require_leader()
        manifest, envelope = self._checked_manifest(spec)
        sel = parse_selector(spec.target_selector)
        with self.lock:
            spec = self._resolve(spec, manifest)
            if spec.job_id not in self.jobs:
                self.elsewhere(spec.job_id)  # a retried create goes to the job's leader
            if spec.job_id in self.jobs:
                existing = self.jobs[spec.job_id]
                if existing.manifest.digest != manifest.digest:
                    raise Rejected(
                        f"job {spec.job_id} exists with manifest {existing.manifest.digest}",
                        check="job-exists",
                    )
                return existing
            # enrolled hosts with a recent heartbeat only; never whoever happened to call
            enrolled = self.store.enrolled()
            targets = live_targets(
                enrolled,
                self.store.last_seen(),
                time.time(),
                self.config.host_ttl_s,
                sel,
            )
            # a host held for its health (quarantined for bad data...) is no target until
            # an operator clears it (coordinator/removal.py)
            held = self.ledger.holds()
            targets = {h: r for h, r in targets.items() if h not in held}
            holding = self.store.hosts_holding(
                manifest.model, manifest.version, manifest.digest
            ) & set(targets)
            dcs = {h: host_dc(enrolled[h][1]) for h in targets}
            if spec.origin_dc and spec.origin_dc not in dcs.values():
                raise Rejected(
                    f"origin data center {spec.origin_dc!r} has no target host "
                    f"(targets are in {sorted(set(dcs.values()))})",
                    check="origin-dc",
                )
            topo = build_topology(
                {h: r for h, r in targets.items() if h not in holding},
                spec.stripes,
                dcs=dcs,
                home_dc=spec.origin_dc,
            )
            job = JobState(
                spec.job_id,
                spec,
                "DISTRIBUTING",
                manifest,
                envelope,
                targets,
                topo,
                set(holding),
                False,
                time.time(),
            )
            for h, rack in targets.items():
                hp = HostProgress(
                    h, rack, self.addresses.get(h, ""), dc=dcs[h], last_seen=self.clock()
                )
                if h in holding:
                    hp.ready, hp.state = True, "READY"
                job.hosts[h] = hp
            self._store_new(job, holding)
            log.info(
                "job %s: %s/%s to %d hosts (%d already hold it), k=%d",
                job.job_id,
                manifest.model,
                manifest.version,
                len(targets),
                len(holding),
                spec.stripes,
            )
            return job

    def _store_new(self, job: JobState, holding: set[str]) -> None:
        created = self.store.create_job(
            JobRow(
                job.job_id,
                job.spec.to_stored(),
                job.state,
                job.manifest.digest,
                job.targets,
                job.topology,
                sorted(holding),
                False,
                int(job.created_at),
            )
        )
        if not created:
            raise Rejected(
                f"job {job.job_id} already exists (finished); pick a new job id",
                check="job-exists",
            )
        if self.shard is not None:
            epoch = self.shard.claim_new(job.job_id, len(self.jobs))
            if epoch is None:  # over this replica's share: another one takes the lease
                log.info("job %s: left to another replica (this one leads its share)", job.job_id)
                return
            self.shard.epochs[job.job_id] = epoch
        self.jobs[job.job_id] = job
        # its roots' shares of its origin's budget before any assignment names them
        rebalance_origins(self.jobs.values(), self.clock(), self.config.report_interval_s)
        self.changed.notify_all()

    def cancel_job(self, job_id: str) -> tuple[tuple[str, ...], int]:
        """Cancel; (the hosts that had placed the version, the targets): a cancel after
        placement records what was placed (the job row's ready hosts, the figures)."""
        self.require_leader()
        with self.lock:
            job = self._job(job_id)
            job.state = "CANCELLED"
            tally.save(self.ledger, job, self.clock(), hosts=tuple(job.hosts))
            self.store.save_figures(job_id, self._figures(job))
            placed = tuple(sorted(job.ready & set(job.targets)))
            self.store.update_job(job_id, state="CANCELLED", ready_hosts=list(placed))
            if placed:
                log.warning(
                    "job %s cancelled with %d of %d hosts placed: %s",
                    job_id,
                    len(placed),
                    len(job.targets),
                    ", ".join(placed),
                )
            del self.jobs[job_id]
            self.changed.notify_all()
            return placed, len(job.targets)

    def evict_host(self, job_id: str, host_id: str, reason: str, by: str) -> bool:
        """Operator: remove a target from a job (True: removed now; False: it already was)."""
        return removal.evict(self, job_id, host_id, reason, by)

    def clear_host(self, host_id: str, note: str) -> str:
        """Operator: clear a host's health hold after a scrub; the hold it had ("" none)."""
        was = removal.clear_hold(self, host_id, note)
        return "" if was is None else was.describe()

    # ------------------------------------------------------------------ report
    def job_status(self, job_id: str) -> JobReport:
        self.require_leader()
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                self.elsewhere(job_id)  # led by another replica: NotLeader naming it
                return self._stored_status(job_id)  # ended: no lease leads it
            report = self._live_status(job)  # in memory: this replica leads it
            epoch = self.epoch_of(job_id)
        return dataclasses.replace(report, leader_replica=self.replica_id, leader_epoch=epoch)

    def _stored_status(self, job_id: str) -> JobReport:
        rows = [r for r in self.store.load_jobs() if r.job_id == job_id]
        if not rows:
            raise NotFound(f"job {job_id} is unknown")
        r = rows[0]
        spec = JobSpec.from_stored(r.spec)
        fig = self.store.figures(job_id) or {}
        return JobReport(
            job_id=job_id,
            state=r.state,
            model=spec.model,
            version=spec.version,
            manifest_digest=r.manifest_digest,
            hosts_total=len(r.targets),
            hosts_ready=len(set(r.ready_hosts) & set(r.targets)),
            ready_hosts=tuple(sorted(r.ready_hosts)),
            topology_version=r.topology.version,
            completion_emitted=r.completion_emitted,
            # frozen when the job finished (0 for jobs finished before figures existed)
            bytes_moved=int(fig.get("bytes_moved", 0)),
            origin_bytes=int(fig.get("origin_bytes", 0)),
            checkpoint_bytes=int(fig.get("checkpoint_bytes", 0)),
            duration_s=float(fig.get("duration_s", 0.0)),
            control_refusals=self.control_refusals,
            stragglers=tuple(fig.get("stragglers", [])),
            eta_s=0 if r.state == "DONE" else -1,
            hosts=tuple(HostRow.from_stored(h) for h in fig.get("hosts", [])),
            pending_events=self.store.count_pending_events(job_id),
            quarantined_hosts=tuple(sorted(self.store.quarantined(job_id))),
            straggler_reasons=tuple(
                HostReason.from_stored(d) for d in fig.get("straggler_reasons", [])
            ),
            removed_hosts=tuple(RemovedHost.from_stored(d) for d in fig.get("removed", [])),
            failure=str(fig.get("failure", "")),
        )

    def _live_status(self, job: JobState) -> JobReport:
        now, remove_after = self.clock(), self.config.remove_dead_after_s
        reasons = tally.stragglers(job, now, remove_after)
        return JobReport(
            job_id=job.job_id,
            state=job.state,
            model=job.manifest.model,
            version=job.manifest.version,
            manifest_digest=job.manifest.digest,
            hosts_total=len(job.targets),
            hosts_ready=job.ready_count,
            ready_hosts=tuple(sorted(job.ready)),
            bytes_moved=tally.bytes_moved(job),
            origin_bytes=tally.origin_bytes(job),
            checkpoint_bytes=job.manifest.total_size,
            stragglers=tuple(r.host_id for r in reasons),
            eta_s=tally.eta_s(job, now, remove_after),
            topology_version=job.topology.version,
            completion_emitted=job.completion_emitted,
            duration_s=time.time() - job.created_at,
            control_refusals=self.control_refusals,
            hosts=self._host_rows(job),
            pending_events=self.store.count_pending_events(job.job_id),
            quarantined_hosts=tuple(sorted(job.quarantined)),
            straggler_reasons=reasons,
            removed_hosts=removal.removed_hosts(job),
            failure=job.error if job.state == "FAILED" else "",
        )

    # ------------------------------------------------------------------ operator views
    def list_jobs(self, state: str = "") -> list[JobSummary]:
        """Every job this coordinator's store knows (live ones as they are now), oldest
        first; ``state`` keeps those in that state ("" all)."""
        self.require_leader()
        if state and state not in (*ACTIVE_STATES, *TERMINAL_STATES):
            raise Rejected(
                f"job state {state!r} is not one of {', '.join((*ACTIVE_STATES, *TERMINAL_STATES))}",
                check="job-state",
            )
        rows = self.store.load_jobs()  # never under the lock
        leaders = self._leaders()
        with self.lock:
            self.require_leader()
            live = {j.job_id: views.live_summary(j) for j in self.jobs.values()}
        out = {r.job_id: views.stored_summary(r) for r in rows} | live
        out = {j: views.with_leader(s, leaders.get(j)) for j, s in out.items()}
        return sorted(
            (j for j in out.values() if not state or j.state == state),
            key=lambda j: (j.created_at, j.job_id),
        )

    def _leaders(self) -> dict[str, tuple[str, str, int]]:
        """Job -> (leading replica, its address, lease epoch) for ``job list``: every live
        job lease when sharded, this replica's own jobs at its epoch otherwise."""
        if self.shard is not None:
            return self.shard.leaders()
        with self.lock:
            return {j: (self.replica_id, "", self.epoch) for j in self.jobs}

    def job_topology(self, job_id: str) -> JobTopology:
        """The job's current striped chains: each stripe's hops (upstream, downstreams) with
        the rate and verified bytes the progress cache holds; a finished job's last stored
        topology (coordinator/views.py)."""
        self.require_leader()
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                self.elsewhere(job_id)
            snap = views.snapshot(job) if job is not None else None
        if snap is not None:
            return views.topology_view(snap)
        rows = [r for r in self.store.load_jobs() if r.job_id == job_id]
        if not rows:
            raise NotFound(f"job {job_id} is unknown")
        row = rows[0]
        try:  # the stripes' sizes; a manifest gone or no longer trusted leaves them unknown
            manifest: CheckpointManifest | None = self._verify(
                read_manifest(JobSpec.from_stored(row.spec).manifest_uri)
            )
        except (ManifestReadError, ManifestError, Rejected) as exc:
            log.info("job %s: topology without stripe sizes (%s)", job_id, exc)
            manifest = None
        if manifest is not None and manifest.digest != row.manifest_digest:
            manifest = None  # the file at the URI is another manifest now
        return views.stored_view(row, manifest, set(row.ready_hosts) & set(row.targets))

    # ------------------------------------------------------------------ inventory
    def enroll(self, host_id: str, rack: str, labels: dict[str, str], remove: bool = False) -> bool:
        """Operator: enroll (or remove) a host by its certificate host id and rack."""
        self.require_leader()
        try:
            check_name("host id", host_id)
            if not remove:
                check_name("rack", rack)
        except PkiError as exc:
            raise Rejected(str(exc), check="host-name") from exc
        # the enrollment is the inventory's authority: the next heartbeat rewrites its row
        self._inventory_written.pop(host_id, None)
        if remove:
            self.store.unenroll(host_id)
            return False
        self.store.enroll(host_id, rack, dict(labels))
        return True

    def inventory(self) -> list[InventoryHost]:
        self.require_leader()
        enrolled = self.store.enrolled()
        seen = self.store.last_seen()
        holds = self.ledger.holds()
        now = time.time()
        out = []
        for h in sorted(set(enrolled) | set(seen)):
            rack, labels = enrolled.get(h, ("", {}))
            age = now - seen[h] if h in seen else -1.0
            health, refusals = self.health.get(h, ("", 0))
            out.append(
                InventoryHost(
                    host_id=h,
                    rack=rack,
                    labels=labels,
                    enrolled=h in enrolled,
                    last_seen_age_s=age,
                    live=h in enrolled and 0 <= age <= self.config.host_ttl_s,
                    health=health,
                    data_refusals=refusals,
                    hold=holds[h].describe() if h in holds else "",
                )
            )
        return out


__all__ = [
    "Coordinator",
    "CoordinatorConfig",
    "NotEnrolled",
    "NotFound",
    "NotLeader",
    "ReadyRefused",
    "Rejected",
    "StaleTopology",
    "default_db_path",
    "parse_selector",
    "selector_matches",
]
