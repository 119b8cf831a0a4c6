"""Job state: the coordinator's records of a distribution job and of each target host.

Durable state (job, targets, latest topology) is in the JobStore; :class:`JobState` is its
in-memory form plus the per-host progress cache (:class:`HostProgress`) rebuilt from
Register/ReportProgress. Also here: the coordinator's configuration, its refusals (each
maps to one gRPC status), and target selectors.
"""

from __future__ import annotations

import os
import time
from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass, field, fields
from typing import ClassVar

from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import CheckpointManifest, TrustedKeys

from relgate_agent.contracts import RemovedHost, camel
from relgate_agent.coordinator.outbox import EVENT_COMPLETE, EVENT_HOSTS_READY
from relgate_agent.coordinator.topology import Topology
from relgate_agent.errors import AgentError

ACTIVE_STATES = ("PLANNING", "DISTRIBUTING", "COMPLETE")
TERMINAL_STATES = ("DONE", "CANCELLED", "FAILED")
QUARANTINED = "QUARANTINED"
REMOVED = "REMOVED"  # evicted, dead past the bound, the suspect of its own complaints,
# or an invalid certificate (coordinator/removal.py: remove_host, the one way)
# spliced out: neither a source nor a straggler target
GONE_STATES = ("DEAD", QUARANTINED, REMOVED)


class NotFound(AgentError):
    """Unknown job or host (the caller should re-register or stop)."""


class NotLeader(AgentError):
    """This replica does not hold the lease (maps to UNAVAILABLE: clients try the next one).

    ``leader`` is the address of the replica that leads the job asked about, when one is
    known (sharded coordinators): the server sends it as trailing metadata
    (:data:`relgate_agent.errors.LEADER_METADATA_KEY`) and clients call it next."""

    check = "job-leader"

    def __init__(self, message: str, *, leader: str = "") -> None:
        super().__init__(message)
        self.leader = leader


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


@dataclass(frozen=True)
class CoordinatorConfig:
    db: str = "coordinator.sqlite"
    trusted_keys: TrustedKeys | None = None
    default_stripes: int = 8
    dead_after_s: float = 6.0
    # a DEAD host is removed from its job after this long (it no longer holds the job short
    # of DONE); an operator removes one at once with `job evict`
    remove_dead_after_s: float = 300.0
    report_interval_s: float = 1.0
    # an agent's watch stream lives this long (+-20%); opening one is its heartbeat (fresh
    # health and held versions), holding it open keeps the host live (refresh_watching)
    watch_max_s: float = 60.0
    webhook_url: str = ""
    # a host whose rx rate stays under slow_fraction x the median for slow_after_s is moved
    # to the tail of its rack chain (a leaf), so it no longer throttles anyone behind it
    slow_fraction: float = 0.5
    slow_after_s: float = 10.0
    slow_min_median_bps: int = 1_000_000
    # more than this fraction of a job's chain hosts silent in one sweep is a mass silence
    # (the coordinator's own backlog, a partition): no splice until it clears (handoff.py)
    mass_silence_fraction: float = 0.02
    # splice a suspect at once when a downstream reports it and it also went silent
    # (off: only the dead-after sweep splices; used to exercise swarm fallback)
    splice_on_suspect: bool = True
    # high availability: replicas share the store and elect a leader through a lease row
    ha: bool = False
    lease_ttl_s: float = 10.0
    replica_id: str = ""
    # sharded by job (implies ha): each job has its own lease; replicas spread the jobs
    # (coordinator/shard.py) and answer a job led elsewhere with NotLeader naming its leader
    shard_by_job: bool = False
    # an enrolled host counts as a target only if it sent a heartbeat within this many seconds
    host_ttl_s: float = 60.0
    # deployer events are retried until a 2xx: first after this, doubling, at most the max
    webhook_backoff_s: float = 0.5
    webhook_backoff_max_s: float = 60.0


# a host's stored slowness as last written: (demoted, witnesses, clock start or None)
SlowKey = tuple[bool, frozenset[str], float | None]


@dataclass
class HostProgress:
    host_id: str
    rack: str
    address: str = ""
    dc: str = ""  # its enrollment's data center label (DC_LABEL), "" with one DC
    have: bytes = b""
    verified: int = 0
    ready: bool = False
    state: str = "PENDING"  # PENDING | TRANSFERRING | READY | DEAD | QUARANTINED | FAILED
    last_seen: float = field(default_factory=time.monotonic)
    rx: int = 0
    tx: int = 0
    origin: int = 0
    rx_bps: int = 0
    tx_bps: int = 0
    errors: deque[str] = field(default_factory=lambda: deque(maxlen=32))
    bad_data_reporters: set[str] = field(default_factory=set)
    stripe_rx_bps: tuple[int, ...] = ()  # per stripe, as last reported (bounded to k)
    bypassed: tuple[int, ...] = ()  # stripes it pulls from its bypass peer, as last reported
    slow_with: frozenset[str] = frozenset()  # upstreams it was a slow first hop with, lately
    slow_since: float | None = None
    fast_since: float | None = None  # when it stopped being slow (the grace's start)
    # what the store holds of its slowness (slowclock.save writes only on change)
    slow_saved: SlowKey | None = None
    # slowness a previous leader watched (slowclock.restore): its clock starts this much
    # in the past when this leader first judges it slow
    slow_credit: float = 0.0
    reported: bool = False  # registered or reported to this leader (failover.py)
    rates_since: float | None = None  # its first progress report (rates) to this leader
    demoted: bool = False
    # the child whose lag alone accuses it of slow transmit (a tie; its own rates with one
    # child behind it), as of its last tx verdict: a demoted host stays a witness of that
    # child only (HandoffService._history)
    accused_by: frozenset[str] = frozenset()
    holds_envelope: bool = False  # reported holding the job's verified manifest (a source)
    # downstream -> (first, last) time it reported this live host as not serving it
    unserved: dict[str, tuple[float, float]] = field(default_factory=dict)
    unserved_reason: dict[str, str] = field(default_factory=dict)  # downstream -> its last reason
    # the job's end (coordinator/removal.py, tally.py): why it was removed ("" a target) and when,
    # since when it is DEAD (the clock), why it is a straggler ("" not one: kept until READY
    # or removed), and the byte counters as last written to the ledger
    removed: str = ""
    removed_at: int = 0  # when it was removed or quarantined (wall time, Unix seconds)
    dead_since: float | None = None
    straggler: str = ""
    bytes_saved: tuple[int, int, int] = (0, 0, 0)
    # its Registers to this leader: a Register is news for its watch even when it moved
    # nobody (the agent acts on nothing older than the version it answered: push_key)
    registrations: int = 0

    def holds(self, chunk: int) -> bool:
        """READY, or ``chunk`` is set in the last reported have-bitmap."""
        return self.ready or (
            chunk // 8 < len(self.have) and bool(self.have[chunk // 8] >> (chunk % 8) & 1)
        )


@dataclass(frozen=True)
class DeployerEvent:
    """A webhook body: its type, then the fields in camelCase (tuples as lists)."""

    kind: ClassVar[str] = ""
    job: str
    model: str
    version: str
    manifest_digest: str
    ready_hosts: tuple[str, ...]
    hosts_total: int
    # the targets the job no longer waits for, with why and when (signed with the event):
    # the deployer knows which hosts will never serve the version from this job
    removed_hosts: tuple[RemovedHost, ...]

    def to_json(self) -> dict[str, object]:
        out: dict[str, object] = {"type": self.kind}
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, tuple):
                value = [v.to_json() if isinstance(v, RemovedHost) else v for v in value]
            out[camel(f.name)] = value
        return out


@dataclass(frozen=True)
class Completion(DeployerEvent):
    """The DistributionComplete event: the threshold was reached or the deadline passed."""

    kind: ClassVar[str] = EVENT_COMPLETE
    reason: str  # "threshold" | "deadline"
    quarantined_hosts: tuple[str, ...]  # targets excluded (bad data), never waited for


@dataclass(frozen=True)
class HostsReady(DeployerEvent):
    """Hosts that became READY after the DistributionComplete (``ready_hosts``: these)."""

    kind: ClassVar[str] = EVENT_HOSTS_READY
    hosts_ready: int  # READY so far, all announced


@dataclass
class JobState:
    job_id: str
    spec: JobSpec
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
    completion: Completion | None = None
    # the DistributionComplete is in the outbox; hosts named by an event in the outbox
    completion_enqueued: bool = False
    announced: set[str] = field(default_factory=set)
    ready_refusals: int = 0
    # hosts removed from this job so far (watch_updates: a removal is news for a watch
    # even when the host held no place in the topology to splice)
    removals: int = 0
    registrations: int = 0  # Registers this leader answered (a watch signature: news)
    # bumped when the topology's member set changes other than by losing DEAD hosts (a
    # host that may now fetch chunks from any member, or a quarantined or evicted one no
    # member may serve): every host's assignment carries the member list (push_key)
    members_gen: int = 0
    # (per-stripe, total) receive rates slowness is judged against: the peak medians held
    # with a decay (slowness.held_reference)
    rate_reference: tuple[int, int] | None = None
    rate_reference_at: float | None = None  # the clock when it was last updated
    # hosts silent in the ongoing mass silence (0: none; handoff._unless_mass_silence)
    mass_silence: int = 0
    # (clock, hosts) of the recent sweeps that spliced silent hosts as dead
    recent_dead: list[tuple[float, int]] = field(default_factory=list)
    # hosts that reported rates since slowness was last judged (handoff._rates_due)
    fresh_rates: set[str] = field(default_factory=set)
    reference_saved_at: float | None = None  # the clock when it was last written
    # rack -> hosts sent the envelope or that reported holding it (Register's sources)
    envelope_sources: dict[str, list[str]] = field(default_factory=dict)
    # per stripe, the root's share of the origin cap this sweep (coordinator/budget.py),
    # and per root host its (stripe, share) pairs for the reply to its next report
    origin_shares: tuple[int, ...] = ()
    origin_by_root: dict[str, tuple[tuple[int, int], ...]] = field(default_factory=dict)
    # the clock when this leader loaded the job from the store (None: it created it):
    # nobody is judged dead or slow on the takeover's silence (failover.py)
    resumed_at: float | None = None
    # (which rebalance, the clock) when it joined its origin's budget (coordinator/budget.py)
    origin_joined: tuple[int, float] | None = None
    error: str = ""  # why the job FAILED (an agent's CHUNK_FAILED / every host HOST_FAILED)
    tally_saved_at: float | None = None  # the clock when the byte counters were last written

    @property
    def stripes(self) -> int:
        return len(self.topology.stripes)

    @property
    def ready_count(self) -> int:
        return len(self.ready & set(self.targets))

    @property
    def quarantined(self) -> set[str]:
        return {h for h, hp in self.hosts.items() if hp.state == QUARANTINED and h in self.targets}

    @property
    def removed(self) -> dict[str, str]:
        """Targets removed from the job (evicted, dead past the bound) -> why."""
        return {h: hp.removed for h, hp in self.hosts.items() if hp.removed and h in self.targets}

    def restore_removed(self, removed: Mapping[str, RemovedHost]) -> None:
        """A job loaded by a new leader: its removed targets (the ledger's) stay removed."""
        for h, gone in removed.items():
            hp = self.hosts.get(h)
            if hp is not None:
                hp.removed, hp.removed_at, hp.state = gone.reason, gone.removed_at, REMOVED

    @property
    def eligible(self) -> set[str]:
        """The targets the job waits for: all but the quarantined and the removed."""
        return set(self.targets) - self.quarantined - set(self.removed)

    def slow_hosts(self, fraction: float) -> frozenset[str]:
        """Hosts a splice must not promote into a dead host's place (a slow host there
        throttles everyone it comes to feed): leaves by decision (demoted, or a declared
        serving rate), hosts judged slow in the last sweep, and hosts not READY receiving
        under ``fraction`` x the reference total rate (evidence short of a demotion's)."""
        total = self.rate_reference[1] if self.rate_reference else 0
        return frozenset(
            h
            for h, hp in self.hosts.items()
            if hp.demoted
            or hp.slow_since is not None
            or (not hp.ready and total > 0 and 0 < hp.rx_bps < fraction * total)
        )


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


def default_db_path(home: str | None = None) -> str:
    base = home or os.environ.get("RELGATE_AGENT_HOME", "var/relgate-agent")
    os.makedirs(base, exist_ok=True)
    return os.path.join(base, "coordinator.sqlite")


__all__ = [
    "ACTIVE_STATES",
    "GONE_STATES",
    "QUARANTINED",
    "REMOVED",
    "TERMINAL_STATES",
    "Completion",
    "CoordinatorConfig",
    "HostProgress",
    "HostsReady",
    "JobState",
    "NotEnrolled",
    "NotFound",
    "NotLeader",
    "ReadyRefused",
    "Rejected",
    "SlowKey",
    "default_db_path",
    "parse_selector",
    "selector_matches",
]
