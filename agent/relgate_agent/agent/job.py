"""Job: the state one distribution job keeps on one host, shared by its workers.

:class:`JobState` is what the stripe workers (:mod:`.stripes`), chunk repair
(:mod:`.repair`), the control-plane loops (:mod:`.control`) and the runner
(:mod:`.runner`) share: the job's identity and stop event, the verified files once the
manifest is known (:class:`JobFiles`), the current assignment (:class:`Assignments`), the
buffered errors for the next report, the byte and error counters (:class:`JobCounters`),
and the failure accounting that decides when this host gives up.
"""

from __future__ import annotations

import logging
import threading
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from relgate_trust.manifest import CheckpointManifest, TrustedKeys

from relgate_agent import hooks, logctx
from relgate_agent.agent.bytelog import KIND_ORIGIN, KIND_RX, ByteLog
from relgate_agent.attestation import CertSigner
from relgate_agent.contracts import ORIGIN
from relgate_agent.dataplane.origin import object_uri
from relgate_agent.dataplane.pacing import ORIGIN_BURST_S, TokenBucket
from relgate_agent.dataplane.transport import DEFAULT_CREDITS, Pace
from relgate_agent.errors import KIND_CHUNK_FAILED, KIND_NO_SPACE
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.reportstream import Duplex, ReportRouter
from relgate_agent.staging.direct import BUFFERED
from relgate_agent.staging.storage import VersionStore, bitmap_from_bits

log = logging.getLogger(__name__)

BAD_PEERS_FAIL = 2  # independent peers failing a chunk N times: the checkpoint is bad


@dataclass(frozen=True)
class AgentConfig:
    host_id: str
    rack: str
    coordinator: str
    models_root: Path
    trusted_keys: TrustedKeys
    labels: dict[str, str] = field(default_factory=dict)
    listen_host: str = "127.0.0.1"
    listen_port: int = 0
    advertise_host: str = ""
    journal_interval_s: float = 2.0
    report_interval_s: float = 1.0
    # a watch stream that outlives this is cut (the coordinator ends each one well before;
    # keepalive pings catch a vanished coordinator much sooner)
    watch_timeout_s: float = 300.0
    # the coordinator replicas lead jobs separately (their --shard-by-job): watch every
    # replica and send each job's reports to the replica whose watch lists it
    coordinator_sharded: bool = False
    credits: int = DEFAULT_CREDITS
    # no frame at all from an upstream for this long = stalled (the seed's 2 s): an upstream
    # that is itself waiting sends a heartbeat every transport.HEARTBEAT_S (1 s)
    stall_s: float = 2.0
    # origin range GETs per stripe root in flight, and their size (0: the origin kind's
    # default, rangefetch.RangePlan.for_origin: S3 16 x 64 MiB)
    origin_parallel: int = 0
    origin_range_bytes: int = 0
    retain_versions: int = 2  # current + N-1
    # how staging files are written and re-read: "buffered" (the page cache) or "direct"
    # (O_DIRECT through aligned buffers, no page-cache copy; staging/direct.py)
    staging_io: str = BUFFERED
    max_rate_bytes_per_s: int = 0  # per-host cap on data-plane rx and tx (0 = NIC speed)
    max_upload_bytes_per_s: int = 0  # per-host cap on data-plane tx alone (0 = the above)
    bypass: bool = True  # route around a dead upstream without a leader (bypass.py)
    bypass_slow: bool = False  # ... and around the slow hop (experimental; bypass.py)
    metrics_listen: str = ""  # "host:port" for Prometheus /metrics ("": not served)
    # renew the host certificate when this little of it is left (0: never; agent/renew.py)
    renew_before_s: float = 0.0
    # ask the coordinator for its CA bundle this often (0: never; identity/cabundle.py)
    trust_poll_s: float = 0.0
    # a chunk that fails verification this many times from the origin (or from each of two
    # or more peers) fails the job, naming the chunk, file and origin object; a peer that
    # fails it this many times is bypassed (FetchChunk from another holder)
    max_chunk_failures: int = 3
    # placement re-verifies the staged tree; after this many mismatching rounds (each one
    # re-fetching the bad chunks) the host gives up on the job, never placing
    placement_attempts: int = 3
    repair_attempts: int = 60  # FetchChunk rounds (0.25 s apart) before the stripe re-pulls


class HostServices(Protocol):
    """What a job needs from the host agent running it (:class:`.host.HostAgent`)."""

    @property
    def config(self) -> AgentConfig: ...

    @property
    def stub(self) -> Any: ...  # FailoverStub over AgentServiceStub (dynamic gRPC methods)

    @property
    def reports(self) -> Duplex | ReportRouter: ...  # the report stream(s) to the coordinator

    @property
    def data_client(self) -> Any: ...  # ssl.SSLContext for dialing peers

    @property
    def data_address(self) -> str: ...

    def rx_limit(self, n: int) -> None: ...

    def health(self) -> str: ...

    def data_refusals(self) -> int: ...

    def outranked(self, job_id: str) -> bool: ...  # a higher-priority job still transfers here

    @property
    def attestor(self) -> CertSigner | None: ...  # signs placement attestations (host key)


class ChunkTracker:
    """Which blocks are on disk (servable) and which chunks verified; wakes waiting servers."""

    def __init__(self, manifest: CheckpointManifest) -> None:
        self.m = manifest
        self.verified = bytearray(manifest.num_chunks)
        self.available = bytearray(manifest.num_blocks)
        self.cond = threading.Condition()
        self.n_verified = 0

    def mark_available(self, block: int) -> None:
        with self.cond:
            self.available[block] = 1
            self.cond.notify_all()

    def mark_verified(self, chunk: int) -> None:
        with self.cond:
            if not self.verified[chunk]:
                self.verified[chunk] = 1
                self.n_verified += 1
            for b in self.m.chunk_blocks(chunk):
                self.available[b] = 1
            self.cond.notify_all()

    def unmark_chunk(self, chunk: int) -> None:
        with self.cond:
            if self.verified[chunk]:
                self.verified[chunk] = 0
                self.n_verified -= 1
            for b in self.m.chunk_blocks(chunk):
                self.available[b] = 0
            self.cond.notify_all()

    def wait_block(self, block: int, timeout: float) -> bool:
        with self.cond:
            return self.cond.wait_for(lambda: self.available[block] == 1, timeout)

    def chunk_complete_on_disk(self, chunk: int) -> bool:
        return all(self.available[b] for b in self.m.chunk_blocks(chunk))

    def all_verified(self) -> bool:
        return self.n_verified == self.m.num_chunks

    def notify(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def bitmap(self) -> bytes:
        with self.cond:
            return bitmap_from_bits(self.verified)


@dataclass
class JobFiles:
    """The verified manifest and where its bytes live on this host (set once registered)."""

    manifest: CheckpointManifest
    envelope: bytes  # the signed manifest, kept beside the placed marker
    store: VersionStore
    tracker: ChunkTracker
    origin_uri: str
    stripe_blocks: list[list[int]]

    @property
    def stripes(self) -> int:
        return len(self.stripe_blocks)


@dataclass
class JobCounters:
    """Byte and event counters of this process (guarded by :attr:`JobState.lock`)."""

    rx_bytes: int = 0
    tx_bytes: int = 0
    origin_bytes: int = 0
    crc_errors: int = 0
    hash_mismatches: int = 0
    refetched_chunks: int = 0
    resumed_chunks: int = 0
    staged_mismatches: int = 0
    swarm_chunks: int = 0  # chunks pulled peer-to-peer while a chain was broken
    manifest_from: str = ""  # where the verified envelope came from: a host id, "coordinator"
    placement_rounds: int = 0
    # delta: chunks (and their bytes) copied from other local versions, not transferred;
    # held copies refused because they no longer hash to the signed digest
    local_chunks: int = 0
    local_bytes: int = 0
    local_rejected: int = 0
    # end-game: chunks won from a race of holders, losing fetches cancelled, and bytes of
    # losing copies that arrived whole before the cancel
    endgame_chunks: int = 0
    endgame_cancelled: int = 0
    endgame_duplicate_bytes: int = 0
    stripe_rx: dict[int, int] = field(default_factory=dict)  # bytes received per stripe
    # blocks from an upstream in another DC: bytes on the WAN and the blocks they decoded to
    wan_wire_bytes: int = 0
    wan_raw_bytes: int = 0
    # open streams cut because the upstream's certificate expired or was revoked, by the
    # check's name; and when the first was cut (wall clock, for the certificate's notAfter)
    peer_cert_cuts: dict[str, int] = field(default_factory=dict)
    first_peer_cert_cut_at: float = 0.0
    # upstreams bypassed (agent/bypass.py), by why: dead, tx, rx
    bypasses: dict[str, int] = field(default_factory=dict)


@dataclass(frozen=True)
class JobStats:
    """What ``<models-root>/.agent-stats/<job>.<pid>.json`` records (snake_case, as stored)."""

    job_id: str
    host_id: str
    pid: int
    ready: bool
    rx_bytes: int
    tx_bytes: int
    origin_bytes: int
    crc_errors: int
    hash_mismatches: int
    refetched_chunks: int
    resumed_chunks: int
    swarm_chunks: int
    staged_mismatches: int
    placement_rounds: int
    failed: str
    scrubbed: str = ""  # quarantined: staging removed, each held version re-verified
    manifest_from: str = ""  # the host the envelope came from, or "coordinator"
    local_chunks: int = 0  # delta: copied from another local version, not transferred
    local_bytes: int = 0
    local_rejected: int = 0  # held copies that no longer matched the signed digest
    endgame_chunks: int = 0  # won by the end-game race of holders
    endgame_cancelled: int = 0  # duplicate fetches cancelled once a copy verified
    endgame_duplicate_bytes: int = 0
    wan_wire_bytes: int = 0  # received from another DC, as sent (compressed)
    wan_raw_bytes: int = 0  # ... and as the blocks it decoded to
    bypasses: dict[str, int] = field(default_factory=dict)  # reason -> upstreams bypassed
    peer_cert_cuts: dict[str, int] = field(default_factory=dict)  # check -> streams cut
    first_peer_cert_cut_at: float = 0.0  # wall clock of the first such cut

    def to_json(self) -> dict[str, object]:
        return asdict(self)


class Assignments:
    """The latest stripe assignment from the coordinator; never rewired backwards."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.topology_version = 0
        self.epoch = 0  # the lease epoch of the leader whose assignment was applied last
        self.floor = 0  # versions below this are stale (see require)
        self.by_stripe: dict[int, pb.StripeAssignment] = {}
        # hosts of the current topology (may FetchChunk from us): the pushed list, made a set
        # on the first lookup (a push to 4,096 hosts names 4,096 members; most never look)
        self._members: Iterable[str] = ()
        self._member_set: frozenset[str] | None = frozenset()
        self.buckets: dict[int, TokenBucket] = {}  # origin rate per stripe root
        # stripe -> the upstream this host bypasses on it (agent/bypass.py): the stripe is
        # pulled from the assignment's bypass peer while the assignment names that upstream
        self.bypassed: dict[int, str] = {}

    def apply(self, a: pb.Assignment) -> None:
        with self.cond:
            if not self.newer(a):
                return  # stale (e.g. from a deposed coordinator): never rewire backwards
            self.topology_version, self.epoch = a.topology_version, a.leader_epoch
            self.by_stripe = {s.stripe: s for s in a.stripes}
            # a bypass lasts while the assignment names the upstream it bypasses: once the
            # leader rewired the stripe, a later return to that upstream is the leader's word
            self.bypassed = {
                s: up
                for s, up in self.bypassed.items()
                if s in self.by_stripe and self.by_stripe[s].upstream.host_id == up
            }
            self._members, self._member_set = a.members, None
            for s in a.stripes:
                if s.upstream.host_id == ORIGIN and s.origin_rate_bytes_per_s:
                    self.buckets.setdefault(
                        s.stripe,
                        TokenBucket(s.origin_rate_bytes_per_s, burst_s=ORIGIN_BURST_S, full=False),
                    ).set_rate(s.origin_rate_bytes_per_s)
            self.cond.notify_all()

    @property
    def members(self) -> frozenset[str]:
        with self.cond:
            if self._member_set is None:
                self._member_set = frozenset(self._members)
            return self._member_set

    def newer(self, a: pb.Assignment) -> bool:
        """``a`` is newer than the applied one: from a leader of the same lease epoch with a
        later topology version, or from a later epoch (a new leader's version is loaded
        from the store, so it is never behind one a deposed leader stored). An assignment
        from an older epoch is a deposed leader's, whatever its version: refused."""
        if a.leader_epoch < self.epoch or a.topology_version < self.floor:
            return False
        if a.leader_epoch > self.epoch:
            return a.topology_version >= self.topology_version
        return a.topology_version > self.topology_version

    def require(self, version: int) -> None:
        """Act on nothing older than ``version`` (the topology Register answered with: a
        registration may have moved this host, e.g. a declared serving host to a leaf)."""
        with self.cond:
            self.floor = max(self.floor, version)
            if self.topology_version < version:
                self.by_stripe = {}

    def wait_versioned(
        self, stripe: int, stop: threading.Event
    ) -> tuple[pb.StripeAssignment | None, int]:
        """The stripe's assignment and the topology version it belongs to, read together:
        a pull names its upstream's version, never a later one applied meanwhile (a peer
        then sees our old upstream claimed at its own version: a refusal, not a skew)."""
        with self.cond:
            self.cond.wait_for(lambda: stripe in self.by_stripe or stop.is_set(), 1.0)
            return self.effective(stripe), self.topology_version

    def effective(self, stripe: int) -> pb.StripeAssignment | None:
        """The stripe's assignment as this host acts on it: its bypass peer in place of the
        upstream while that upstream is bypassed (caller holds ``cond`` or reads once)."""
        sa = self.by_stripe.get(stripe)
        if sa is None or not self.bypassing(stripe, sa):
            return sa
        return pb.StripeAssignment(
            stripe=sa.stripe, upstream=sa.bypass, resume_block=sa.resume_block
        )

    def bypassing(self, stripe: int, sa: pb.StripeAssignment) -> bool:
        """Whether ``sa``'s upstream is the one bypassed on ``stripe`` (and it names a
        bypass peer): a new assignment naming another upstream ends the bypass."""
        return sa.HasField("bypass") and self.bypassed.get(stripe) == sa.upstream.host_id

    def bypass(self, stripe: int, upstream: str) -> bool:
        """Pull ``stripe`` from the bypass peer instead of ``upstream`` (which the current
        assignment names). False when it names another upstream, no bypass peer, or the
        upstream is bypassed already."""
        with self.cond:
            sa = self.by_stripe.get(stripe)
            if (
                sa is None
                or sa.upstream.host_id != upstream
                or not sa.HasField("bypass")
                or self.bypassed.get(stripe) == upstream
            ):
                return False
            self.bypassed[stripe] = upstream
            self.cond.notify_all()
            return True

    def bypassed_upstream(self, stripe: int) -> str | None:
        """The upstream bypassed on ``stripe`` now, or None."""
        with self.cond:
            sa = self.by_stripe.get(stripe)
            return sa.upstream.host_id if sa is not None and self.bypassing(stripe, sa) else None

    def bypassed_stripes(self) -> list[int]:
        """The stripes pulled from their bypass peer now (reported to the coordinator)."""
        with self.cond:
            return sorted(s for s, sa in self.by_stripe.items() if self.bypassing(s, sa))

    def changed(self, stripe: int, a: pb.StripeAssignment) -> bool:
        cur = self.effective(stripe)
        return (
            cur is None
            or cur.upstream.host_id != a.upstream.host_id
            or cur.upstream.address != a.upstream.address
        )

    def set_origin_shares(self, shares: Iterable[tuple[int, int]]) -> None:
        """The coordinator's rebalanced origin share per stripe this host roots (from a
        report reply): the stripe's bucket runs at it from now on."""
        with self.cond:
            for stripe, rate in shares:
                if rate > 0:
                    self.buckets.setdefault(
                        stripe, TokenBucket(rate, burst_s=ORIGIN_BURST_S, full=False)
                    ).set_rate(rate)

    def bucket(self, stripe: int) -> TokenBucket:
        return self.buckets.get(stripe) or TokenBucket(0)

    def notify(self) -> None:
        with self.cond:
            self.cond.notify_all()


class JobState:
    """One job on this host: identity, stop event, files, assignment, errors, counters."""

    def __init__(
        self, host: HostServices, job_id: str, model: str, version: str, rank: int = 1
    ) -> None:
        self.host = host
        self.cfg = host.config
        self.job_id = job_id
        self.model = model
        self.version = version
        self.rank = rank  # contracts.priority_rank of the job's priority
        self.stop_event = threading.Event()
        # wakes the report loop before its interval: the job stops, or the coordinator
        # sent news for a quiet report (the next report takes it in at once)
        self.report_wake = threading.Event()
        self.files: JobFiles | None = None
        self.assignments = Assignments()
        self.errors: deque[pb.ReportError] = deque(maxlen=200)
        self.journal_dirty = threading.Event()
        self.threads: list[threading.Thread] = []
        self.hooks = hooks.current().job(job_id)
        self.lock = threading.Lock()  # counters, repairing, chunk_failures
        self.counters = JobCounters()
        # the byte counters' log (bytelog.py): every count appended as it is made
        self.bytelog: ByteLog | None = None
        # origin range reads under way (stripes.py): the last journal flush waits for them,
        # so what the origin served is counted even when the job stops mid-range
        self.origin_reads = 0
        self.origin_reads_done = threading.Condition(self.lock)
        self.repairing: set[int] = set()  # chunks being re-fetched by FetchChunk
        self.stripe_seen: dict[int, float] = {}  # stripe -> monotonic time of its last block
        # stripe -> (the upstream pulled from now, what its PACE frames last said)
        self.upstream_pace: dict[int, tuple[str, Pace]] = {}
        # stripe -> what this host's PACE frames say its own upstream holds ready for it
        # (agent/bypass.py: 0 unless this host's receive is the stripe's slow hop)
        self.fed_out: dict[int, int] = {}
        self.chunk_failures: dict[int, dict[str, int]] = {}
        self.ready = False
        self.cancelled = False
        self.failed = ""  # why this host gave up (CHUNK_FAILED / HOST_FAILED detail)
        self.quarantined = False  # the coordinator said QUARANTINE: stop, scrub, re-verify
        self.no_space = False  # out of disk: staging is freed and the job stops here
        self.attestation = ""  # the signed placement attestation (JSON), once placed
        self.scrubbed = ""  # what the quarantine scrub found (placed versions re-verified)

    def stop(self) -> None:
        self.stop_event.set()
        self.report_wake.set()
        self.assignments.notify()
        if self.files is not None:
            self.files.tracker.notify()

    def count(self, kind: str, n: int) -> None:
        """``n`` bytes received (``KIND_RX``), sent (``KIND_TX``) or read from the origin
        (``KIND_ORIGIN``): the counter, and a record in the job's byte log, at once
        (caller holds :attr:`lock`)."""
        c = self.counters
        if kind == KIND_RX:
            c.rx_bytes += n
        elif kind == KIND_ORIGIN:
            c.origin_bytes += n
        else:
            c.tx_bytes += n
        if self.bytelog is not None:
            self.bytelog.add(kind, n)

    def log_fields(self) -> dict[str, Any]:
        """What this job's log records carry (logctx): the job, the host, its topology."""
        return {
            "job": self.job_id,
            "host": self.cfg.host_id,
            "topology": lambda: self.assignments.topology_version,
        }

    def spawn(self, fn: Callable[[], None], name: str, stripe: int | None = None) -> None:
        """A thread of this job; its log records name the job (and ``stripe``)."""
        target = logctx.bind(fn, **self.log_fields(), stripe=stripe)
        t = threading.Thread(target=target, name=f"{self.job_id}-{name}", daemon=True)
        self.threads.append(t)
        t.start()

    def error(self, kind: str, chunk: int = -1, from_host: str = "", detail: str = "") -> None:
        log.warning(
            "%s job %s: %s chunk=%d from=%s %s",
            self.cfg.host_id,
            self.job_id,
            kind,
            chunk,
            from_host,
            detail,
        )
        self.errors.append(
            pb.ReportError(kind=kind, chunk=chunk, from_host=from_host, detail=detail[:600])
        )

    def give_up(self, kind: str, chunk: int, detail: str, from_host: str = "") -> None:
        """Stop this job on this host (staging and journal kept) and tell the coordinator why."""
        if self.failed:
            return
        self.failed = detail
        self.error(kind, chunk, from_host, detail)
        log.error("%s job %s: %s: %s", self.cfg.host_id, self.job_id, kind, detail)
        self.stop()

    def out_of_space(self, detail: str) -> None:
        """No room to stage (ENOSPC while writing, or too little free disk to start): stop at
        once, never retry nor re-read the origin; the runner frees staging, the coordinator
        removes this host from the job (``NO_SPACE``) and re-feeds its downstreams."""
        self.no_space = True
        self.give_up(KIND_NO_SPACE, -1, detail)

    def chunk_failure(self, chunk: int, source: str, kind: str) -> bool:
        """Count a failed verification of ``chunk`` from ``source``; True if the job is over."""
        files = self.files
        if files is None or not 0 <= chunk < files.manifest.num_chunks:
            return False
        with self.lock:
            per = self.chunk_failures.setdefault(chunk, {})
            per[source] = per.get(source, 0) + 1
            from_source, total = per[source], sum(per.values())
            sources = sorted(per)
        limit = max(1, self.cfg.max_chunk_failures)
        # the checkpoint itself is bad if the origin failed N times, or at least two
        # independent peers did (one bad peer alone only costs this host a detour)
        bad_peers = sum(1 for src, n in per.items() if src != ORIGIN and n >= limit)
        if not ((source == ORIGIN and from_source >= limit) or bad_peers >= BAD_PEERS_FAIL):
            return False
        m = files.manifest
        c = m.chunks[chunk]
        paths = [f for f, *_ in m.segments(c.offset, c.size)]
        objects = [object_uri(files.origin_uri, f.path, f.object_version) for f in paths]
        self.give_up(
            KIND_CHUNK_FAILED,
            chunk,
            f"chunk {chunk} failed verification {total} times ({kind}, from "
            f"{', '.join(sources)}); file {', '.join(f.path for f in paths)}; origin object "
            f"{', '.join(objects)}; expected {c.digest}",
            from_host=",".join(sources),
        )
        return True

    def failures_from(self, chunk: int, source: str) -> int:
        with self.lock:
            return self.chunk_failures.get(chunk, {}).get(source, 0)

    def first_missing(self, stripe: int) -> int:
        """Position in ``stripe`` of its first block not on disk (and not being repaired)."""
        files = self.files
        if files is None:
            return 0
        blocks = files.stripe_blocks[stripe]
        avail = files.tracker.available
        bpc = files.manifest.blocks_per_chunk
        for pos, b in enumerate(blocks):
            if not avail[b] and b // bpc not in self.repairing:
                return pos
        return len(blocks)

    def gap_end(self, stripe: int, pos: int) -> int:
        """End (exclusive) of the run of missing blocks of ``stripe`` starting at ``pos``: a
        stream asks for this run only, never for blocks held already (delta, repairs)."""
        files = self.files
        if files is None:
            return pos
        blocks, avail = files.stripe_blocks[stripe], files.tracker.available
        for p in range(pos, len(blocks)):
            if avail[blocks[p]]:
                return p
        return len(blocks)

    def stats(self, pid: int) -> JobStats:
        with self.lock:
            c = self.counters
            return JobStats(
                job_id=self.job_id,
                host_id=self.cfg.host_id,
                pid=pid,
                ready=self.ready,
                rx_bytes=c.rx_bytes,
                tx_bytes=c.tx_bytes,
                origin_bytes=c.origin_bytes,
                crc_errors=c.crc_errors,
                hash_mismatches=c.hash_mismatches,
                refetched_chunks=c.refetched_chunks,
                resumed_chunks=c.resumed_chunks,
                swarm_chunks=c.swarm_chunks,
                staged_mismatches=c.staged_mismatches,
                placement_rounds=c.placement_rounds,
                failed=self.failed,
                scrubbed=self.scrubbed,
                manifest_from=c.manifest_from,
                local_chunks=c.local_chunks,
                local_bytes=c.local_bytes,
                local_rejected=c.local_rejected,
                endgame_chunks=c.endgame_chunks,
                endgame_cancelled=c.endgame_cancelled,
                endgame_duplicate_bytes=c.endgame_duplicate_bytes,
                wan_wire_bytes=c.wan_wire_bytes,
                wan_raw_bytes=c.wan_raw_bytes,
                peer_cert_cuts=dict(c.peer_cert_cuts),
                bypasses=dict(c.bypasses),
                first_peer_cert_cut_at=c.first_peer_cert_cut_at,
            )


__all__ = [
    "ORIGIN",
    "AgentConfig",
    "Assignments",
    "ChunkTracker",
    "HostServices",
    "JobCounters",
    "JobFiles",
    "JobState",
    "JobStats",
]
