"""Stripes: one worker per stripe pulls its blocks down the chain and verifies them.

Per stripe a worker pulls blocks from its assigned upstream (a peer's StreamStripe, or the
origin for stripe roots), checks each block's CRC32C against the signed manifest *before*
making it available to its own downstreams (cut-through forwarding happens by downstreams
pulling from this host's data-plane server as soon as a block is available), writes it
with pwrite at its manifest offset, and checks each completed chunk's SHA-256 against the
manifest before counting it. The SHA-256 is computed incrementally as the chunk's blocks are
accepted in order (``ChunkHashes``), so the staged chunk is not read back; a chunk whose
blocks did not all pass through in order (a resumed stream, a repair, a job hook that touches
the staged bytes) is hashed from disk instead.
"""

from __future__ import annotations

import functools
import hashlib
import logging
import threading
import time

from relgate_trust.digests import spelled
from relgate_trust.manifest import CheckpointManifest, crc32c
from relgate_trust.retry import Backoff

from relgate_agent.agent.bypass import PACE_FRESH_S, REASON_DEAD, BypassJudge, StripeView
from relgate_agent.agent.bytelog import KIND_ORIGIN, KIND_RX
from relgate_agent.agent.control import ControlPlane
from relgate_agent.agent.job import ORIGIN, JobFiles, JobState
from relgate_agent.agent.repair import ChunkRepair
from relgate_agent.dataplane.origin import ManifestReader, open_origin
from relgate_agent.dataplane.pacing import ORIGIN_BURST_S
from relgate_agent.dataplane.rangefetch import ParallelRanges, RangePlan, plan_ranges
from relgate_agent.dataplane.transport import PeerCertRefused, StripeStream, TransportError
from relgate_agent.errors import AgentError, NoSpace, OriginError, StorageError
from relgate_agent.hooks import JobHooks
from relgate_agent.identity.authz import STALE_TOPOLOGY
from relgate_agent.proto import distribution_pb2 as pb

log = logging.getLogger(__name__)

WORKER_RETRY = Backoff(0.2, 2.0)  # after a failed pull: 0.2 s doubling to 2 s
SUSPECT_AFTER = 2  # transport failures in a row before the upstream is reported
SWARM_AFTER = 3  # transport failures in a row before swarm mode
PRIORITY_WAIT_S = 0.2  # a job outranked on this host looks again after this
BYPASS_TICK_S = 0.5  # how often the bypass judge looks at the stripes (agent/bypass.py)
COMPLAINT_REPEAT_S = 1.0  # a dead upstream bypassed is reported again this often


class CrcMismatch(AgentError):
    def __init__(self, block: int, source: str) -> None:
        super().__init__(f"block {block} from {source} failed CRC32C")
        self.block = block
        self.source = source


class ChunkHashes:
    """Running SHA-256 per chunk, fed by blocks accepted in order.

    ``feed`` returns True when the block was hashed in sequence; ``digest`` returns the
    chunk's ``sha256:<hex>`` once every block was fed in order, else None (the caller then
    hashes the staged chunk from disk). An entry is popped while it is being updated, so two
    threads feeding one chunk never share a hasher: the loser's chunk is re-read instead.
    """

    def __init__(self, manifest: CheckpointManifest) -> None:
        self.manifest = manifest
        self._lock = threading.Lock()
        self._running: dict[int, tuple[hashlib._Hash, int]] = {}  # chunk -> (hasher, next)
        self.rereads = 0  # chunks that fell back to a re-read (resumed, out of order, hooked)

    def feed(self, chunk: int, block: int, data: bytes) -> None:
        first = self.manifest.chunk_blocks(chunk)[0]
        with self._lock:
            entry = self._running.pop(chunk, None)
        if block == first:
            entry = (hashlib.sha256(), first)
        if entry is None or entry[1] != block:
            return  # resumed mid-chunk or out of order: this chunk will be re-read
        entry[0].update(data)
        with self._lock:
            self._running[chunk] = (entry[0], block + 1)

    def digest(self, chunk: int) -> str | None:
        end = self.manifest.chunk_blocks(chunk)[-1] + 1
        with self._lock:
            entry = self._running.pop(chunk, None)
        if entry is None or entry[1] != end:
            with self._lock:
                self.rereads += 1
            return None
        return spelled(entry[0].hexdigest())


def _hook_touches_staging(hooks: JobHooks) -> bool:
    """A job hook that may rewrite staged bytes (the lab's disk-fault hook) forces re-reads."""
    return type(hooks).chunk_written is not JobHooks.chunk_written


class StripeWorkers:
    """The stripe workers of one job (after registration: the files are known)."""

    def __init__(
        self, job: JobState, files: JobFiles, control: ControlPlane, repair: ChunkRepair
    ) -> None:
        self.job = job
        self.files = files
        self.control = control
        self.repair = repair
        self.reader: ManifestReader | None = None
        self.ranges: ParallelRanges  # set with the reader
        self.hashes = ChunkHashes(files.manifest)
        self.reread_always = _hook_touches_staging(job.hooks)
        self.judge = BypassJudge()
        # stripe -> (upstream bypassed as dead, the complaint's reason): reported again while
        # the bypass lasts, so the coordinator's complaint about it stays alive (a complaint
        # not repeated expires) and it is spliced or removed as if the failures went on
        self.dead_upstreams: dict[int, tuple[str, str]] = {}
        self.complain_now = threading.Event()  # a new one: report it at once

    def start(self) -> None:
        for s in range(self.files.stripes):
            self.job.spawn(functools.partial(self.worker, s), f"stripe-{s}", stripe=s)
        if self.job.cfg.bypass:
            self.job.spawn(self.repeat_complaints, "complaints")
        if self.job.cfg.bypass_slow:
            self.job.spawn(self.watch_bypass, "bypass")

    # ------------------------------------------------------------------ bypass
    def watch_bypass(self) -> None:
        """Every BYPASS_TICK_S: the judge's verdicts bypass their upstreams, and what this
        host's PACE frames say of its own receive is refreshed."""
        job = self.job
        while not job.stop_event.wait(BYPASS_TICK_S):
            now = time.monotonic()
            views = self.stripe_views(now)
            for v in self.judge.observe(now, views):
                self._bypass(v.stripe, v.upstream, v.reason, v.describe())
            with job.lock:
                for s, view in views.items():  # what our upstream holds ready for us
                    job.fed_out[s] = self.judge.fed(s, view.ahead)

    def repeat_complaints(self) -> None:
        """Every COMPLAINT_REPEAT_S, ReportSuspect for each dead upstream still bypassed (off
        the stripe threads: a frozen leader holds each call for its whole timeout)."""
        job = self.job
        while not job.stop_event.is_set():
            self.complain_now.wait(COMPLAINT_REPEAT_S)
            self.complain_now.clear()
            with job.lock:
                dead = dict(self.dead_upstreams)
            for stripe, (upstream, reason) in dead.items():
                if job.assignments.bypassed_upstream(stripe) == upstream:
                    self.control.suspect(stripe, upstream, reason)
                else:
                    with job.lock:
                        self.dead_upstreams.pop(stripe, None)

    def stripe_views(self, now: float) -> dict[int, StripeView]:
        job, files = self.job, self.files
        paused = job.host.outranked(job.job_id)  # before the job lock (host lock first)
        out: dict[int, StripeView] = {}
        for s in range(files.stripes):
            with job.assignments.cond:
                sa = job.assignments.effective(s)
                # the assignment names a bypass peer that is not in use yet
                can = sa is not None and sa.HasField("bypass")
            with job.lock:
                rx = job.counters.stripe_rx.get(s, 0)
                paced = job.upstream_pace.get(s)
            upstream = sa.upstream.host_id if sa is not None else ""
            if upstream == ORIGIN or paused or job.first_missing(s) >= len(files.stripe_blocks[s]):
                upstream = ""
            ahead = fed = None
            if paced is not None and paced[0] == upstream and now - paced[1].at <= PACE_FRESH_S:
                ahead, fed = paced[1].ahead, paced[1].fed
            out[s] = StripeView(upstream, rx, ahead, fed, can)
        return out

    def _bypass(self, stripe: int, upstream: str, reason: str, why: str) -> bool:
        """Pull ``stripe`` from the assignment's bypass peer from now on (the stripe's
        stream ends at its next block: ``Assignments.changed``)."""
        job = self.job
        if not job.assignments.bypass(stripe, upstream):
            return False
        with job.lock:
            job.counters.bypasses[reason] = job.counters.bypasses.get(reason, 0) + 1
        log.warning("%s bypasses %s: %s", job.cfg.host_id, upstream, why)
        return True

    # ------------------------------------------------------------------ worker
    def worker(self, stripe: int) -> None:
        job, blocks = self.job, self.files.stripe_blocks[stripe]
        failures = 0
        pulling_from = ""  # the upstream named last (logged when it changes)
        while not job.stop_event.is_set():
            pos = job.first_missing(stripe)
            if pos >= len(blocks):
                with self.files.tracker.cond:
                    self.files.tracker.cond.wait(1.0)
                continue
            if job.host.outranked(job.job_id):
                job.stop_event.wait(PRIORITY_WAIT_S)  # a higher-priority job goes first
                continue
            a, version = job.assignments.wait_versioned(stripe, job.stop_event)
            if a is None:
                continue
            if a.upstream.host_id != pulling_from:
                pulling_from = a.upstream.host_id
                log.info("stripe %d pulls from %s at block %d", stripe, pulling_from, pos)
            try:
                failures = self._pull_once(stripe, pos, a, failures, version)
            except _JobOver:
                return
            if failures:
                job.stop_event.wait(WORKER_RETRY.delay(min(failures, 5)))

    def _pull_once(
        self, stripe: int, pos: int, a: pb.StripeAssignment, failures: int, version: int
    ) -> int:
        """One pull from the stripe's upstream (``a``, of topology ``version``); the
        consecutive-failure count after it."""
        job, upstream = self.job, a.upstream.host_id
        try:
            if upstream == ORIGIN:
                self._pull_origin(stripe, pos, a)
            else:
                self._pull_peer(stripe, pos, a, version)
            return 0
        except CrcMismatch as exc:
            return self._on_crc_mismatch(stripe, exc, failures)
        except TransportError as exc:
            return self._on_transport_error(stripe, upstream, exc, failures + 1)
        except NoSpace as exc:  # the disk is full: stop, never retry or re-read the origin
            job.out_of_space(f"{exc}")
            raise _JobOver from exc
        except (OriginError, StorageError) as exc:
            job.error("ORIGIN" if isinstance(exc, OriginError) else "STORAGE", detail=str(exc))
            return failures + 1
        except Exception as exc:  # a worker must never die silently: report and retry
            # a bug (the pull's refusals, CRC/transport/disk/origin, are handled above): the
            # report names the stripe, the upstream and the exception; the worker retries
            log.exception(
                "%s stripe %d: unexpected %s pulling from %s",
                job.cfg.host_id,
                stripe,
                type(exc).__name__,
                upstream,
            )
            job.error("INTERNAL", from_host=upstream, detail=f"stripe {stripe}: {exc!r}")
            return failures + 1

    def _on_transport_error(
        self, stripe: int, upstream: str, exc: TransportError, failures: int
    ) -> int:
        """A failed pull from a peer: reported after SUSPECT_AFTER in a row, then the
        assignment's bypass peer (without a leader), then swarm mode."""
        job = self.job
        if isinstance(exc, PeerCertRefused):
            self._cert_cut(stripe, upstream, exc)
        reason = "STALLED" if "stalled" in str(exc) else "CONN_RESET"
        log.info("%s stripe %d: upstream %s: %s", job.cfg.host_id, stripe, upstream, exc)
        if failures < SUSPECT_AFTER:
            return failures
        if (
            job.cfg.bypass
            and STALE_TOPOLOGY not in str(exc)  # a moment apart, not dead: ask again
            and self._bypass(
                stripe,
                upstream,
                REASON_DEAD,
                f"stripe {stripe}: upstream {upstream} failed {failures} times: {exc}",
            )
        ):
            # the bypass peer at once; the complaint is reported (and repeated while the
            # bypass lasts) off this thread: repeat_complaints
            with job.lock:
                self.dead_upstreams[stripe] = (upstream, reason)
            self.complain_now.set()
            return 0
        self.control.suspect(stripe, upstream, reason)
        if failures >= SWARM_AFTER and self.repair.swarm_step(stripe, upstream):
            return 0  # progress without the chain; try the chain again next
        return failures

    def _cert_cut(self, stripe: int, upstream: str, exc: PeerCertRefused) -> None:
        """The upstream's certificate expired or was revoked under an open stream (or at
        the handshake): counted by the check's name and logged; the stripe goes on from
        the next upstream its assignment names (the coordinator removes the host)."""
        job = self.job
        with job.lock:
            cuts = job.counters.peer_cert_cuts
            cuts[exc.check] = cuts.get(exc.check, 0) + 1
            if exc.mid_stream and not job.counters.first_peer_cert_cut_at:
                job.counters.first_peer_cert_cut_at = time.time()
        log.warning(
            "%s stripe %d: stream from upstream %s refused, check=%s: %s",
            job.cfg.host_id,
            stripe,
            upstream,
            exc.check,
            exc.why,
        )

    def _on_crc_mismatch(self, stripe: int, exc: CrcMismatch, failures: int) -> int:
        job = self.job
        with job.lock:
            job.counters.crc_errors += 1
        chunk = self.files.manifest.block_chunk(exc.block)
        job.error("CRC_MISMATCH", chunk, exc.source, str(exc))
        if job.chunk_failure(chunk, exc.source, "CRC_MISMATCH"):
            raise _JobOver
        self.control.suspect(stripe, exc.source, "BAD_DATA")
        if (
            exc.source != ORIGIN
            and job.failures_from(chunk, exc.source) >= job.cfg.max_chunk_failures
            and self.repair.swarm_step(stripe, exc.source)
        ):
            return 0  # the chunk came from another peer; back to the chain
        return failures + 1

    # ------------------------------------------------------------------ pulls
    def _pull_peer(self, stripe: int, pos: int, a: pb.StripeAssignment, version: int) -> None:
        job, blocks = self.job, self.files.stripe_blocks[stripe]
        end = job.gap_end(stripe, pos)
        stream = StripeStream(
            a.upstream.address,
            job.job_id,
            stripe,
            pos,
            job.cfg.credits,
            job.cfg.stall_s,
            tls=job.host.data_client,
            peer=a.upstream.host_id,
            topo=version,  # the version ``a`` belongs to, not one applied since
            to_pos=end if end < len(blocks) else None,
            max_block=self.files.manifest.block_size,
            # the upstream is in another data center: zstd frames on the WAN link
            block_length=self._block_length if a.compress else None,
        )
        with job.lock:
            job.upstream_pace[stripe] = (a.upstream.host_id, stream.pace)
        try:
            for item in stream:
                if (
                    job.stop_event.is_set()
                    or job.assignments.changed(stripe, a)
                    or job.host.outranked(job.job_id)
                ):
                    return
                if item is None:
                    continue  # heartbeat: upstream alive, waiting on its own upstream
                if pos >= len(blocks) or item.block != blocks[pos]:
                    raise TransportError(
                        f"out-of-order block {item.block} at stripe position {pos}"
                    )
                self.accept(item.block, item.data, a.upstream.host_id)
                pos += 1
                if pos < end:
                    stream.grant(1)
        finally:
            stream.close()
            if a.compress:
                with job.lock:
                    job.counters.wan_wire_bytes += stream.wire.wire
                    job.counters.wan_raw_bytes += stream.wire.raw

    def _block_length(self, block: int) -> int:
        return self.files.manifest.block_range(block)[1]

    def _pull_origin(self, stripe: int, pos: int, a: pb.StripeAssignment) -> None:
        """The stripe from the origin: ranges of contiguous blocks, ``plan.parallel`` in
        flight (dataplane/rangefetch.py), consumed in order; the stripe's bucket paces each range."""
        job, files = self.job, self.files
        if self.reader is None:
            self.reader = ManifestReader(open_origin(files.origin_uri), files.manifest)
            self.ranges = ParallelRanges(
                self._read_origin,
                RangePlan.for_origin(
                    files.origin_uri, job.cfg.origin_parallel, job.cfg.origin_range_bytes
                ),
                job.stop_event,
            )
        bucket = job.assignments.bucket(stripe)
        wanted = (b for b in files.stripe_blocks[stripe][pos:] if not files.tracker.available[b])
        most = self.ranges.plan.range_bytes

        def range_bytes() -> int:
            # paced: a range is at most the share's burst (pacing.ORIGIN_BURST_S), so a range
            # started at once (at the start, after a splice) is no burst above the cap; at
            # least one block (plan_ranges)
            if bucket.rate <= 0:
                return most
            return min(most, max(int(bucket.rate * ORIGIN_BURST_S), 1))

        plan = plan_ranges(wanted, files.manifest.block_range, range_bytes)
        results = self.ranges.fetch(plan, bucket.take)
        try:
            for blocks, data in results:
                at = 0
                for b in blocks:
                    if (
                        job.stop_event.is_set()
                        or job.assignments.changed(stripe, a)
                        or job.host.outranked(job.job_id)
                    ):
                        return
                    n = files.manifest.block_range(b)[1]
                    with job.lock:
                        self._count_stripe(b, n)
                    self.accept(b, data[at : at + n], ORIGIN)
                    at += n
        finally:
            results.close()  # cancels the ranges not started

    def _read_origin(self, offset: int, length: int) -> bytes:
        """One range from the origin, counted as it came off the wire: every range read
        counts, kept or not (a rewired stripe drops the rest of its range), so the job's
        origin bytes are what the origin served."""
        if self.reader is None:  # set before the ranges are
            raise OriginError("origin reader is not open")
        job = self.job
        with job.lock:
            job.origin_reads += 1

        def received(n: int) -> None:
            with job.lock:  # logged as it is counted: a SIGKILL loses none of it
                job.count(KIND_ORIGIN, n)

        try:  # counted piece by piece: a range that fails halfway counts what came
            return self.reader.read(offset, length, received)
        finally:
            with job.lock:
                job.origin_reads -= 1
                job.origin_reads_done.notify_all()

    def _count_stripe(self, block: int, n: int) -> None:
        """Bytes received on the block's stripe (caller holds the job lock)."""
        s = self.files.manifest.block_chunk(block) % self.files.stripes
        rx = self.job.counters.stripe_rx
        rx[s] = rx.get(s, 0) + n
        self.job.stripe_seen[s] = time.monotonic()

    # ------------------------------------------------------------------ verification
    def accept(self, block: int, data: bytes, source: str) -> None:
        """CRC before anything else: a bad block is never written, so never forwarded."""
        job, m, tracker = self.job, self.files.manifest, self.files.tracker
        if crc32c(data) != m.block_crc(block):
            raise CrcMismatch(block, source)
        if source != ORIGIN:
            job.host.rx_limit(len(data))
            with job.lock:
                job.count(KIND_RX, len(data))
                self._count_stripe(block, len(data))
        chunk = m.block_chunk(block)
        if tracker.verified[chunk] or chunk in job.repairing:
            return
        off, _ = m.block_range(block)
        self.files.store.pwrite(off, data)
        self.hashes.feed(chunk, block, data)
        last = m.chunk_blocks(chunk)[-1]
        if block == last:
            job.hooks.chunk_written(chunk, m.chunks[chunk].offset, self.files.store)
        tracker.mark_available(block)
        if block == last and tracker.chunk_complete_on_disk(chunk):
            self._verify_chunk(chunk, source)

    def _verify_chunk(self, chunk: int, source: str) -> None:
        job = self.job
        digest = self.hashes.digest(chunk)
        if digest is None or self.reread_always:
            ok = self.files.store.chunk_matches(chunk)
        else:
            ok = digest == self.files.manifest.chunks[chunk].digest
        if ok:
            self.files.tracker.mark_verified(chunk)
            job.journal_dirty.set()
            return
        with job.lock:
            job.counters.hash_mismatches += 1
        job.error("HASH_MISMATCH", chunk, source, "chunk SHA-256 does not match the manifest")
        if job.chunk_failure(chunk, source, "HASH_MISMATCH"):
            return
        # Repair off the stripe thread: the stream keeps landing later chunks meanwhile.
        self.repair.refetch(chunk, source)


class _JobOver(Exception):
    """The job ended on this host (chunk failure): the stripe worker returns."""


__all__ = ["ChunkHashes", "CrcMismatch", "StripeWorkers"]
