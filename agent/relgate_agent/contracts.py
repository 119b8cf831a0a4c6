"""Contracts: the typed documents that cross the coordinator's boundary.

The operator's job spec (stored as JSON in the coordinator's job row, snake_case keys as
ever), and what the coordinator answers agents: registration, stripe assignments, progress
replies and suspect replies, plus the progress report an agent sends. The gRPC server maps
these to and from the protobuf messages; the coordinator logic only sees these models.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from typing import Any

ORIGIN = "ORIGIN"  # the upstream of a stripe root: the checkpoint's origin store
DEFAULT_READY_PPM = 995_000
STRIPE_DONE = -1  # a per-stripe receive rate for a stripe held whole (nothing to receive)


# CreateJob's priorities, lowest first: on a host shared by several jobs, the stripe workers
# of a job pause while a job of higher priority still transfers there
PRIORITIES = ("low", "normal", "high")


def priority_rank(priority: str) -> int:
    """The rank of a priority name (an unknown one ranks as normal)."""
    return PRIORITIES.index(priority) if priority in PRIORITIES else PRIORITIES.index("normal")


@dataclass(frozen=True)
class PeerRef:
    host_id: str
    address: str = ""
    rack: str = ""


ORIGIN_PEER = PeerRef(ORIGIN)


@dataclass(frozen=True)
class PeerSet:
    """The holders of one chunk FindPeers names (at most the limit asked, best first) and
    how many live hosts hold it in all: the end-game's rarity, which a capped list hides."""

    peers: tuple[PeerRef, ...]
    holders: int


@dataclass(frozen=True)
class StripePlan:
    """One stripe of a host's assignment: where to pull from, who pulls from us."""

    stripe: int
    upstream: PeerRef
    downstreams: tuple[PeerRef, ...]
    resume_block: int
    origin_rate_bytes_per_s: int = 0
    compress: bool = False  # the upstream is in another data center: zstd frames on the WAN
    # the upstream's upstream (a peer of this host's DC, never the origin): pulled from
    # without a leader when the upstream is dead or the slow hop (agent/bypass.py)
    bypass: PeerRef | None = None
    standby: tuple[PeerRef, ...] = ()  # who may bypass a downstream of ours to pull from us


@dataclass(frozen=True)
class AssignmentPlan:
    job_id: str
    topology_version: int
    stripes: tuple[StripePlan, ...]
    job_state: str
    cancelled: bool
    members: tuple[str, ...] = ()
    leader_epoch: int = 0  # the sending leader's lease epoch: agents refuse an older one


@dataclass(frozen=True)
class Registration:
    manifest_envelope: bytes  # b"" when manifest_sources name hosts that hold it
    manifest_digest: str
    origin_uri: str
    topology_version: int
    stripes: int
    manifest_sources: tuple[PeerRef, ...] = ()


@dataclass(frozen=True)
class ProgressReport:
    """An agent's ReportProgress, as the coordinator logic reads it."""

    topology_version: int = 0
    have: bytes = b""
    rx: int = 0
    tx: int = 0
    origin: int = 0
    rx_bps: int = 0
    tx_bps: int = 0
    ready: bool = False
    data_address: str = ""
    placed_manifest_digest: str = ""
    health: str = ""
    data_refusals: int = 0
    errors: tuple[str, ...] = ()
    verified_delta: bytes = b""  # with have empty: storage.pack_indexes of newly verified chunks
    verified_count: int = 0
    stripe_rx_bps: tuple[int, ...] = ()  # per stripe; STRIPE_DONE for a stripe held whole
    manifest_digest: str = ""  # the verified manifest the host holds (serves to peers)
    placement_attestation: str = ""  # with ready: the host's signed attestation (JSON)
    bypassed_stripes: tuple[int, ...] = ()  # pulled from the bypass peer, not the upstream


#: ReportProgress action: this host is quarantined in the job (two downstreams received bad
#: data from it); it stops, scrubs its staging and re-verifies every version it holds.
ACTION_QUARANTINE = "QUARANTINE"
#: ReportSuspect reasons an agent sends (a label of the coordinator's suspect count)
SUSPECT_REASONS = frozenset({"BAD_DATA", "STALLED", "CONN_RESET"})


@dataclass(frozen=True)
class ProgressReply:
    topology_version: int
    actions: tuple[str, ...] = ()
    # (stripe, bytes/s): the host's share of the origin budget per stripe it roots
    origin_shares: tuple[tuple[int, int], ...] = ()


@dataclass(frozen=True)
class SuspectReply:
    topology_version: int
    new_upstream: PeerRef


@dataclass(frozen=True)
class JobRef:
    job_id: str
    model: str
    version: str
    state: str
    priority: str = "normal"


@dataclass
class WatchCursor:
    """What one agent's watch stream has been told: its job set and, per job, the topology
    version of the last assignment pushed (the agent's own applied versions to begin with).
    Mutated only under the coordinator's lock."""

    host_id: str
    jobs: frozenset[str] | None = None  # None: the job list was never sent on this stream
    versions: dict[str, int] = field(default_factory=dict)
    # the coordinator's job signature when this cursor was last brought up to date: equal
    # now, nothing can be news for it (ProgressService.watch_updates skips it); None: never
    seen: tuple[object, ...] | None = None
    # per job, the push key (ProgressService.push_key) of the last assignment pushed on this
    # stream: a later topology version with the same key changes nothing this host acts on
    # and is not pushed (a splice moves a few dozen hosts, not the 4,096 of the job)
    keys: dict[str, tuple[object, ...]] = field(default_factory=dict)
    # per job, the topology version its key was last computed or known unmoved at
    # (coordinator/keydiff.py): a later change that names no host near it skips the key
    checked: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class WatchUpdate:
    """One push on a watch stream: the host's whole active job list and the assignments
    newer than its cursor (an ended job's is ``cancelled`` with its final state)."""

    jobs: tuple[JobRef, ...]
    assignments: tuple[AssignmentPlan, ...] = ()

    def merged(self, newer: WatchUpdate) -> WatchUpdate:
        """This unsent update overtaken by ``newer``: the newer job list, and per job the
        newest assignment of either."""
        by_job = {a.job_id: a for a in self.assignments}
        for a in newer.assignments:
            old = by_job.get(a.job_id)
            if old is None or a.cancelled or a.topology_version >= old.topology_version:
                by_job[a.job_id] = a
        return WatchUpdate(newer.jobs, tuple(by_job.values()))


__all__ = [
    "ORIGIN",
    "ORIGIN_PEER",
    "PRIORITIES",
    "STRIPE_DONE",
    "AssignmentPlan",
    "HostRow",
    "InventoryHost",
    "JobRef",
    "JobReport",
    "JobSummary",
    "JobTopology",
    "PeerRef",
    "ProgressReply",
    "ProgressReport",
    "Registration",
    "StripeHop",
    "StripePlan",
    "StripeView",
    "SuspectReply",
    "WatchCursor",
    "WatchUpdate",
    "priority_rank",
]


@dataclass(frozen=True)
class HostRow:
    """One target host in a job report (GetJob ``hosts``; also the stored figures' rows)."""

    host_id: str
    rack: str
    state: str
    chunks_verified: int
    rx_bytes: int
    tx_bytes: int
    origin_bytes: int
    rx_bytes_per_s: int
    errors: tuple[str, ...]
    health: str
    data_refusals: int
    # stripes it pulls from its bypass peer, not its upstream, as last reported (bypass.py)
    bypassed_stripes: tuple[int, ...] = ()

    @classmethod
    def from_stored(cls, doc: Mapping[str, Any]) -> HostRow:
        return cls(
            host_id=str(doc.get("host_id", "")),
            rack=str(doc.get("rack", "")),
            state=str(doc.get("state", "")),
            chunks_verified=int(doc.get("chunks_verified", 0)),
            rx_bytes=int(doc.get("rx_bytes", 0)),
            tx_bytes=int(doc.get("tx_bytes", 0)),
            origin_bytes=int(doc.get("origin_bytes", 0)),
            rx_bytes_per_s=int(doc.get("rx_bytes_per_s", 0)),
            errors=tuple(str(e) for e in doc.get("errors", ())),
            health=str(doc.get("health", "")),
            data_refusals=int(doc.get("data_refusals", 0)),
            bypassed_stripes=tuple(int(s) for s in doc.get("bypassed_stripes", ())),
        )

    def to_stored(self) -> dict[str, object]:
        """snake_case (the stored figures' rows and the Pipes entry's dict)."""
        d = asdict(self)
        d["errors"] = list(self.errors)
        d["bypassed_stripes"] = list(self.bypassed_stripes)
        return d

    def to_json(self) -> dict[str, object]:
        return {camel(k): v for k, v in self.to_stored().items()}


def camel(name: str) -> str:
    """snake_case -> camelCase, the CLI's ``--json`` key style."""
    head, *rest = name.split("_")
    return head + "".join(p[:1].upper() + p[1:] for p in rest)


@dataclass(frozen=True)
class HostReason:
    """A host and why it is listed: a straggler (slow rx/tx with figures, dead since) or a
    target removed from the job (evicted by, dead past the bound, quarantined for)."""

    host_id: str
    reason: str

    def to_stored(self) -> dict[str, str]:
        return {"host_id": self.host_id, "reason": self.reason}

    def to_json(self) -> dict[str, str]:
        return {"hostId": self.host_id, "reason": self.reason}

    @classmethod
    def from_stored(cls, doc: Mapping[str, Any]) -> HostReason:
        return cls(str(doc.get("host_id", "")), str(doc.get("reason", "")))


@dataclass(frozen=True)
class RemovedHost:
    """A target the job no longer waits for: why (evicted by, dead past the bound,
    NO_SPACE, quarantined for) and when (wall time, Unix seconds). GetJob's
    ``removed_hosts`` and the deployer events' ``removedHosts`` (signed with the event)."""

    host_id: str
    reason: str
    removed_at: int

    def to_stored(self) -> dict[str, object]:
        return {"host_id": self.host_id, "reason": self.reason, "removed_at": self.removed_at}

    def to_json(self) -> dict[str, object]:
        return {"hostId": self.host_id, "reason": self.reason, "removedAt": self.removed_at}

    @classmethod
    def from_stored(cls, doc: Mapping[str, Any]) -> RemovedHost:
        return cls(
            str(doc.get("host_id", "")), str(doc.get("reason", "")), int(doc.get("removed_at", 0))
        )


@dataclass(frozen=True)
class JobReport:
    """A job as the coordinator reports it (GetJob), on both sides of the wire.

    ``error`` is derived by the client from the hosts' errors of a FAILED job
    (:func:`relgate_agent.client.job_error`); the coordinator leaves it empty.
    """

    job_id: str
    state: str
    model: str
    version: str
    manifest_digest: str
    hosts_total: int
    hosts_ready: int
    ready_hosts: tuple[str, ...]
    bytes_moved: int
    origin_bytes: int
    checkpoint_bytes: int
    stragglers: tuple[str, ...]
    eta_s: int
    topology_version: int
    completion_emitted: bool
    duration_s: float
    control_refusals: int
    hosts: tuple[HostRow, ...]
    pending_events: int = 0  # deployer events in the outbox, not yet acknowledged (2xx)
    quarantined_hosts: tuple[str, ...] = ()  # excluded after BAD_DATA from two downstreams
    error: str = ""
    # each straggler with why (kept until READY or removed), and the removed targets with why
    straggler_reasons: tuple[HostReason, ...] = ()
    removed_hosts: tuple[RemovedHost, ...] = ()
    # the replica leading the job and its lease epoch, as ``job list`` shows them
    leader_replica: str = ""
    leader_epoch: int = 0
    # why the coordinator failed the job ("" unless FAILED); kept with its figures
    failure: str = ""

    def to_dict(self) -> dict[str, Any]:
        """snake_case view (what the Dagster Pipes entry and the harness read)."""
        d = {f.name: getattr(self, f.name) for f in fields(self)}
        d["ready_hosts"] = list(self.ready_hosts)
        d["stragglers"] = list(self.stragglers)
        d["quarantined_hosts"] = list(self.quarantined_hosts)
        d["hosts"] = [h.to_stored() for h in self.hosts]
        d["straggler_reasons"] = [r.to_stored() for r in self.straggler_reasons]
        d["removed_hosts"] = [r.to_stored() for r in self.removed_hosts]
        return d

    def to_json(self, *, hosts: bool = True) -> dict[str, object]:
        """camelCase JSON (the CLI's ``job get --json``); ``hosts=False`` leaves them out."""
        out: dict[str, object] = {camel(k): v for k, v in self.to_dict().items() if k != "hosts"}
        out["stragglerReasons"] = [r.to_json() for r in self.straggler_reasons]
        out["removedHosts"] = [r.to_json() for r in self.removed_hosts]
        if hosts:
            out["hosts"] = [h.to_json() for h in self.hosts]
        return out


@dataclass(frozen=True)
class InventoryHost:
    """One host of the coordinator's inventory (enrolled and/or heard from)."""

    host_id: str
    rack: str
    labels: Mapping[str, str]
    enrolled: bool
    last_seen_age_s: float
    live: bool
    health: str
    data_refusals: int
    hold: str = ""  # why it is kept out of new jobs until an operator clears it ("" none)

    def to_json(self) -> dict[str, object]:
        return {
            "hostId": self.host_id,
            "rack": self.rack,
            "labels": dict(self.labels),
            "enrolled": self.enrolled,
            "lastSeenAgeS": self.last_seen_age_s,
            "live": self.live,
            "health": self.health,
            "dataRefusals": self.data_refusals,
            "hold": self.hold,
        }


@dataclass(frozen=True)
class JobSummary:
    """One job of ListJobs (``job list``): live or finished, hosts READY of its targets."""

    job_id: str
    model: str
    version: str
    state: str
    hosts_total: int
    hosts_ready: int
    created_at: int  # wall time, Unix seconds
    # the replica whose lease leads the job now ("" none: finished, or between leaders)
    # and that lease's epoch (sharded coordinators: each job its own)
    leader_replica: str = ""
    leader_epoch: int = 0

    def to_json(self) -> dict[str, object]:
        return {camel(f.name): getattr(self, f.name) for f in fields(self)}


@dataclass(frozen=True)
class StripeHop:
    """One host's place in one stripe's chain: its upstream (a host, or :data:`ORIGIN` for
    the root), its downstreams in chain order, and what the coordinator knows of its
    progress there: the stripe's receive rate as last reported (:data:`STRIPE_DONE` held
    whole or pulled from the bypass peer, 0 none reported) and the bytes of the stripe's
    chunks it verified (-1 unknown)."""

    host_id: str
    upstream: str
    downstreams: tuple[str, ...]
    rx_bytes_per_s: int
    bytes_done: int
    bypassed: bool = False

    def to_json(self) -> dict[str, object]:
        out = {camel(f.name): getattr(self, f.name) for f in fields(self)}
        out["downstreams"] = list(self.downstreams)
        return out


@dataclass(frozen=True)
class StripeView:
    """One stripe of a job's topology: its root (the host reading the origin), the bytes of
    its chunks (chunk index mod k) and every hop, chain order, root first."""

    stripe: int
    root: str
    stripe_bytes: int
    hops: tuple[StripeHop, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "stripe": self.stripe,
            "root": self.root,
            "stripeBytes": self.stripe_bytes,
            "hops": [h.to_json() for h in self.hops],
        }


@dataclass(frozen=True)
class JobTopology:
    """A job's current striped chains (GetJobTopology, ``job get --topology``); ``live``
    false: a finished job's last stored topology (no rates: its progress cache is gone)."""

    job_id: str
    state: str
    topology_version: int
    live: bool
    stripes: tuple[StripeView, ...]

    def to_json(self) -> dict[str, object]:
        return {
            "jobId": self.job_id,
            "state": self.state,
            "topologyVersion": self.topology_version,
            "live": self.live,
            "stripes": [s.to_json() for s in self.stripes],
        }
