"""Handoff: the sweeper's rules and the deployer's events.

Every tick: fail a job whose every pending host gave up, splice out hosts that stopped
reporting, demote persistently slow hosts to leaves, and once enough hosts are READY (the
job's threshold) or the deadline passed, put a DistributionComplete in the outbox and mark
the job COMPLETE; hosts READY after that go out as HostsReady events. DONE once every target
is READY and announced. A delivery thread POSTs the outbox (:mod:`.outbox`) until each event
is acknowledged; ``completion_emitted`` says the DistributionComplete was (2xx).
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

from relgate_trust.retry import Backoff

from relgate_agent.contracts import HostRow, RemovedHost
from relgate_agent.coordinator import removal, slowclock, tally
from relgate_agent.coordinator.attest import attestations_for
from relgate_agent.coordinator.budget import rebalance_origins
from relgate_agent.coordinator.failover import dead_limit, in_grace, stopped_reporting
from relgate_agent.coordinator.jobstate import (
    ACTIVE_STATES,
    TERMINAL_STATES,
    Completion,
    CoordinatorConfig,
    HostProgress,
    HostsReady,
    JobState,
    NotLeader,
)
from relgate_agent.coordinator.ledger import HostBytes
from relgate_agent.coordinator.metrics import SPLICE_DEMOTED
from relgate_agent.coordinator.outbox import (
    EVENT_COMPLETE,
    EVENT_HOSTS_READY,
    POST_TIMEOUT_S,
    OutboxSender,
    Post,
    outbox_row,
)
from relgate_agent.coordinator.progress import ProgressService
from relgate_agent.coordinator.slowness import (
    held_reference,
    judge,
    stripe_floor,
    stripe_median,
    total_rate_median,
    victims,
)
from relgate_agent.coordinator.store import OutboxRow
from relgate_agent.errors import KIND_HOST_FAILED

log = logging.getLogger(__name__)

MIN_RATES_FOR_SLOWNESS = 3  # moving hosts needed before "slow vs the median" means anything
PPM = 1_000_000
OUTBOX_POLL_S = 1.0  # the delivery thread looks at leadership / shutdown at least this often
SLOW_GRACE_S = 3.0  # not slow this long before a slow host's clock restarts

# per job, the byte counters a tick writes after the lock
_Counters = list[tuple[str, dict[str, HostBytes]]]
# one phase of a job's sweep (HandoffService.tick): whether the next phase runs this tick
_Phase = Callable[[JobState, float, _Counters], bool]


class HandoffService(ProgressService):
    def __init__(
        self,
        config: CoordinatorConfig,
        post: Post,
        clock: Callable[[], float],
        wall: Callable[[], float] = time.time,
    ) -> None:
        self._outbox_wake = threading.Event()
        self._outbox_hint = True  # there may be pending events (set on enqueue, on leading)
        self._outbox_thread: threading.Thread | None = None
        super().__init__(config, post, clock, wall)
        self.outbox = OutboxSender(
            self.store,
            post,
            Backoff(config.webhook_backoff_s, max_s=config.webhook_backoff_max_s),
            self._delivered,
        )

    def _become_leader(self, epoch: int) -> None:
        super()._become_leader(epoch)
        self._outbox_hint = True  # resume what the last leader (or run) left undelivered

    def release(self) -> None:
        """Shutting down (``closing`` set): let the delivery thread finish its POST, then go."""
        self._outbox_wake.set()
        if self._outbox_thread is not None:
            self._outbox_thread.join(timeout=POST_TIMEOUT_S + OUTBOX_POLL_S)
        super().release()

    def close(self) -> None:
        """Stop as the server does: no more delivery, lease released, store closed."""
        with self.lock:
            self.closing = True
            self.changed.notify_all()
        self.release()
        self.store.close()

    def tick(self) -> None:
        """Dead-host detection, ready-threshold / deadline handoff, DONE transition.

        One hold of the lock, in phases per job (:meth:`_tick_phases`); between two, the
        reports that queued for the lock are applied (``apply_waiting``): a report waits
        for a phase, not for the whole sweep (~140 ms at 4,096 hosts)."""
        counters: _Counters = []  # written after the lock
        self.tick_applied_s = 0.0
        with self.lock:
            if not self.leader:
                return
            now = self.clock()
            for job in list(self.jobs.values()):
                for phase in self._tick_phases():
                    # a report applied between phases may end the job (a chunk that failed
                    # everywhere), and a lapsed lease ends the sweep
                    if not self.leader or self.jobs.get(job.job_id) is not job:
                        break
                    if job.state in TERMINAL_STATES:
                        break  # a FAILED job stays in memory so GetJob shows its errors
                    if not phase(job, now, counters):
                        break
                    self._let_waiting_in()
            # one budget per origin across its jobs: the roots' shares, in their report replies
            rebalance_origins(self.jobs.values(), now, self.config.report_interval_s)
        for job_id, rows in counters:  # thousands of rows: never under the coordinator lock
            if self.leader:
                self.ledger.put_bytes(job_id, rows)
        if self.leader:
            self.refresh_watching()  # an open watch keeps its host live
            self.flush_last_seen()  # the heartbeats' batched last_seen, one transaction
        self._kick_outbox()

    def _let_waiting_in(self) -> None:
        """The reports queued for the lock, applied now (the tick holds it); their time
        is not the sweep's own (``tick_applied_s``: the sweeper's pace leaves it out)."""
        started = time.perf_counter()
        if self.apply_waiting():
            self.tick_applied_s += time.perf_counter() - started

    def _tick_phases(self) -> tuple[_Phase, ...]:
        """A job's sweep, in order; each says whether the next runs in this tick."""
        return (self._tick_dead, self._tick_slow, self._tick_tally, self._tick_end)

    def _tick_dead(self, job: JobState, now: float, counters: _Counters) -> bool:
        """Hosts silent too long spliced (one topology version for them all), lost ones
        removed; a job with no target left FAILED."""
        if self._all_pending_failed(job):
            return False
        silent = self._silent(job, now)
        self._mark_dead_all(job, self._unless_mass_silence(job, silent, now))
        removal.sweep_dead(self, job, now)  # a lost host never holds the job
        if job.targets and not job.eligible:  # every target removed or quarantined
            self._fail_job(job, f"no target left: {removal.removed_text(job)}")
            return False
        return True

    def _tick_slow(self, job: JobState, now: float, counters: _Counters) -> bool:
        # rates across a takeover are its own; a judgment needs a round of new rates
        if not in_grace(job, now, self.config) and _rates_due(job):
            self._demote_slow(job, now)
        return True

    def _tick_tally(self, job: JobState, now: float, counters: _Counters) -> bool:
        counters.append((job.job_id, tally.due(job, now)))
        if job.tally_saved_at == now:  # a full pass, every SAVE_INTERVAL_S: the
            # sticky straggler list refreshed between GetJobs (30 ms at 4,096 hosts)
            tally.stragglers(job, now, self.config.remove_dead_after_s)
        return True

    def _tick_end(self, job: JobState, now: float, counters: _Counters) -> bool:
        """Deployer events enqueued; a job whose every target is READY (and told) DONE."""
        self._announce(job)
        if self._finished(job):
            job.state = "DONE"
            tally.save(self.ledger, job, now, hosts=tuple(job.hosts))
            self.store.save_figures(job.job_id, self._figures(job))
            self.store.update_job(job.job_id, state="DONE")
            del self.jobs[job.job_id]
            self.changed.notify_all()
        return False

    def _silent(self, job: JobState, now: float) -> dict[str, str]:
        """Hosts of the chains this leader has not heard from for too long -> why."""
        dead: dict[str, str] = {}
        for h in list(job.topology.racks):
            hp = job.hosts.get(h)
            # a host holding its watch stream open is alive (its process and its
            # connection are; a killed agent's stream ends at once): a late report
            # from a busy coordinator's queue never splices it. A hung host is
            # caught by its downstreams (ReportSuspect) instead.
            if not hp or self.watching.get(h):
                continue
            # a host this leader never heard from is judged only after the
            # takeover's grace (failover.py): its reports may be stuck on the old one
            heard = self._heard(h, hp)
            if now - heard > dead_limit(hp, job, self.config):
                dead[h] = (
                    f"no report for {now - heard:.1f}s"
                    if hp.reported or job.resumed_at is None
                    else f"no report since the takeover {now - heard:.1f}s ago"
                )
        return dead

    def _heard(self, h: str, hp: HostProgress) -> float:
        """When this leader last heard from ``h``: a report, or its watch ending."""
        return max(hp.last_seen, self.watch_ended.get(h, hp.last_seen))

    def _unless_mass_silence(
        self, job: JobState, silent: dict[str, str], now: float
    ) -> dict[str, str]:
        """``silent``, unless so many went silent together that the coordinator or the
        network is the likelier cause than that many hosts dying (an overloaded coordinator
        whose reports queue past --dead-after, a partition): more than
        ``mass_silence_fraction`` of the chain hosts (and MASS_SILENCE_MIN) silent now or
        spliced as dead within the last MASS_SILENCE_WINDOW x --dead-after (a cascade comes
        in waves, each under the limit) holds the splices (splicing healthy hosts is a new
        topology for every host: more load, more silence). Held, a host is spliced only
        once silent MASS_SILENCE_PATIENCE x --dead-after (a host that really died, when the
        silence does not clear); a hung one is caught by its downstreams meanwhile."""
        dead_after = self.config.dead_after_s
        window = MASS_SILENCE_WINDOW * dead_after
        job.recent_dead = [(t, n) for t, n in job.recent_dead if now - t <= window]
        new = [h for h in silent if job.hosts[h].state != "DEAD"]
        limit = max(MASS_SILENCE_MIN, self.config.mass_silence_fraction * len(job.topology.racks))
        together = len(new) + sum(n for _, n in job.recent_dead)
        if together <= limit:
            job.mass_silence = 0
            if new:
                job.recent_dead.append((now, len(new)))
            return silent
        if job.mass_silence == 0:  # once per episode, not per sweep
            log.warning(
                "job %s: %d of %d hosts silent or spliced within %.0f s (> %.0f): a mass "
                "silence, splicing only hosts silent %.0f s (the coordinator's backlog or "
                "the network, more likely than that many deaths)",
                job.job_id,
                together,
                len(job.topology.racks),
                window,
                limit,
                MASS_SILENCE_PATIENCE * dead_after,
            )
        job.mass_silence = together
        patience = MASS_SILENCE_PATIENCE * dead_after
        gone = {h: silent[h] for h in new if now - self._heard(h, job.hosts[h]) > patience}
        self.metrics.splices_held.inc(len(new) - len(gone))
        if gone:
            job.recent_dead.append((now, len(gone)))
        return gone

    @staticmethod
    def _finished(job: JobState) -> bool:
        """Every remaining target READY, and it and every removed one named in an event in
        the outbox (delivery goes on after)."""
        wanted = job.eligible  # a quarantined host is reported, never waited for
        told = {_removed_mark(h) for h in job.removed} | {_removed_mark(h) for h in job.quarantined}
        return bool(wanted) and wanted <= job.ready and (wanted | told) <= job.announced

    # ------------------------------------------------------------------ deployer events
    def _announce(self, job: JobState) -> None:
        """The DistributionComplete once, then HostsReady for the hosts READY since, or for
        targets removed since (every event names every removed target so far)."""
        completion = self._completion(job)
        gone = removal.removed_hosts(job)
        if completion is not None:
            self._enqueue(job, EVENT_COMPLETE, completion.to_json(), completion.ready_hosts, gone)
            job.completion_enqueued = True
            return
        late = sorted((job.ready & job.eligible) - job.announced)
        untold = [r for r in gone if _removed_mark(r.host_id) not in job.announced]
        if not job.completion_enqueued or not (late or untold):
            return
        event = HostsReady(
            job=job.job_id,
            model=job.manifest.model,
            version=job.manifest.version,
            manifest_digest=job.manifest.digest,
            ready_hosts=tuple(late),
            hosts_total=len(job.targets),
            removed_hosts=gone,
            hosts_ready=job.ready_count,
        )
        self._enqueue(job, EVENT_HOSTS_READY, event.to_json(), event.ready_hosts, tuple(untold))

    def _enqueue(
        self,
        job: JobState,
        kind: str,
        payload: dict[str, object],
        ready: tuple[str, ...],
        removed: tuple[RemovedHost, ...],
    ) -> None:
        # the READY hosts' signed placement attestations, and the coordinator's signature;
        # the event is named by (and announces) its READY hosts and the removals it tells
        payload = {**payload, "attestations": attestations_for(self.store, job, ready)}
        hosts = (*ready, *(_removed_mark(r.host_id) for r in removed))
        row = outbox_row(job.job_id, kind, job.spec.webhook_url, hosts, payload, seal=self._seal())
        self.store.enqueue_event(row, int(time.time() * 1000))
        job.announced.update(hosts)
        log.info("job %s: %s %s enqueued (%d hosts)", job.job_id, kind, row.event_id, len(hosts))
        if row.delivered_at_ms:  # no webhook: nobody to tell
            self._delivered(row)
        else:
            self._outbox_hint = True
            self._outbox_wake.set()

    def _delivered(self, row: OutboxRow) -> None:
        if row.kind != EVENT_COMPLETE:
            return
        with self.lock:
            job = self.jobs.get(row.job_id)
            if job is not None:
                job.completion_emitted = True
            if job is not None or self.shard is None:  # sharded: the job's leader writes it
                self.store.update_job(row.job_id, completion_emitted=True)

    def _delivers(self, job_id: str) -> bool:
        """This replica posts ``job_id``'s events: always unsharded; sharded, while it
        leads the job, or once the job finished (its lease released: any replica may;
        the deployer sees one Idempotency-Key per event)."""
        if self.shard is None or job_id in self.jobs:
            return True
        return job_id not in self.shard.epochs and self.store.job_state(job_id) not in ACTIVE_STATES

    def _kick_outbox(self) -> None:
        """Start the delivery thread when events may be pending and none runs."""
        running = self._outbox_thread is not None and self._outbox_thread.is_alive()
        if running or not self._outbox_hint or not self.leader or self.closing:
            return
        self._outbox_thread = threading.Thread(
            target=self._deliver_outbox, name="coordinator-outbox", daemon=True
        )
        self._outbox_thread.start()

    def _deliver_outbox(self) -> None:
        """Deliver until nothing is pending, waiting out each retry's backoff; stops when
        this replica no longer leads or shuts down (the next leader resumes)."""

        def keep_going() -> bool:
            return self.leader and not self.closing

        while keep_going():
            self._outbox_hint = False
            self._outbox_wake.clear()
            try:
                wait_s = self.outbox.deliver_due(keep_going, self._delivers)
            except NotLeader as exc:  # a refusal: the next leader resumes from the rows
                log.warning("outbox delivery stopped: %s", exc)
                return
            except Exception as exc:  # the store or a bug: log, and let the next tick retry
                log.exception("outbox delivery failed (%s)", type(exc).__name__)
                self._outbox_hint = True
                return
            if wait_s is None and not self._outbox_wake.is_set():
                return
            self._outbox_wake.wait(min(wait_s or 0.0, OUTBOX_POLL_S))

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
                bypassed_stripes=hp.bypassed,
            )
            for hp in sorted(job.hosts.values(), key=lambda x: x.host_id)
        )

    def _figures(self, job: JobState) -> dict[str, object]:
        """What GetJob keeps reporting after the job left memory (frozen at completion)."""
        now = self.clock()
        reasons = tally.stragglers(job, now, self.config.remove_dead_after_s)
        return {
            "bytes_moved": tally.bytes_moved(job),
            "origin_bytes": tally.origin_bytes(job),
            "checkpoint_bytes": job.manifest.total_size,
            "hosts_ready": job.ready_count,
            "duration_s": round(time.time() - job.created_at, 3),
            "stragglers": sorted(h for h in job.eligible if h not in job.ready),
            "straggler_reasons": [r.to_stored() for r in reasons],
            "removed": [r.to_stored() for r in removal.removed_hosts(job)],
            "placed_hosts": sorted(job.ready & set(job.targets)),
            "quarantined": sorted(job.quarantined),
            "hosts": [row.to_stored() for row in self._host_rows(job)],
        }

    def _all_pending_failed(self, job: JobState) -> bool:
        """Every host still pending gave up (HOST_FAILED): the job FAILED, naming each."""
        pending = [h for h in job.eligible if h not in job.ready and h in job.hosts]
        if not pending or not all(job.hosts[h].state == "FAILED" for h in pending):
            return False
        last = {h: _last_host_failed(job.hosts[h]) for h in pending}
        self._fail_job(job, "; ".join(f"{h}: {e}" for h, e in sorted(last.items())))
        return True

    def _completion(self, job: JobState) -> Completion | None:
        """The DistributionComplete event, once (threshold reached or deadline passed)."""
        eligible = job.eligible
        ready, total = len(job.ready & eligible), len(eligible)
        threshold = job.spec.ready_threshold_ppm
        deadline = job.spec.deadline_s
        reached = total > 0 and ready * PPM >= threshold * total
        late = deadline > 0 and time.time() - job.created_at >= deadline
        if not (reached or late) or job.completion_enqueued or job.completion is not None:
            return None
        job.completion = Completion(
            job=job.job_id,
            model=job.manifest.model,
            version=job.manifest.version,
            manifest_digest=job.manifest.digest,
            ready_hosts=tuple(sorted(job.ready)),
            hosts_total=len(job.targets),
            reason="threshold" if reached else "deadline",
            quarantined_hosts=tuple(sorted(job.quarantined)),
            removed_hosts=removal.removed_hosts(job),
        )
        if job.state == "DISTRIBUTING":
            job.state = "COMPLETE"
            self.store.update_job(job.job_id, state="COMPLETE")
        return job.completion

    def _slow_hosts(self, job: JobState, now: float) -> dict[str, str]:
        """Host -> why it is slow (per stripe when the agents report per-stripe rates)."""
        cfg = self.config
        # a demoted host is a leaf already judged: behind its new upstream it is as slow as
        # before, and counting that as evidence blamed each upstream it was hung from next
        # in turn (the chaos lab's 30 %-NIC host demoted 5 healthy upstreams, 11 hosts in all)
        moving = {
            h: hp
            for h, hp in job.hosts.items()
            if h in job.topology.racks
            and not hp.ready
            and not hp.demoted
            and hp.state == "TRANSFERRING"
        }
        per_stripe = {h: hp.stripe_rx_bps for h, hp in moving.items() if hp.stripe_rx_bps}
        if per_stripe:
            silent = self._silent_uploaders(job, now)
            totals = {h: hp.rx_bps for h, hp in moving.items()}
            # the reference rates: this round's medians, or the peak held so far (decaying)
            # when they are lower: the victims of a slow host drag the medians down with it
            current = self._fleet_medians(job, per_stripe, totals)
            elapsed = now - job.rate_reference_at if job.rate_reference_at is not None else 0.0
            job.rate_reference = held_reference(job.rate_reference, current, elapsed)
            job.rate_reference_at = now
            v = judge(
                per_stripe,
                totals,
                [c.parent for c in job.topology.stripes],
                cfg.slow_fraction,
                cfg.slow_min_median_bps,
                self._history(job, moving, silent),
                job.rate_reference,
                # every host that sent this leader rates (READY ones serve too): the
                # accused's own; a host only registered with it has sent none, not 0 B/s
                {h: hp.tx_bps for h, hp in job.hosts.items() if hp.rates_since is not None},
                silent | {h for h, hp in job.hosts.items() if hp.demoted},
            )
            for h, hp in moving.items():  # evidence lasts while the host stays slow
                hp.slow_with = v.slow_with.get(h, frozenset())
            for h in v.tx_slow:  # whose own lag its demotion would rest on (see _history)
                kids = v.behind.get(h, frozenset())
                alone = h in v.tied or (h in v.saturated and len(kids) == 1)
                job.hosts[h].accused_by = kids if alone else frozenset()
            ref_total = job.rate_reference[1] if job.rate_reference else 0
            out = {
                h: (
                    f"rx {totals.get(h, 0)} B/s < {cfg.slow_fraction} x {ref_total} B/s, "
                    f"behind {', '.join(sorted(v.slow_with.get(h, ())))} that send well"
                )
                for h in v.rx_slow
            }
            for h in v.tx_slow:
                out[h] = (
                    f"tx: {', '.join(sorted(v.behind.get(h, ())))} fall behind it "
                    f"(< {cfg.slow_fraction} x its rate, median {v.median} B/s per stripe) "
                    + (
                        "and no other upstream feeds them (a tie blames the upstream)"
                        if h in v.tied
                        else f"and it sends only {job.hosts[h].tx_bps} B/s itself"
                        if h in v.saturated
                        else "and receive well from other upstreams"
                    )
                )
            return out
        # agents that report only their total receive rate: compare it with the fleet median
        rates = sorted(hp.rx_bps for hp in moving.values() if hp.rx_bps > 0)
        if len(rates) < MIN_RATES_FOR_SLOWNESS:
            return {}
        median = rates[len(rates) // 2]
        if median < cfg.slow_min_median_bps:
            return {}
        return {
            h: f"rx {hp.rx_bps} B/s < {cfg.slow_fraction} x median {median} B/s"
            for h, hp in moving.items()
            if hp.rx_bps < cfg.slow_fraction * median
        }

    def _fleet_medians(
        self, job: JobState, per_stripe: dict[str, tuple[int, ...]], totals: dict[str, int]
    ) -> tuple[int, int]:
        """This round's (per-stripe, total) medians over the hosts no judged-slow host
        holds: a stripe's rate behind a host on a slow clock is that host's pace, and a
        host held in any stripe leaves the total's median."""
        parents = [c.parent for c in job.topology.stripes]
        slow = {h for h, hp in job.hosts.items() if hp.slow_since is not None and not hp.demoted}
        held = victims(parents, slow) if slow else [set() for _ in parents]
        anywhere = set().union(*held)
        free = dict(per_stripe)  # only a held host's rates change (once a second, 4,096)
        for h in anywhere & free.keys():
            free[h] = tuple(0 if h in held[s] else r for s, r in enumerate(free[h]))
        return (
            stripe_median(free, stripe_floor(self.config.slow_min_median_bps, parents)),
            total_rate_median(
                {h: rs for h, rs in free.items() if h not in anywhere},
                {h: t for h, t in totals.items() if h not in anywhere},
            ),
        )

    def _silent_uploaders(self, job: JobState, now: float) -> set[str]:
        """Hosts silent to this leader (no rates yet, or no report for two intervals): a
        dead or frozen host starves its children, which is the dead-host sweep's to judge,
        not slowness. Their hops, like a demoted leaf's, are no evidence (judge's
        ``unjudged``)."""
        return {
            h
            for h, hp in job.hosts.items()
            if (hp.rates_since is None and not hp.ready) or stopped_reporting(hp, now, self.config)
        }

    @staticmethod
    def _history(
        job: JobState, moving: dict[str, HostProgress], silent: set[str]
    ) -> dict[str, frozenset[str]]:
        """Each moving host's witnesses of the last rounds that still witness: not a silent
        host, nor one demoted on evidence that explains the lag (a victim's lag behind it
        is explained: the chaos lab's h03 was demoted as "behind h06, h15" after h06 was;
        with two accusers, or one that receives well elsewhere, the tx-slow h10's victim
        h14 was demoted "behind h06, h10, h11" in the fairness bench). An upstream demoted
        on this host's lag alone (a tie, or its own rates with this one child behind it)
        stays: lagging the next one is the second witness that makes it the suspect
        (demoted upstreams dropped, a 30 %-NIC host demoted the 13 hosts it was hung from
        in turn in the simulator)."""

        def witnesses(h: str, up: str) -> bool:
            u = job.hosts.get(up)
            return up not in silent and (u is None or not u.demoted or h in u.accused_by)

        # most hosts have no witness: no generator and set built for them (4,096 a judgment)
        return {
            h: frozenset(u for u in hp.slow_with if witnesses(h, u)) if hp.slow_with else NONE
            for h, hp in moving.items()
        }

    def _demote_slow(self, job: JobState, now: float) -> None:
        """Slowness counts as failure, in both directions: a host slow for ``slow_after_s``
        (receiving, or feeding its downstreams) becomes a leaf at its rack tail."""
        slow = self._slow_hosts(job, now)  # the judgment: most of the phase's time
        self._let_waiting_in()  # the reports queued meanwhile, before its verdicts apply
        if job.state in TERMINAL_STATES:  # one of them ended the job
            return
        for h, hp in job.hosts.items():
            why = slow.get(h)
            if hp.demoted or h not in job.topology.racks:
                hp.slow_since = hp.fast_since = None
                continue
            if why is None:
                hp.slow_credit = 0.0  # seen fast by this leader: an old clock is void
                # one fast round is not recovery (1 s rates are noisy): the clock restarts
                # only after SLOW_GRACE_S without slowness
                if hp.slow_since is not None and hp.fast_since is None:
                    hp.fast_since = now
                if hp.fast_since is None or now - hp.fast_since >= SLOW_GRACE_S:
                    hp.slow_since = hp.fast_since = None
                continue
            hp.fast_since = None
            if hp.slow_since is None:
                # a previous leader's watched slowness counts (slowclock.restore)
                hp.slow_since, hp.slow_credit = now - hp.slow_credit, 0.0
                continue
            if now - hp.slow_since < self.config.slow_after_s:
                continue
            idx = self._index(job)
            if not any(idx.downstreams(s, h) for s in range(job.stripes)):
                hp.demoted = True  # already a leaf everywhere: nobody waits behind it
                continue
            log.warning("job %s: demoting slow host %s (%s)", job.job_id, h, why)
            hp.errors.append(f"DEMOTED {why}")
            hp.demoted = True
            self._set_topology(job, self._append(job, self._splice(job, h), h, hp.rack))
            self.metrics.splices.labels(SPLICE_DEMOTED).inc()
        slowclock.save(self.store, job, now, self.wall())


MASS_SILENCE_MIN = 8  # fewer silent hosts at once are never a mass silence
MASS_SILENCE_WINDOW = 2.0  # x --dead-after: splices this recent count with the silent
MASS_SILENCE_PATIENCE = 5.0  # x --dead-after: held, a host this long silent is spliced


NONE: frozenset[str] = frozenset()


def _rates_due(job: JobState) -> bool:
    """Slowness is judged on a round of rates, not on every sweep: once at least half the
    hosts that send rates sent new ones since the last judgment (4,096 hosts reporting
    every 2 s and a sweep every 0.5 s: every other sweep, not four judgments of mostly
    the same rates; a report round before each sweep, as in the tests: every sweep). The
    dead and the removed send none and do not count."""
    senders = sum(
        1
        for hp in job.hosts.values()
        if hp.rates_since is not None and not hp.removed and hp.state != "DEAD"
    )
    if len(job.fresh_rates) * 2 < senders:
        return False
    job.fresh_rates.clear()
    return True


def _removed_mark(host: str) -> str:
    """How an event's outbox row names a removal it tells (announced, and the event id)."""
    return f"removed:{host}"


def _last_host_failed(hp: HostProgress) -> str:
    return next((e for e in reversed(hp.errors) if e.startswith(KIND_HOST_FAILED)), "")


__all__ = ["HandoffService"]
