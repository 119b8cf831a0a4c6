"""Control: one job's conversation with the coordinator, and its journal.

Register (have-bitmap, free disk, data address), assignments pushed on the host's watch
stream (the chains keep streaming on the last one while the coordinator is away), progress
reports every
``report_interval_s`` (errors stay buffered until one is delivered), suspect reports, and
the journal of verified chunks, fsynced after the staged data every ``journal_interval_s``.
"""

from __future__ import annotations

import base64
import collections
import contextlib
import json
import logging
import random
import shutil
import time

import grpc
from relgate_trust.retry import Backoff, retry_call

from relgate_agent.agent.bytelog import CountedBytes
from relgate_agent.agent.job import ORIGIN, JobState
from relgate_agent.contracts import ACTION_QUARANTINE, STRIPE_DONE
from relgate_agent.errors import StorageError, is_no_space
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.rpc import QUIET_REPORTS, REPORT_REPLY_TIMEOUT_S
from relgate_agent.staging.storage import (
    JournalState,
    VersionStore,
    count_bits,
    delta_indexes,
)

log = logging.getLogger(__name__)

REGISTER_RETRY = Backoff(1.0, multiplier=1.0)  # until registered, or the job is not ours
FINAL_REPORT_RETRY = Backoff(0.5, multiplier=1.0)
FINAL_REPORT_ATTEMPTS = 20  # ~10 s of retries after giving up
REPORT_RETRY = Backoff(0.25)  # a failed report: again after 0.25 s, 0.5 s, ... (<= interval)


def _not_found(exc: BaseException) -> bool:
    return isinstance(exc, grpc.RpcError) and exc.code() == grpc.StatusCode.NOT_FOUND


class ControlPlane:
    def __init__(self, job: JobState) -> None:
        self.job = job
        self._rate_mark = (time.monotonic(), 0, 0)
        self.rx_bps = 0
        self.tx_bps = 0
        self.stripe_rx_bps: list[int] = []  # per stripe; STRIPE_DONE for a whole one
        self._stripe_mark: dict[int, int] = {}
        # the bitmap the coordinator last took whole (None: send the whole bitmap next)
        self._acked_have: bytes | None = None
        self._sent_have = b""  # the bitmap the report in flight describes
        # reports sent quiet since the last answered one; the next one asks for an answer
        # when this reaches QUIET_REPORTS, or after a failure (it follows the leader at once)
        self._quiet = 0
        self._answer_next = True
        self._news: collections.deque[pb.ReportProgressResponse] = collections.deque()
        self._paused = False  # outranked by a higher-priority job on this host
        self._before = CountedBytes()  # counted by this job's earlier processes (bytelog)
        self._checkpointed = CountedBytes()  # the counters the byte log's base last took

    def resume_counts(self, counted: CountedBytes) -> None:
        """Go on from the byte counters this job's earlier processes logged: the reports
        carry them plus this process's (the counters, stats and metrics stay this process's)."""
        if counted.job_id == self.job.job_id:
            self._before = self._checkpointed = counted

    def _cumulative(self) -> CountedBytes:
        """This job's byte counters on this host across restarts (caller holds the job lock)."""
        c, b = self.job.counters, self._before
        return CountedBytes(
            self.job.job_id, b.rx + c.rx_bytes, b.tx + c.tx_bytes, b.origin + c.origin_bytes
        )

    # ------------------------------------------------------------------ register
    def _journal_bits(self) -> bytes:
        """Verified-chunk bitmap as journaled (before we know the manifest geometry)."""
        job = self.job
        path = job.cfg.models_root / ".staging" / job.model / job.version / "journal"
        try:
            doc = json.loads(path.read_bytes())
            return base64.b64decode(doc.get("verified", ""))
        except (OSError, ValueError):
            return b""

    def register(self, envelope_from_peers: bool = True) -> pb.RegisterResponse:
        """Register; with ``envelope_from_peers`` the coordinator may name hosts to fetch
        the manifest envelope from instead of sending it (it sends it when none holds it)."""
        job = self.job
        tracker = job.files.tracker if job.files is not None else None
        if VersionStore.is_placed(job.cfg.models_root, job.model, job.version):
            have = b"\xff" * 4096 if tracker is None else tracker.bitmap()
        else:
            have = tracker.bitmap() if tracker is not None else self._journal_bits()
        free = 0
        with contextlib.suppress(OSError):
            job.cfg.models_root.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(job.cfg.models_root).free
        resp: pb.RegisterResponse = job.host.stub.Register(
            pb.RegisterRequest(
                job_id=job.job_id,
                host_id=job.cfg.host_id,
                rack=job.cfg.rack,
                have=have,
                free_disk_bytes=free,
                data_address=job.host.data_address,
                serving_rate_bytes_per_s=job.cfg.max_rate_bytes_per_s,
                envelope_from_peers=envelope_from_peers,
            ),
            timeout=30,
        )
        return resp

    def register_until_ok(self, envelope_from_peers: bool = True) -> pb.RegisterResponse | None:
        """Register, retried each second; None if the job is not ours any more or we stop."""
        if self.job.stop_event.is_set():
            return None
        try:
            return retry_call(
                lambda: self.register(envelope_from_peers),
                retry_on=grpc.RpcError,
                backoff=REGISTER_RETRY,
                stop_event=self.job.stop_event,
                give_up=_not_found,
            )
        except grpc.RpcError as exc:
            if _not_found(exc):
                log.info("job %s not for us any more: %s", self.job.job_id, exc.details())
            return None

    # ------------------------------------------------------------------ assignment
    def deliver(self, a: pb.Assignment) -> None:
        """An assignment pushed on the host's watch stream (the watch thread calls this).
        A stale one (not newer than the applied version) is dropped by ``Assignments``."""
        job = self.job
        if a.leader_epoch < job.assignments.epoch:
            log.info(
                "job %s: assignment from deposed leader epoch %d dropped",
                job.job_id,
                a.leader_epoch,
            )
            return
        if a.cancelled:
            job.cancelled = a.job_state == "CANCELLED"
            job.stop()
            return
        job.assignments.apply(a)

    def suspect(self, stripe: int, suspect: str, reason: str) -> None:
        if suspect in (ORIGIN, ""):
            return
        job = self.job
        with contextlib.suppress(grpc.RpcError):
            resp = job.host.stub.ReportSuspect(
                pb.ReportSuspectRequest(
                    job_id=job.job_id,
                    reporter=job.cfg.host_id,
                    suspect_host=suspect,
                    reason=reason,
                    stripe=stripe,
                ),
                timeout=5,
            )
            if resp.topology_version > job.assignments.topology_version:
                job.assignments.notify()

    # ------------------------------------------------------------------ progress
    def _progress_request(self) -> pb.ReportProgressRequest:
        """The report as of now (caller holds the job lock)."""
        job, c, files = self.job, self.job.counters, self.job.files
        now = time.monotonic()
        t0, rx0, tx0 = self._rate_mark
        if now - t0 >= 1.0:
            self.rx_bps = int((c.rx_bytes + c.origin_bytes - rx0) / (now - t0))
            self.tx_bps = int((c.tx_bytes - tx0) / (now - t0))
            self._rate_mark = (now, c.rx_bytes + c.origin_bytes, c.tx_bytes)
            self.stripe_rx_bps = self._stripe_rates(now - t0)
        have, delta, count = self._have_fields()
        total = self._cumulative()
        return pb.ReportProgressRequest(
            job_id=job.job_id,
            host_id=job.cfg.host_id,
            topology_version=job.assignments.topology_version,
            have=have,
            verified_delta=delta,
            verified_count=count,
            # cumulative: this job's bytes on this host across restarts (the journal's too)
            rx_bytes=total.rx,
            tx_bytes=total.tx,
            origin_bytes=total.origin,
            rx_bytes_per_s=self.rx_bps,
            tx_bytes_per_s=self.tx_bps,
            stripe_rx_bytes_per_s=self.stripe_rx_bps,
            bypassed_stripes=job.assignments.bypassed_stripes(),
            errors=list(job.errors),
            ready=job.ready,
            data_address=job.host.data_address,
            rack=job.cfg.rack,
            # READY must name the manifest the placed tree was verified against
            placed_manifest_digest=files.manifest.digest if job.ready and files else "",
            # with READY: the host's signed statement of what it placed where
            placement_attestation=job.attestation if job.ready else "",
            # held and verified: the coordinator may name this host as a manifest source
            manifest_digest=files.manifest.digest if files else "",
            health=job.host.health(),
            data_refusals=job.host.data_refusals(),
        )

    def _stripe_rates(self, dt: float) -> list[int]:
        """Receive rate per stripe over the last ``dt`` s (caller holds the job lock); a
        stripe held whole says so, so the coordinator never reads its quiet as slowness."""
        job, files = self.job, self.job.files
        if files is None:
            return []
        rx, out = job.counters.stripe_rx, []
        for s in range(files.stripes):
            # a stripe held whole, or paused for a higher-priority job: quiet, not slow
            if self._paused or job.first_missing(s) >= len(files.stripe_blocks[s]):
                out.append(STRIPE_DONE)
            else:
                out.append(int((rx.get(s, 0) - self._stripe_mark.get(s, 0)) / dt))
        self._stripe_mark = dict(rx)
        return out

    def _have_fields(self) -> tuple[bytes, bytes, int]:
        """The whole bitmap, or only the chunks verified since the last acknowledged one."""
        files = self.job.files
        if files is None:
            return b"", b"", 0
        have, n = files.tracker.bitmap(), files.manifest.num_chunks
        self._sent_have = have
        count = count_bits(have, n)
        # READY is judged on the whole bitmap (a restarted coordinator holds no base)
        if self._acked_have is None or count == 0 or self.job.ready:
            return have, b"", 0
        return b"", delta_indexes(self._acked_have, have, n), count

    def news(self, answer: pb.ReportProgressResponse) -> None:
        """An answer the coordinator sent for a quiet report (the report stream's reader
        thread): taken in by the next report (:meth:`report_once`), at once when it asks the
        agent to act (a new leader that lacks our base rebuilds within the interval)."""
        self._news.append(answer)
        if answer.actions:
            self.job.report_wake.set()

    def report_once(self) -> list[str]:
        """Send one report: quiet (no answer unless the coordinator has news) unless it
        carries errors (delivered only when answered), follows a failure, or is the
        ``QUIET_REPORTS``-th in a row. Returns the actions of its answer and of the news
        that came since the last report."""
        job = self.job
        news = [self._news.popleft() for _ in range(len(self._news))]
        for answer in news:
            self._take(answer)
        self._paused = job.host.outranked(job.job_id)  # before the job lock (host lock first)
        with job.lock:
            req = self._progress_request()
        quiet = not (req.errors or self._answer_next or self._quiet >= QUIET_REPORTS)
        try:
            if quiet:
                job.host.reports.send(req)
            else:
                answer = job.host.reports.exchange(req, timeout=REPORT_REPLY_TIMEOUT_S)
        except grpc.RpcError:
            # the coordinator may be a new leader by the next report: send the whole bitmap,
            # so its cache is whole from that report on (no FULL_PROGRESS round trip), and
            # wait for its answer (an exchange follows the leader at once)
            self._acked_have, self._answer_next = None, True
            raise
        # news asked for the whole bitmap: this report carried it (not asked again)
        actions = [a for n in news for a in n.actions if a != "FULL_PROGRESS"]
        if job.files is not None:  # a stream delivers in order or fails (then whole)
            self._acked_have = self._sent_have
        if quiet:
            self._quiet += 1
            return actions
        # after a start or a failure, every host of the fleet asks at once: a random place
        # in the quiet run spreads the answered reports over the next QUIET_REPORTS rounds
        # (in step, every fifth round carried all the answers: a wave, then four quiet)
        spread = random.randrange(QUIET_REPORTS) if self._answer_next else 0  # noqa: S311 - load spreading, not a secret
        self._quiet, self._answer_next = spread, False
        self._take(answer)  # after the base: FULL_PROGRESS voids it
        for _ in req.errors:  # delivered; anything appended meanwhile stays buffered
            with contextlib.suppress(IndexError):
                job.errors.popleft()
        return actions + list(answer.actions)

    def _take(self, answer: pb.ReportProgressResponse) -> None:
        """An answer's bookkeeping: on FULL_PROGRESS (a coordinator that lacks our base) the
        next report carries the whole bitmap; origin shares replace the last ones."""
        if "FULL_PROGRESS" in answer.actions:
            self._acked_have = None
        self.job.assignments.set_origin_shares(
            (o.stripe, o.rate_bytes_per_s) for o in answer.origin_shares
        )

    def report_loop(self) -> None:
        job = self.job
        interval = job.cfg.report_interval_s
        wait, failures = interval, 0
        while True:
            job.report_wake.wait(wait)  # the interval, or news to act on, or the end
            job.report_wake.clear()
            if job.stop_event.is_set():
                break
            again = wait == 0
            wait = interval
            try:
                actions = self.report_once()
            except grpc.RpcError:
                # buffered; retried soon (jittered, growing to one interval): after a leader
                # dies the replica that takes over gets every whole bitmap within about one
                # interval of the takeover, not two
                failures += 1
                wait = min(interval, REPORT_RETRY.delay(failures)) * random.uniform(0.5, 1.0)  # noqa: S311 - spreading retries, not a secret
                continue
            failures = 0
            if "FULL_PROGRESS" in actions and not again:
                # a new leader lacks our base: send the whole bitmap now, so its cache is
                # whole within one interval of the takeover (once; then the usual pace)
                wait = 0
            if "REREGISTER" in actions:
                with contextlib.suppress(grpc.RpcError):
                    self.register()
            if ACTION_QUARANTINE in actions:
                job.quarantined = True  # the runner scrubs once its workers stopped
                job.stop()
            elif "CANCEL" in actions:
                job.cancelled = True
                job.stop()
            elif "STOP" in actions:
                job.stop()

    def report_final(self) -> None:
        """Deliver the buffered errors after giving up (bounded: ~10 s of retries)."""
        with contextlib.suppress(grpc.RpcError):
            retry_call(
                self.report_once,
                retry_on=grpc.RpcError,
                backoff=FINAL_REPORT_RETRY,
                attempts=FINAL_REPORT_ATTEMPTS,
            )

    # ------------------------------------------------------------------ journal
    def journal_loop(self) -> None:
        """Every journal interval: the byte log's checkpoint (while the host serves, after
        READY too) and, until placed, the journal of verified chunks."""
        job = self.job
        while not job.stop_event.wait(job.cfg.journal_interval_s):
            self.checkpoint_counts()
            if not job.ready:
                self.flush_journal()

    def checkpoint_counts(self) -> None:
        """Fold the byte log into its fsynced base when the counters moved since the last."""
        job = self.job
        if job.bytelog is None:
            return
        with job.lock:
            if self._cumulative() == self._checkpointed:
                return

        def snapshot() -> CountedBytes:
            self._checkpointed = self._cumulative()
            return self._checkpointed

        job.bytelog.checkpoint(snapshot)

    def flush_journal(self) -> None:
        job, files = self.job, self.job.files
        if files is None or files.store.placed:
            return
        if not job.journal_dirty.is_set():
            return
        job.journal_dirty.clear()
        with files.tracker.cond:
            verified = {i for i, v in enumerate(files.tracker.verified) if v}
        offsets = [job.first_missing(s) for s in range(files.stripes)]
        try:
            with files.store.lock:  # placement removes the staging dir under the same lock
                if files.store.placed:
                    return
                files.store.fsync()  # data first: a journaled chunk must survive a crash
                files.store.journal.save(
                    JournalState(files.manifest.digest, verified, offsets),
                    files.manifest.num_chunks,
                )
        except (OSError, StorageError) as exc:
            if is_no_space(exc):  # no room even for the journal: the job stops here
                job.out_of_space(f"journal of {job.model}/{job.version}: {exc}")
                return
            job.journal_dirty.set()
            log.warning("journal flush failed: %s", exc)


__all__ = ["ControlPlane"]
