"""Handoff: the sweeper's rules and the DistributionComplete event.

Every tick: fail a job whose every pending host gave up, splice out hosts that stopped
reporting, demote persistently slow hosts to leaves, and once enough hosts are READY (the
job's threshold) or the deadline passed, tell the deployer (webhook, retried) and mark the
job COMPLETE; DONE once every target is READY and the event was delivered.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import urllib.request

from relgate_agent.contracts import HostRow
from relgate_agent.coordinator.jobstate import TERMINAL_STATES, Completion, HostProgress, JobState
from relgate_agent.coordinator.progress import ProgressService
from relgate_agent.coordinator.topology import append_host, splice
from relgate_agent.errors import KIND_HOST_FAILED
from relgate_agent.retry import Backoff, retry_call

log = logging.getLogger(__name__)

WEBHOOK_RETRY = Backoff(0.5)  # 0.5 s, 1 s, 2 s, 4 s between the five attempts
WEBHOOK_ATTEMPTS = 5
MIN_RATES_FOR_SLOWNESS = 3  # moving hosts needed before "slow vs the median" means anything
PPM = 1_000_000


def http_post(url: str, body: bytes) -> None:
    req = urllib.request.Request(  # noqa: S310 - the operator's webhook URL (http/https)
        url, data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    with urllib.request.urlopen(req, timeout=10) as resp:  # noqa: S310 - as above
        resp.read()


class HandoffService(ProgressService):
    def tick(self) -> None:
        """Dead-host detection, ready-threshold / deadline handoff, DONE transition."""
        emit: list[tuple[str, Completion]] = []
        with self.lock:
            if not self.leader:
                return
            now = self.clock()
            for job in list(self.jobs.values()):
                if job.state in TERMINAL_STATES:
                    continue  # a FAILED job stays in memory so GetJob shows its errors
                if self._all_pending_failed(job):
                    continue
                for h in list(job.topology.racks):
                    hp = job.hosts.get(h)
                    # a host holding its watch stream open is alive (its process and its
                    # connection are; a killed agent's stream ends at once): a late report
                    # from a busy coordinator's queue never splices it. A hung host is
                    # caught by its downstreams (ReportSuspect) instead.
                    if (
                        hp
                        and now - hp.last_seen > self.config.dead_after_s
                        and not self.watching.get(h)
                    ):
                        self._mark_dead(job, h, f"no report for {now - hp.last_seen:.1f}s")
                self._demote_slow(job, now)
                completion = self._completion(job)
                if completion is not None:
                    emit.append((job.spec.webhook_url, completion))
                if job.targets and job.ready_count == len(job.targets) and job.completion_emitted:
                    job.state = "DONE"
                    self.store.save_figures(job.job_id, self._figures(job))
                    self.store.update_job(job.job_id, state="DONE")
                    del self.jobs[job.job_id]
                    self.changed.notify_all()
        for url, payload in emit:
            threading.Thread(target=self._emit, args=(url, payload), daemon=True).start()

    def _host_rows(self, job: JobState) -> tuple[HostRow, ...]:
        n = job.manifest.num_chunks
        return tuple(
            HostRow(
                host_id=hp.host_id,
                rack=hp.rack,
                state=hp.state,
                chunks_verified=n if hp.ready else hp.verified,
                rx_bytes=hp.rx,
                tx_bytes=hp.tx,
                origin_bytes=hp.origin,
                rx_bytes_per_s=hp.rx_bps,
                errors=tuple(hp.errors),
                health=self.health.get(hp.host_id, ("", 0))[0],
                data_refusals=self.health.get(hp.host_id, ("", 0))[1],
            )
            for hp in sorted(job.hosts.values(), key=lambda x: x.host_id)
        )

    def _figures(self, job: JobState) -> dict[str, object]:
        """What GetJob keeps reporting after the job left memory (frozen at completion)."""
        return {
            "bytes_moved": sum(hp.rx for hp in job.hosts.values()),
            "origin_bytes": sum(hp.origin for hp in job.hosts.values()),
            "checkpoint_bytes": job.manifest.total_size,
            "hosts_ready": job.ready_count,
            "duration_s": round(time.time() - job.created_at, 3),
            "stragglers": sorted(h for h in job.targets if h not in job.ready),
            "hosts": [row.to_stored() for row in self._host_rows(job)],
        }

    def _all_pending_failed(self, job: JobState) -> bool:
        """Every host still pending gave up (HOST_FAILED): the job FAILED, naming each."""
        pending = [h for h in job.targets if h not in job.ready and h in job.hosts]
        if not pending or not all(job.hosts[h].state == "FAILED" for h in pending):
            return False
        last = {h: _last_host_failed(job.hosts[h]) for h in pending}
        self._fail_job(job, "; ".join(f"{h}: {e}" for h, e in sorted(last.items())))
        return True

    def _completion(self, job: JobState) -> Completion | None:
        """The DistributionComplete event, once (threshold reached or deadline passed)."""
        ready, total = job.ready_count, len(job.targets)
        threshold = job.spec.ready_threshold_ppm
        deadline = job.spec.deadline_s
        reached = total > 0 and ready * PPM >= threshold * total
        late = deadline > 0 and time.time() - job.created_at >= deadline
        if not (reached or late) or job.completion_emitted or job.completion is not None:
            return None
        job.completion = Completion(
            job=job.job_id,
            model=job.manifest.model,
            version=job.manifest.version,
            manifest_digest=job.manifest.digest,
            ready_hosts=tuple(sorted(job.ready)),
            hosts_total=total,
            reason="threshold" if reached else "deadline",
        )
        if job.state == "DISTRIBUTING":
            job.state = "COMPLETE"
            self.store.update_job(job.job_id, state="COMPLETE")
        return job.completion

    def _demote_slow(self, job: JobState, now: float) -> None:
        """Slowness counts as failure: a persistently slow host becomes a leaf at its rack tail."""
        moving = [
            hp
            for h, hp in job.hosts.items()
            if h in job.topology.racks and not hp.ready and hp.state == "TRANSFERRING"
        ]
        rates = sorted(hp.rx_bps for hp in moving if hp.rx_bps > 0)
        if len(rates) < MIN_RATES_FOR_SLOWNESS:
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

    def _emit(self, url: str, completion: Completion) -> None:
        body = json.dumps(completion.to_json(), sort_keys=True).encode()
        if url:

            def failed(exc: BaseException, attempt: int) -> None:
                log.warning("DistributionComplete to %s failed (attempt %d): %s", url, attempt, exc)

            try:
                retry_call(
                    lambda: self._post(url, body),
                    retry_on=OSError,
                    backoff=WEBHOOK_RETRY,
                    attempts=WEBHOOK_ATTEMPTS,
                    on_retry=failed,
                )
            except OSError as exc:
                failed(exc, WEBHOOK_ATTEMPTS)
        with self.lock:
            job = self.jobs.get(completion.job)
            if job is not None:
                job.completion_emitted = True
            self.store.update_job(completion.job, completion_emitted=True)
        log.info("DistributionComplete %s", body.decode())


def _last_host_failed(hp: HostProgress) -> str:
    return next((e for e in reversed(hp.errors) if e.startswith(KIND_HOST_FAILED)), "")


__all__ = ["HandoffService", "http_post"]
