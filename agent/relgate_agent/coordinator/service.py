"""Coordinator logic, independent of gRPC: jobs, topology repair, progress cache, handoff.

The coordinator is never in the data path. It plans striped chains, hands out versioned
assignments, splices dead hosts out, and tells the deployer when enough hosts are ready.
Durable state (job, targets, latest topology) is in the JobStore; the per-(host, chunk)
bitmap and byte counters are a memory cache rebuilt from Register/ReportProgress.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import secrets
import statistics
import threading
import time
import urllib.request
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from relgate_agent.authz import live_targets, ready_refusal
from relgate_agent.coordinator.store import JobRow, JobStore, StaleTopology
from relgate_agent.coordinator.topology import ORIGIN, Topology, append_host, build_topology, splice
from relgate_agent.errors import (
    KIND_CHUNK_FAILED,
    KIND_HOST_FAILED,
    AgentError,
    ManifestError,
    OriginError,
)
from relgate_agent.manifest import CheckpointManifest, TrustedKeys, validate_name, verify_envelope
from relgate_agent.origin import read_uri
from relgate_agent.storage import bits_from_bitmap

log = logging.getLogger(__name__)

ACTIVE_STATES = ("PLANNING", "DISTRIBUTING", "COMPLETE")
TERMINAL_STATES = ("DONE", "CANCELLED", "FAILED")


class NotFound(AgentError):
    """Unknown job or host (the caller should re-register or stop)."""


class NotLeader(AgentError):
    """This replica does not hold the lease (maps to UNAVAILABLE: clients try the next one)."""


class Rejected(AgentError):
    """A request failed validation or verification (maps to INVALID_ARGUMENT / exit 3).

    ``check`` names the rule that refused it; the server sends it to the client as
    trailing metadata (:data:`relgate_agent.errors.CHECK_METADATA_KEY`)."""

    def __init__(self, message: str, *, check: str = "coordinator-validation") -> None:
        super().__init__(message)
        self.check = check


class NotEnrolled(AgentError):
    """The caller's certificate is valid but its host is not enrolled (PERMISSION_DENIED)."""


class ReadyRefused(AgentError):
    """A READY report without every chunk verified and the placed digest (FAILED_PRECONDITION)."""


@dataclass
class CoordinatorConfig:
    db: str = "coordinator.sqlite"
    trusted_keys: TrustedKeys | None = None
    default_stripes: int = 8
    dead_after_s: float = 6.0
    report_interval_s: float = 1.0
    long_poll_max_s: float = 10.0
    webhook_url: str = ""
    # a host whose rx rate stays under slow_fraction x the median for slow_after_s is moved
    # to the tail of its rack chain (a leaf), so it no longer throttles anyone behind it
    slow_fraction: float = 0.5
    slow_after_s: float = 10.0
    slow_min_median_bps: int = 1_000_000
    # splice a suspect at once when a downstream reports it and it also went silent
    # (off: only the dead-after sweep splices; used to exercise swarm fallback)
    splice_on_suspect: bool = True
    # high availability: replicas share the store and elect a leader through a lease row
    ha: bool = False
    lease_ttl_s: float = 10.0
    replica_id: str = ""
    # an enrolled host counts as a target only if it sent a heartbeat within this many seconds
    host_ttl_s: float = 60.0


@dataclass
class HostProgress:
    host_id: str
    rack: str
    address: str = ""
    have: bytes = b""
    verified: int = 0
    ready: bool = False
    state: str = "PENDING"  # PENDING | TRANSFERRING | READY | DEAD | QUARANTINED
    last_seen: float = field(default_factory=time.monotonic)
    rx: int = 0
    tx: int = 0
    origin: int = 0
    rx_bps: int = 0
    tx_bps: int = 0
    errors: deque[str] = field(default_factory=lambda: deque(maxlen=32))
    bad_data_reporters: set[str] = field(default_factory=set)
    slow_since: float | None = None
    demoted: bool = False


@dataclass
class JobState:
    job_id: str
    spec: dict[str, Any]
    state: str
    manifest: CheckpointManifest
    envelope: bytes
    targets: dict[str, str]
    topology: Topology
    ready: set[str]
    completion_emitted: bool
    created_at: float
    hosts: dict[str, HostProgress] = field(default_factory=dict)
    started: float = field(default_factory=time.monotonic)
    completion: dict[str, Any] | None = None
    ready_refusals: int = 0
    error: str = ""  # why the job FAILED (an agent's CHUNK_FAILED / every host HOST_FAILED)

    @property
    def stripes(self) -> int:
        return len(self.topology.stripes)


def parse_selector(selector: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in filter(None, (s.strip() for s in selector.split(","))):
        k, sep, v = item.partition("=")
        if not sep or not k:
            raise Rejected(
                f"target selector item {item!r} is not key=value", check="target-selector"
            )
        out[k.strip()] = v.strip()
    return out


def selector_matches(sel: dict[str, str], rack: str, labels: dict[str, str]) -> bool:
    merged = {**labels, "rack": rack}
    return all(merged.get(k) == v for k, v in sel.items())


class Coordinator:
    def __init__(
        self, config: CoordinatorConfig, post: Callable[[str, bytes], None] | None = None
    ) -> None:
        self.config = config
        self.store = JobStore(config.db)
        self.lock = threading.RLock()
        self.changed = threading.Condition(self.lock)
        self.jobs: dict[str, JobState] = {}
        self.closing = False  # set on shutdown: long-polls return at once
        self.addresses: dict[str, str] = {}
        # host -> (health text, data-plane refusals) from its last heartbeat or report
        self.health: dict[str, tuple[str, int]] = {}
        self.control_refusals = 0
        self._post = post or _http_post
        self.replica_id = (
            config.replica_id or f"{os.uname().nodename}-{os.getpid()}-{secrets.token_hex(3)}"
        )
        self.epoch = 0
        self.leader = False
        self._lease_renewed = 0.0
        if not config.ha:
            self._become_leader(0)

    # ------------------------------------------------------------------ leadership
    def _become_leader(self, epoch: int) -> None:
        """Load durable state; progress is rebuilt from the agents' next reports."""
        with self.lock:
            self.jobs.clear()
            for host_id, _rack, _labels, address in self.store.hosts():
                self.addresses[host_id] = address
            for row in self.store.load_jobs(ACTIVE_STATES):
                try:
                    self.jobs[row.job_id] = self._load_job(row)
                except AgentError as exc:
                    log.error("job %s cannot be resumed: %s", row.job_id, exc)
                    self.store.update_job(row.job_id, state="FAILED")
            self.epoch = epoch
            self.leader = True
            self.changed.notify_all()
        log.info(
            "coordinator %s leads (epoch %d, %d active jobs)",
            self.replica_id,
            epoch,
            len(self.jobs),
        )

    def _step_down(self, reason: str = "lost the lease") -> None:
        with self.lock:
            if self.leader:
                log.warning("coordinator %s %s; stepping down", self.replica_id, reason)
            self.leader = False
            self.jobs.clear()
            self.changed.notify_all()

    def maintain_lease(self) -> None:
        """Called from the sweeper: take/renew the lease (HA mode), step down when lost."""
        if not self.config.ha:
            return
        now = time.monotonic()
        if self.leader and now - self._lease_renewed < self.config.lease_ttl_s / 3:
            return
        try:
            epoch = self.store.acquire_lease(self.replica_id, self.config.lease_ttl_s)
        except Exception as exc:  # store unreachable: we cannot prove we still lead
            log.warning("lease renewal failed: %s", exc)
            epoch = None
        if epoch is None:
            self._step_down()
            return
        self._lease_renewed = now
        if not self.leader or epoch != self.epoch:
            self._become_leader(epoch)

    def release(self) -> None:
        if self.config.ha and self.leader:
            self._step_down("is shutting down")
            self.store.release_lease(self.replica_id)

    def require_leader(self) -> None:
        if not self.leader:
            raise NotLeader(f"coordinator {self.replica_id} is not the leader")

    # ------------------------------------------------------------------ helpers
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

    def _load_job(self, row: JobRow) -> JobState:
        envelope = read_uri(row.spec["manifest_uri"])
        manifest = self._verify(envelope)
        if manifest.digest != row.manifest_digest:
            raise Rejected(
                f"manifest at {row.spec['manifest_uri']} changed: {manifest.digest} != {row.manifest_digest}",
                check="manifest-changed",
            )
        job = JobState(
            row.job_id,
            row.spec,
            row.state,
            manifest,
            envelope,
            row.targets,
            row.topology,
            set(row.ready_hosts),
            row.completion_emitted,
            float(row.created_at),
        )
        # Rebuilt cache: everyone gets a grace period of one dead interval to report again.
        for h, rack in row.targets.items():
            job.hosts[h] = HostProgress(h, rack, self.addresses.get(h, ""))
            if h in job.ready:
                job.hosts[h].ready = True
                job.hosts[h].state = "READY"
        return job

    def _job(self, job_id: str) -> JobState:
        job = self.jobs.get(job_id)
        if job is None:
            raise NotFound(f"job {job_id} is unknown or finished")
        return job

    def _set_topology(self, job: JobState, topo: Topology) -> None:
        if topo is job.topology:
            return
        try:
            self.store.save_topology(job.job_id, job.topology.version, topo, job.targets)
        except StaleTopology:
            # another replica moved the topology on: we are not the leader any more
            self._step_down()
            raise NotLeader(f"coordinator {self.replica_id} lost a topology race") from None
        job.topology = topo
        self.changed.notify_all()

    # ------------------------------------------------------------------ operator API
    def create_job(self, spec: dict[str, Any]) -> JobState:
        self.require_leader()
        try:
            model = validate_name("model", spec.get("model", ""))
            version = validate_name("version", spec.get("version", ""))
        except ManifestError as exc:
            raise Rejected(str(exc), check="checkpoint-name") from exc
        manifest_uri = str(spec.get("manifest_uri", ""))
        if not manifest_uri:
            raise Rejected("manifest_uri is required", check="manifest-uri")
        try:
            envelope = read_uri(manifest_uri)
        except OriginError as exc:
            raise Rejected(str(exc), check="manifest-read") from exc
        manifest = self._verify(envelope)
        if (manifest.model, manifest.version) != (model, version):
            raise Rejected(
                f"manifest {manifest.digest} is for {manifest.model}/{manifest.version}, not {model}/{version}",
                check="manifest-subject",
            )
        spec = dict(spec)
        spec.setdefault("origin_uri", "")
        if not spec["origin_uri"]:
            spec["origin_uri"] = manifest_uri.rsplit("/", 1)[0] if "/" in manifest_uri else "."
        threshold = int(spec.get("ready_threshold_ppm") or 995000)
        spec["ready_threshold_ppm"] = min(max(threshold, 1), 1_000_000)
        spec["webhook_url"] = spec.get("webhook_url") or self.config.webhook_url
        sel = parse_selector(str(spec.get("target_selector", "")))
        job_id = str(spec.get("job_id") or "")
        if not job_id:
            seed = f"{model}/{version}/{time.time_ns()}/{secrets.token_hex(4)}"
            job_id = "dj_" + hashlib.sha256(seed.encode()).hexdigest()[:10]
        spec["job_id"] = job_id
        with self.lock:
            if job_id in self.jobs:
                existing = self.jobs[job_id]
                if existing.manifest.digest != manifest.digest:
                    raise Rejected(
                        f"job {job_id} exists with manifest {existing.manifest.digest}",
                        check="job-exists",
                    )
                return existing
            # enrolled hosts with a recent heartbeat only; never whoever happened to call
            targets = live_targets(
                self.store.enrolled(),
                self.store.last_seen(),
                time.time(),
                self.config.host_ttl_s,
                sel,
            )
            holding = self.store.hosts_holding(model, version) & set(targets)
            k = int(spec.get("stripes") or self.config.default_stripes)
            k = max(1, min(k, manifest.num_chunks))
            spec["stripes"] = k
            topo = build_topology({h: r for h, r in targets.items() if h not in holding}, k)
            job = JobState(
                job_id,
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
                hp = HostProgress(h, rack, self.addresses.get(h, ""))
                if h in holding:
                    hp.ready, hp.state = True, "READY"
                job.hosts[h] = hp
            created = self.store.create_job(
                JobRow(
                    job_id,
                    spec,
                    job.state,
                    manifest.digest,
                    targets,
                    topo,
                    sorted(holding),
                    False,
                    int(job.created_at),
                )
            )
            if not created:
                raise Rejected(
                    f"job {job_id} already exists (finished); pick a new job id", check="job-exists"
                )
            self.jobs[job_id] = job
            self.changed.notify_all()
            log.info(
                "job %s: %s/%s to %d hosts (%d already hold it), k=%d",
                job_id,
                model,
                version,
                len(targets),
                len(holding),
                k,
            )
            return job

    def cancel_job(self, job_id: str) -> None:
        self.require_leader()
        with self.lock:
            job = self._job(job_id)
            job.state = "CANCELLED"
            self.store.save_figures(job_id, self._figures(job))
            self.store.update_job(job_id, state="CANCELLED")
            del self.jobs[job_id]
            self.changed.notify_all()

    def job_status(self, job_id: str) -> dict[str, Any]:
        self.require_leader()
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                rows = [r for r in self.store.load_jobs() if r.job_id == job_id]
                if not rows:
                    raise NotFound(f"job {job_id} is unknown")
                r = rows[0]
                fig = self.store.figures(job_id) or {}
                return {
                    "job_id": job_id,
                    "state": r.state,
                    "model": r.spec.get("model", ""),
                    "version": r.spec.get("version", ""),
                    "manifest_digest": r.manifest_digest,
                    "hosts_total": len(r.targets),
                    "hosts_ready": len(set(r.ready_hosts) & set(r.targets)),
                    "ready_hosts": sorted(r.ready_hosts),
                    "topology_version": r.topology.version,
                    "completion_emitted": r.completion_emitted,
                    # frozen when the job finished (0 for jobs finished before figures existed)
                    "bytes_moved": int(fig.get("bytes_moved", 0)),
                    "origin_bytes": int(fig.get("origin_bytes", 0)),
                    "checkpoint_bytes": int(fig.get("checkpoint_bytes", 0)),
                    "duration_s": float(fig.get("duration_s", 0.0)),
                    "control_refusals": self.control_refusals,
                    "stragglers": list(fig.get("stragglers", [])),
                    "eta_s": 0 if r.state == "DONE" else -1,
                    "hosts": list(fig.get("hosts", [])),
                }
            n = job.manifest.num_chunks or 1
            fractions = {h: (1.0 if hp.ready else hp.verified / n) for h, hp in job.hosts.items()}
            alive = [
                f for h, f in fractions.items() if job.hosts[h].state not in ("DEAD", "QUARANTINED")
            ]
            median = statistics.median(alive) if alive else 0.0
            stragglers = sorted(
                h
                for h, f in fractions.items()
                if not job.hosts[h].ready
                and (job.hosts[h].state in ("DEAD", "QUARANTINED") or f < 0.5 * median)
            )
            mean = sum(alive) / len(alive) if alive else 0.0
            elapsed = time.monotonic() - job.started
            eta = -1 if mean <= 0 else int(elapsed * (1 - mean) / mean)
            return {
                "job_id": job.job_id,
                "state": job.state,
                "model": job.manifest.model,
                "version": job.manifest.version,
                "manifest_digest": job.manifest.digest,
                "hosts_total": len(job.targets),
                "hosts_ready": len(job.ready & set(job.targets)),
                "ready_hosts": sorted(job.ready),
                "bytes_moved": sum(hp.rx for hp in job.hosts.values()),
                "origin_bytes": sum(hp.origin for hp in job.hosts.values()),
                "checkpoint_bytes": job.manifest.total_size,
                "stragglers": stragglers,
                "eta_s": eta,
                "topology_version": job.topology.version,
                "completion_emitted": job.completion_emitted,
                "duration_s": time.time() - job.created_at,
                "control_refusals": self.control_refusals,
                "hosts": self._host_rows(job),
            }

    def _host_rows(self, job: JobState) -> list[dict[str, Any]]:
        n = job.manifest.num_chunks
        return [
            {
                "host_id": hp.host_id,
                "rack": hp.rack,
                "state": hp.state,
                "chunks_verified": n if hp.ready else hp.verified,
                "rx_bytes": hp.rx,
                "tx_bytes": hp.tx,
                "origin_bytes": hp.origin,
                "rx_bytes_per_s": hp.rx_bps,
                "errors": list(hp.errors),
                "health": self.health.get(hp.host_id, ("", 0))[0],
                "data_refusals": self.health.get(hp.host_id, ("", 0))[1],
            }
            for hp in sorted(job.hosts.values(), key=lambda x: x.host_id)
        ]

    def _figures(self, job: JobState) -> dict[str, Any]:
        """What GetJob keeps reporting after the job left memory (frozen at completion)."""
        return {
            "bytes_moved": sum(hp.rx for hp in job.hosts.values()),
            "origin_bytes": sum(hp.origin for hp in job.hosts.values()),
            "checkpoint_bytes": job.manifest.total_size,
            "hosts_ready": len(job.ready & set(job.targets)),
            "duration_s": round(time.time() - job.created_at, 3),
            "stragglers": sorted(h for h in job.targets if h not in job.ready),
            "hosts": self._host_rows(job),
        }

    # ------------------------------------------------------------------ inventory
    def enroll(self, host_id: str, rack: str, labels: dict[str, str], remove: bool = False) -> bool:
        """Operator: enroll (or remove) a host by its certificate host id and rack."""
        from relgate_agent.pki import PkiError, check_name

        self.require_leader()
        try:
            check_name("host id", host_id)
            if not remove:
                check_name("rack", rack)
        except PkiError as exc:
            raise Rejected(str(exc), check="host-name") from exc
        if remove:
            self.store.unenroll(host_id)
            return False
        self.store.enroll(host_id, rack, dict(labels))
        return True

    def inventory(self) -> list[dict[str, Any]]:
        self.require_leader()
        enrolled = self.store.enrolled()
        seen = self.store.last_seen()
        now = time.time()
        out = []
        for h in sorted(set(enrolled) | set(seen)):
            rack, labels = enrolled.get(h, ("", {}))
            age = now - seen[h] if h in seen else -1.0
            health, refusals = self.health.get(h, ("", 0))
            out.append(
                {
                    "host_id": h,
                    "rack": rack,
                    "labels": labels,
                    "enrolled": h in enrolled,
                    "last_seen_age_s": age,
                    "live": h in enrolled and 0 <= age <= self.config.host_ttl_s,
                    "health": health,
                    "data_refusals": refusals,
                }
            )
        return out

    # ------------------------------------------------------------------ agent API
    def watch_jobs(
        self,
        host_id: str,
        rack: str,
        labels: dict[str, str],
        address: str,
        known: set[str],
        held: list[str],
        wait_s: float,
        health: str = "",
        data_refusals: int = 0,
    ) -> list[dict[str, str]]:
        self.require_leader()
        enrolled = self.store.enrolled().get(host_id)
        if enrolled is None:
            raise NotEnrolled(f"host {host_id} is not enrolled")
        if enrolled[0] != rack:
            raise NotEnrolled(f"host {host_id} is enrolled in rack {enrolled[0]}, not {rack!r}")
        labels = dict(enrolled[1])  # the enrollment's labels, not what the host claims
        self.health[host_id] = (health[:500], int(data_refusals))
        self.store.upsert_host(host_id, rack, labels, address, held)
        deadline = time.monotonic() + min(wait_s, self.config.long_poll_max_s)
        with self.lock:
            self.addresses[host_id] = address
            self._late_join(host_id, rack, labels, held)
            while True:
                self.require_leader()
                jobs = [
                    {
                        "job_id": j.job_id,
                        "model": j.manifest.model,
                        "version": j.manifest.version,
                        "state": j.state,
                    }
                    for j in self.jobs.values()
                    if host_id in j.targets and j.state in ACTIVE_STATES
                ]
                remaining = deadline - time.monotonic()
                if {j["job_id"] for j in jobs} != known or remaining <= 0 or self.closing:
                    return jobs
                self.changed.wait(remaining)

    def _late_join(self, host_id: str, rack: str, labels: dict[str, str], held: list[str]) -> None:
        for job in self.jobs.values():
            if host_id in job.targets or job.state not in ACTIVE_STATES:
                continue
            if not selector_matches(
                parse_selector(str(job.spec.get("target_selector", ""))), rack, labels
            ):
                continue
            job.targets[host_id] = rack
            hp = HostProgress(host_id, rack, self.addresses.get(host_id, ""))
            job.hosts[host_id] = hp
            if f"{job.manifest.model}/{job.manifest.version}" in held and host_id in (
                self.store.hosts_holding(job.manifest.model, job.manifest.version)
            ):
                hp.ready, hp.state = True, "READY"
                job.ready.add(host_id)
                self.store.update_job(job.job_id, ready_hosts=sorted(job.ready))
                # persist the new target set (stored with the topology) under a new version
                self._set_topology(job, job.topology.copy(job.topology.version + 1))
            else:
                self._set_topology(job, append_host(job.topology, host_id, rack))
            log.info("job %s: late host %s joined", job.job_id, host_id)
            self.changed.notify_all()

    def register(
        self, job_id: str, host_id: str, rack: str, have: bytes, free_disk: int, address: str
    ) -> dict[str, Any]:
        self.require_leader()
        with self.lock:
            job = self._job(job_id)
            if host_id not in job.targets:
                raise NotFound(f"host {host_id} is not a target of job {job_id}")
            hp = job.hosts[host_id]
            moved = bool(address) and address != hp.address
            hp.rack, hp.address, hp.have = rack or hp.rack, address or hp.address, bytes(have)
            hp.verified = sum(bits_from_bitmap(hp.have, job.manifest.num_chunks))
            hp.last_seen = time.monotonic()
            self.addresses[host_id] = hp.address
            if hp.state in ("DEAD", "PENDING") and not hp.ready:
                hp.state = "TRANSFERRING"
            if not hp.ready and hp.state != "QUARANTINED" and host_id not in job.topology.racks:
                # a rejoining host goes to the tail of its rack chain: it never blocks anyone ahead
                self._set_topology(job, append_host(job.topology, host_id, hp.rack))
            elif moved and host_id in job.topology.racks:
                # a restarted agent listens on a new address: bump the version so its
                # downstreams refetch their assignment and reconnect
                self._set_topology(job, job.topology.copy(job.topology.version + 1))
            return {
                "manifest_envelope": job.envelope,
                "manifest_digest": job.manifest.digest,
                "origin_uri": job.spec["origin_uri"],
                "topology_version": job.topology.version,
                "stripes": job.stripes,
            }

    def assignment(
        self, job_id: str, host_id: str, known_version: int, wait_s: float
    ) -> dict[str, Any]:
        self.require_leader()
        deadline = time.monotonic() + min(wait_s, self.config.long_poll_max_s)
        with self.lock:
            while True:
                self.require_leader()
                job = self.jobs.get(job_id)
                if job is None:
                    # finished or cancelled: tell the agent which, so it keeps or discards staging
                    state = self.store.job_state(job_id) or "GONE"
                    return {
                        "job_id": job_id,
                        "topology_version": 0,
                        "stripes": [],
                        "job_state": state,
                        "cancelled": True,
                        "members": [],
                    }
                if host_id not in job.targets:
                    raise NotFound(f"host {host_id} is not a target of job {job_id}")
                remaining = deadline - time.monotonic()
                if job.topology.version > known_version or remaining <= 0 or self.closing:
                    return self._assignment(job, host_id)
                self.changed.wait(remaining)

    def _assignment(self, job: JobState, host_id: str) -> dict[str, Any]:
        topo = job.topology
        cap = int(job.spec.get("origin_cap_bytes_per_s") or 0)
        stripes = []
        if host_id in topo.racks:
            for s, chain in enumerate(topo.stripes):
                up = chain.parent.get(host_id)
                stripes.append(
                    {
                        "stripe": s,
                        "upstream": self._peer(job, up)
                        if up
                        else {"host_id": ORIGIN, "address": "", "rack": ""},
                        "downstreams": [self._peer(job, d) for d in chain.children(host_id)],
                        "resume_block": self._resume_pos(job, host_id, s),
                        # each stripe root gets an equal share of the job's origin cap
                        "origin_rate_bytes_per_s": (cap // len(topo.stripes))
                        if (up is None and cap)
                        else 0,
                    }
                )
        return {
            "job_id": job.job_id,
            "topology_version": topo.version,
            "stripes": stripes,
            "job_state": job.state,
            # FAILED stops the agents too (they keep staging and journal for a retry)
            "cancelled": job.state in ("CANCELLED", "FAILED"),
            "members": sorted(topo.racks),
        }

    def _peer(self, job: JobState, host: str) -> dict[str, str]:
        hp = job.hosts.get(host)
        return {
            "host_id": host,
            "address": (hp.address if hp else "") or self.addresses.get(host, ""),
            "rack": hp.rack if hp else "",
        }

    def _resume_pos(self, job: JobState, host: str, stripe: int) -> int:
        hp = job.hosts.get(host)
        bits = bits_from_bitmap(hp.have if hp else b"", job.manifest.num_chunks)
        pos = 0
        for c in range(stripe, job.manifest.num_chunks, job.stripes):
            if not bits[c]:
                return pos
            pos += len(job.manifest.chunks[c].block_crc32c)
        return pos

    def report_progress(self, job_id: str, host_id: str, report: dict[str, Any]) -> dict[str, Any]:
        self.require_leader()
        with self.lock:
            job = self.jobs.get(job_id)
            if job is None:
                # CANCEL: discard staging; STOP: the job finished, keep what is placed
                cancelled = self.store.job_state(job_id) == "CANCELLED"
                return {"topology_version": 0, "actions": ["CANCEL" if cancelled else "STOP"]}
            hp = job.hosts.get(host_id)
            if hp is None:
                return {"topology_version": job.topology.version, "actions": ["REREGISTER"]}
            hp.last_seen = time.monotonic()
            hp.have = bytes(report.get("have", b""))
            hp.verified = sum(bits_from_bitmap(hp.have, job.manifest.num_chunks))
            for key in ("rx", "tx", "origin", "rx_bps", "tx_bps"):
                setattr(hp, key, int(report.get(key, 0)))
            if report.get("data_address"):
                hp.address = str(report["data_address"])
                self.addresses[host_id] = hp.address
            for e in report.get("errors", []):
                hp.errors.append(e)
                # no hangs: a chunk that failed N times from the origin / every peer ends the
                # job (the agent names chunk, file and origin object); a host that gave up is
                # FAILED (a straggler, the others go on)
                if e.startswith(KIND_CHUNK_FAILED) and job.state not in TERMINAL_STATES:
                    self._fail_job(job, f"{host_id}: {e}")
                elif e.startswith(KIND_HOST_FAILED) and not hp.ready and hp.state != "FAILED":
                    if host_id in job.topology.racks:  # its downstreams must not wait for it
                        self._mark_dead(job, host_id, "the host gave up (HOST_FAILED)")
                    hp.state = "FAILED"
            self.health[host_id] = (
                str(report.get("health", ""))[:500],
                int(report.get("data_refusals", 0)),
            )
            if job.state == "FAILED":
                return {"topology_version": job.topology.version, "actions": ["STOP"]}
            actions: list[str] = []
            if report.get("ready") and not hp.ready:
                why = ready_refusal(
                    hp.verified,
                    job.manifest.num_chunks,
                    str(report.get("placed_manifest_digest", "")),
                    job.manifest.digest,
                )
                if why is not None:
                    job.ready_refusals += 1
                    hp.errors.append(why)
                    log.warning("job %s: %s from %s", job_id, why, host_id)
                    raise ReadyRefused(f"{why} (job {job_id}, host {host_id})")

                hp.ready, hp.state = True, "READY"
                job.ready.add(host_id)
                self.store.update_job(job_id, ready_hosts=sorted(job.ready))
                self.store.mark_host_version(host_id, job.manifest.model, job.manifest.version)
                log.info(
                    "job %s: %s READY (%d/%d)", job_id, host_id, len(job.ready), len(job.targets)
                )
                self.changed.notify_all()
            elif not hp.ready:
                if hp.state == "DEAD":
                    actions.append("REREGISTER")  # it was spliced out; rejoin at a rack tail
                elif hp.state == "PENDING":
                    hp.state = "TRANSFERRING"
            if int(report.get("topology_version", 0)) < job.topology.version:
                actions.append("REFETCH_ASSIGNMENT")
            return {"topology_version": job.topology.version, "actions": actions}

    def report_suspect(
        self, job_id: str, reporter: str, suspect: str, reason: str, stripe: int
    ) -> dict[str, Any]:
        self.require_leader()
        with self.lock:
            job = self._job(job_id)
            if reporter not in job.targets:
                raise NotFound(f"host {reporter} is not a target of job {job_id}")
            hp = job.hosts.get(suspect)
            if hp is not None and suspect in job.topology.racks:
                upstream_of_reporter = any(
                    c.parent.get(reporter) == suspect for c in job.topology.stripes
                )
                if reason == "BAD_DATA" and not upstream_of_reporter:
                    # only a host's own upstream can have sent it bad data
                    hp.errors.append(f"BAD_DATA from non-downstream {reporter} ignored")
                elif reason == "BAD_DATA":
                    hp.bad_data_reporters.add(reporter)
                    hp.errors.append(f"BAD_DATA reported by {reporter}")
                    if len(hp.bad_data_reporters) >= 2:
                        # two independent receivers saw bad data: likely bad disk or memory
                        log.warning("job %s: quarantining %s", job_id, suspect)
                        hp.state = "QUARANTINED"
                        self._set_topology(job, splice(job.topology, suspect))
                elif (
                    self.config.splice_on_suspect
                    and time.monotonic() - hp.last_seen > 2 * self.config.report_interval_s
                ):
                    # the suspect also stopped reporting to us: treat as dead, splice now
                    self._mark_dead(job, suspect, f"{reason} from {reporter}")
            chain = job.topology.stripes[stripe] if 0 <= stripe < job.stripes else None
            up = chain.parent.get(reporter) if chain else None
            return {
                "topology_version": job.topology.version,
                "new_upstream": self._peer(job, up)
                if up
                else {"host_id": ORIGIN, "address": "", "rack": ""},
            }

    def _mark_dead(self, job: JobState, host: str, why: str) -> None:
        hp = job.hosts[host]
        if hp.state == "DEAD":
            return
        hp.state = "DEAD"
        hp.errors.append(f"spliced out: {why}")
        log.warning("job %s: splicing %s out (%s)", job.job_id, host, why)
        self._set_topology(job, splice(job.topology, host))

    def find_peers(
        self, job_id: str, host_id: str, chunk: int, exclude: set[str], limit: int
    ) -> list[dict[str, str]]:
        self.require_leader()
        with self.lock:
            job = self._job(job_id)
            if host_id not in job.targets:
                raise NotFound(f"host {host_id} is not a target of job {job_id}")
            me = job.hosts.get(host_id)
            out = []
            for h, hp in job.hosts.items():
                if (
                    h == host_id
                    or h in exclude
                    or hp.state in ("DEAD", "QUARANTINED")
                    or not hp.address
                ):
                    continue
                held = hp.ready or (
                    chunk // 8 < len(hp.have) and hp.have[chunk // 8] >> (chunk % 8) & 1
                )
                if held:
                    out.append(hp)
            # same rack first, then the most complete (least likely to be busy repairing)
            out.sort(key=lambda hp: (hp.rack != (me.rack if me else ""), -hp.verified, hp.host_id))
            return [self._peer(job, hp.host_id) for hp in out[: max(limit, 1)]]

    # ------------------------------------------------------------------ background
    def tick(self) -> None:
        """Dead-host detection, ready-threshold / deadline handoff, DONE transition."""
        emit: list[tuple[str, dict[str, Any]]] = []
        with self.lock:
            if not self.leader:
                return
            now = time.monotonic()
            for job in list(self.jobs.values()):
                if job.state in TERMINAL_STATES:
                    continue  # a FAILED job stays in memory so GetJob shows its errors
                pending = [h for h in job.targets if h not in job.ready and h in job.hosts]
                if pending and all(job.hosts[h].state == "FAILED" for h in pending):
                    last = {
                        h: next(
                            (
                                e
                                for e in reversed(job.hosts[h].errors)
                                if e.startswith(KIND_HOST_FAILED)
                            ),
                            "",
                        )
                        for h in pending
                    }
                    self._fail_job(job, "; ".join(f"{h}: {e}" for h, e in sorted(last.items())))
                    continue
                for h in list(job.topology.racks):
                    hp = job.hosts.get(h)
                    if hp and now - hp.last_seen > self.config.dead_after_s:
                        self._mark_dead(job, h, f"no report for {now - hp.last_seen:.1f}s")
                self._demote_slow(job, now)
                ready = len(job.ready & set(job.targets))
                total = len(job.targets)
                threshold = int(job.spec["ready_threshold_ppm"])
                deadline = int(job.spec.get("deadline_s") or 0)
                reached = total > 0 and ready * 1_000_000 >= threshold * total
                late = deadline > 0 and time.time() - job.created_at >= deadline
                if (reached or late) and not job.completion_emitted and job.completion is None:
                    job.completion = {
                        "type": "DistributionComplete",
                        "job": job.job_id,
                        "model": job.manifest.model,
                        "version": job.manifest.version,
                        "manifestDigest": job.manifest.digest,
                        "readyHosts": sorted(job.ready),
                        "hostsTotal": total,
                        "reason": "threshold" if reached else "deadline",
                    }
                    if job.state == "DISTRIBUTING":
                        job.state = "COMPLETE"
                        self.store.update_job(job.job_id, state="COMPLETE")
                    emit.append((str(job.spec.get("webhook_url") or ""), job.completion))
                if total > 0 and ready == total and job.completion_emitted:
                    job.state = "DONE"
                    self.store.save_figures(job.job_id, self._figures(job))
                    self.store.update_job(job.job_id, state="DONE")
                    del self.jobs[job.job_id]
                    self.changed.notify_all()
        for url, payload in emit:
            threading.Thread(target=self._emit, args=(url, payload), daemon=True).start()

    def _fail_job(self, job: JobState, error: str) -> None:
        """Mark a job FAILED with the error that ended it (caller holds the lock)."""
        log.error("job %s FAILED: %s", job.job_id, error)
        job.state = "FAILED"
        job.error = error
        self.store.update_job(job.job_id, state="FAILED")
        self.changed.notify_all()

    def _demote_slow(self, job: JobState, now: float) -> None:
        """Slowness counts as failure: a persistently slow host becomes a leaf at its rack tail."""
        moving = [
            hp
            for h, hp in job.hosts.items()
            if h in job.topology.racks and not hp.ready and hp.state == "TRANSFERRING"
        ]
        rates = sorted(hp.rx_bps for hp in moving if hp.rx_bps > 0)
        if len(rates) < 3:
            return
        median = rates[len(rates) // 2]
        if median < self.config.slow_min_median_bps:
            return
        for hp in moving:
            if hp.rx_bps >= self.config.slow_fraction * median or hp.demoted:
                hp.slow_since = None
                continue
            if hp.slow_since is None:
                hp.slow_since = now
                continue
            if now - hp.slow_since < self.config.slow_after_s:
                continue
            if not any(chain.children(hp.host_id) for chain in job.topology.stripes):
                hp.demoted = True  # already a leaf everywhere: nobody waits behind it
                continue
            log.warning(
                "job %s: demoting slow host %s (%d B/s vs median %d B/s)",
                job.job_id,
                hp.host_id,
                hp.rx_bps,
                median,
            )
            hp.errors.append(
                f"DEMOTED rx {hp.rx_bps} B/s < {self.config.slow_fraction} x median {median} B/s"
            )
            hp.demoted = True
            self._set_topology(
                job, append_host(splice(job.topology, hp.host_id), hp.host_id, hp.rack)
            )

    def _emit(self, url: str, payload: dict[str, Any]) -> None:
        body = json.dumps(payload, sort_keys=True).encode()
        if url:
            for attempt in range(5):
                try:
                    self._post(url, body)
                    break
                except OSError as exc:
                    log.warning(
                        "DistributionComplete to %s failed (attempt %d): %s", url, attempt + 1, exc
                    )
                    time.sleep(0.5 * 2**attempt)
        with self.lock:
            job = self.jobs.get(str(payload["job"]))
            if job is not None:
                job.completion_emitted = True
            self.store.update_job(str(payload["job"]), completion_emitted=True)
        log.info("DistributionComplete %s", body.decode())


def _http_post(url: str, body: bytes) -> None:
    req = urllib.request.Request(
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:
        resp.read()


def default_db_path(home: str | None = None) -> str:
    base = home or os.environ.get("RELGATE_AGENT_HOME", "var/relgate-agent")
    os.makedirs(base, exist_ok=True)
    return os.path.join(base, "coordinator.sqlite")


__all__ = [
    "Coordinator",
    "CoordinatorConfig",
    "NotEnrolled",
    "NotFound",
    "ReadyRefused",
    "Rejected",
    "StaleTopology",
]
