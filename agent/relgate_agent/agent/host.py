"""The per-host daemon: data-plane server plus one watch stream for this host's jobs and
their stripe assignments (pushed by the coordinator)."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import socket
import threading
import time
from collections.abc import Collection
from typing import Any

import grpc
from relgate_trust.retry import Backoff, retry_call

from relgate_agent.agent import bytelog
from relgate_agent.agent.exporter import AgentExporter
from relgate_agent.agent.job import AgentConfig, JobState
from relgate_agent.agent.renew import CertRenewer
from relgate_agent.agent.replicas import ReplicaWatches
from relgate_agent.agent.revocations import RevocationPoller
from relgate_agent.agent.runner import JobRunner
from relgate_agent.attestation import CertSigner
from relgate_agent.contracts import priority_rank
from relgate_agent.dataplane.pacing import TokenBucket
from relgate_agent.dataplane.transport import (
    OP_STREAM_STRIPE,
    BlockSource,
    DataPlaneLimits,
    DataServer,
)
from relgate_agent.identity.authz import chunk_refusal, stripe_refusal, topology_skew
from relgate_agent.pki import (
    ROLE_HOST,
    Identity,
    PkiError,
    TlsFiles,
    data_client_context,
    data_server_context,
)
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg
from relgate_agent.reportstream import Duplex, ReportRouter
from relgate_agent.rpc import FailoverStub
from relgate_agent.staging import direct
from relgate_agent.staging.direct import DIRECT
from relgate_agent.staging.storage import held_versions

log = logging.getLogger(__name__)
ENDED_JOBS_KEPT = 32  # ended jobs whose figures the exporter still serves

WATCH_RETRY = Backoff(0.2, 2.0)  # coordinator unreachable: back off to 2 s
UNREACHABLE_LOG_S = 10.0  # while no leader answers, say so at most this often


def _member(peer: Identity | None, members: Collection[str]) -> bool:
    return peer is not None and peer.name in members


class LeaderReach:
    """Whether a coordinator leader answers this agent's watch, logged (rate-limited):
    the first failure, then at most every ``every_s`` while it lasts, and the recovery."""

    def __init__(self, every_s: float = UNREACHABLE_LOG_S) -> None:
        self.every_s = every_s
        self.since: float | None = None  # monotonic time of the first failure in a row
        self.failures = 0
        self.logged_at = 0.0

    def failed(self, exc: BaseException, now: float | None = None) -> bool:
        """One more failed attempt; True when it was logged."""
        now = time.monotonic() if now is None else now
        if self.since is None:
            self.since, self.logged_at = now, now - self.every_s
        self.failures += 1
        if now - self.logged_at < self.every_s:
            return False
        self.logged_at = now
        code = exc.code() if isinstance(exc, grpc.RpcError) else None
        log.warning(
            "cannot reach a coordinator leader for %.0fs (%d attempts): %s %s",
            now - self.since,
            self.failures,
            getattr(code, "name", type(exc).__name__),
            (exc.details() if isinstance(exc, grpc.RpcError) else str(exc))[:200],
        )
        return True

    def ok(self, now: float | None = None) -> None:
        if self.since is not None:
            now = time.monotonic() if now is None else now
            log.warning(
                "coordinator leader reachable again after %.0fs (%d failed attempts)",
                now - self.since,
                self.failures,
            )
        self.since, self.failures = None, 0


class HostAgent:
    def __init__(
        self, config: AgentConfig, *, tls: TlsFiles, limits: DataPlaneLimits | None = None
    ) -> None:
        self.config = config
        ident = tls.identity()
        if ident != Identity(ROLE_HOST, config.host_id, config.rack):
            raise PkiError(
                f"{tls.cert} is for {ident}, not host {config.host_id} in rack {config.rack}",
                check="cert-host",
            )
        # one or more coordinator replicas ("a:7470,b:7470"); calls follow the lease holder
        self.stub: Any = FailoverStub(config.coordinator, pbg.AgentServiceStub, tls)
        self.replicas: ReplicaWatches | None = None
        # one stream; answers to quiet reports (news) go to their job's control plane
        self.reports: Duplex | ReportRouter = Duplex(self.stub, "ReportStream", self.report_news)
        addresses = [a.strip() for a in config.coordinator.split(",") if a.strip()]
        if config.coordinator_sharded and len(addresses) > 1:
            # sharded replicas: a watch and a report stream each (agent/replicas.py)
            self.replicas = ReplicaWatches(self, addresses, tls)
            self.reports = self.replicas.router
        self.stop_event = threading.Event()
        # the coordinator's certificate revocation list, checked by the data plane
        self.crl = RevocationPoller(config.coordinator, tls, config.host_id, self.stop_event)
        # data plane: TLS 1.3 both ways; peers are checked against the current assignment
        self.data_client = data_client_context(tls)
        self.data_server_tls = data_server_context(tls)
        # placement attestations are signed with this host's certificate key
        self.attestor: CertSigner | None = CertSigner.from_tls(tls)
        self.runners: dict[str, JobRunner] = {}
        self.ended: dict[str, JobState] = {}  # forgotten runners' jobs, oldest first
        self.lock = threading.Lock()
        self.reach = LeaderReach()  # logs (rate-limited) while no leader answers
        self.rx_bucket = TokenBucket(config.max_rate_bytes_per_s)
        self.tx_bucket = TokenBucket(config.max_upload_bytes_per_s or config.max_rate_bytes_per_s)
        self.data = DataServer(
            config.listen_host,
            config.listen_port,
            self.lookup,
            self.tx_bucket.take,
            tls=self.data_server_tls,
            authorize=self.authorize,
            limits=limits,
        )
        port = self.data.address.rpartition(":")[2]
        advertise = config.advertise_host or config.listen_host
        if advertise in ("", "0.0.0.0", "::"):  # noqa: S104 - recognising a wildcard, not binding one
            advertise = socket.getfqdn()  # a wildcard bind is not an address peers can dial
        self.data_address = f"{advertise}:{port}"
        self.exporter = AgentExporter(self._jobs, self.data)
        self.metrics_address = ""
        self._watch = threading.Thread(target=self._watch_loop, name="watch", daemon=True)
        self._stats = threading.Thread(target=self._stats_loop, name="data-stats", daemon=True)
        # the open watch calls (either plane: one, or one per replica) and the heartbeat
        # they were opened with: news ends them (reopen_watch_if_changed)
        self.watch_calls: set[Any] = set()
        self._sent_heartbeat: tuple[str, tuple[str, ...]] | None = None
        self._reopening = 0  # watch calls ended by reopen_watch_if_changed, not yet seen
        self.renewer = CertRenewer(
            tls,
            ident,
            config.renew_before_s,
            self.stub,
            self.reload_tls,
            self.stop_event,
            trust_poll_s=config.trust_poll_s,
        )

    def report_news(self, answer: pb.ReportProgressResponse) -> None:
        """The coordinator's news for a quiet report (a report stream's reader thread)."""
        runner = self.runners.get(answer.job_id)  # no host lock: a holder may await a reply
        if runner is not None:
            runner.control.news(answer)

    def reload_tls(self, tls: TlsFiles) -> None:
        """Load ``tls``'s (renewed) certificate and key, or its new CA bundle, without a
        restart: new data-plane contexts for the next handshakes (a fresh one forgets a
        retired CA), new gRPC channels for the next calls, the attestation signer; open
        connections and streams go on (agent/renew.py)."""
        self.data_client = data_client_context(tls)
        self.data_server_tls = self.data.tls = data_server_context(tls)
        self.stub.reload(tls)
        self.reports.reopen()  # its stream presented the old certificate
        if self.replicas is not None:
            self.replicas.reload(tls)
        self.crl.stub.reload(tls)
        self.attestor = CertSigner.from_tls(tls)

    def rx_limit(self, n: int) -> None:
        self.rx_bucket.take(n)

    def authorize(
        self, job_id: str, peer: Identity | None, op: int, stripe: int, topo: int
    ) -> str | None:
        """May ``peer`` have this stripe (a downstream of it now) or chunk (a job peer now)?

        A peer whose topology version is ahead of ours waits (bounded) for our assignment to
        catch up, so a fresh splice does not bounce its first reconnect."""
        with self.lock:
            r = self.runners.get(job_id)
        if r is None:
            return f"refused: job {job_id} is not running here"
        deadline = time.monotonic() + self.data.limits.topology_wait_s
        a = r.job.assignments
        with a.cond:
            while True:
                if op == OP_STREAM_STRIPE:
                    sa = a.by_stripe.get(stripe)
                    # our downstreams, and theirs that may bypass them (bypass.py)
                    downs = (
                        {d.host_id for d in (*sa.downstreams, *sa.standby)}
                        if sa is not None
                        else None
                    )
                    why = stripe_refusal(peer, job_id, stripe, downs, a.topology_version)
                else:
                    why = chunk_refusal(peer, job_id, a.members, a.topology_version)
                if why is None or r.closed:
                    return why
                remaining = deadline - time.monotonic()
                if topo > a.topology_version and remaining > 0:
                    a.cond.wait(remaining)
                    continue
                # a host of the job a moment apart from us (either side may be behind): it
                # asks again once both agree; anyone else keeps the counted refusal
                member = _member(peer, a.members)
                return topology_skew(why, member, topo, a.topology_version, a.floor)

    def outranked(self, job_id: str) -> bool:
        """Another job of higher priority still transfers on this host: ``job_id`` waits
        (its stripe workers pause; serving what it holds goes on)."""
        with self.lock:
            me = self.runners.get(job_id)
            if me is None:
                return False
            return any(
                r.job.rank > me.job.rank and r.transferring
                for j, r in self.runners.items()
                if j != job_id
            )

    def health(self) -> str:
        return self.data.health()

    def data_refusals(self) -> int:
        return self.data.refusals_total

    def _stats_loop(self) -> None:
        """Data-plane counters for operators and tests: <models-root>/.agent-stats/dataplane.json."""
        d = self.config.models_root / ".agent-stats"
        while not self.stop_event.wait(0.5):
            with contextlib.suppress(OSError):  # out of descriptors (EMFILE): next round
                self.reopen_watch_if_changed()
            with contextlib.suppress(OSError):
                d.mkdir(parents=True, exist_ok=True)
                tmp = d / f"dataplane.{os.getpid()}.tmp"
                tmp.write_text(json.dumps({**self.data.counters(), "pid": os.getpid()}))
                os.replace(tmp, d / "dataplane.json")

    def lookup(self, job_id: str) -> BlockSource | None:
        with self.lock:
            r = self.runners.get(job_id)
        return r if r is not None and r.serving else None

    def _jobs(self) -> list[JobState]:
        """Every job this process runs or ran lately (the exporter's view)."""
        with self.lock:
            running = {job_id: r.job for job_id, r in self.runners.items()}
            return [*running.values(), *(j for k, j in self.ended.items() if k not in running)]

    def start(self) -> HostAgent:
        self.config.models_root.mkdir(parents=True, exist_ok=True)
        if self.config.staging_io == DIRECT:  # refused before serving, not at the first job
            direct.probe(self.config.models_root)
        bytelog.drop_stale(self.config.models_root)  # counters of jobs that ended meanwhile
        if self.config.metrics_listen:
            self.metrics_address = self.exporter.endpoint.serve(self.config.metrics_listen)
        self.data.start()
        if self.replicas is not None:
            self.replicas.start()
        else:
            self._watch.start()
            self.stub.warm()  # a takeover finds its connection to the replica open
        self._stats.start()
        self.renewer.start()
        self.crl.start()
        log.info(
            "agent %s (rack %s) data plane on %s",
            self.config.host_id,
            self.config.rack,
            self.data_address,
        )
        return self

    def stop(self) -> None:
        self.stop_event.set()
        with self.lock:
            runners = list(self.runners.values())
        for r in runners:
            r.stop()
        for r in runners:
            r.join(5)
        self.data.stop()
        self.exporter.endpoint.stop()
        self.reports.close()
        if self.replicas is not None:
            self.replicas.close()
        self.stub.close()
        self.crl.close()

    def wait(self) -> None:
        self.stop_event.wait()

    def _heartbeat(self) -> tuple[str, tuple[str, ...]]:
        """What a watch request tells of this host that may change: health, held versions."""
        return self.health(), tuple(held_versions(self.config.models_root))

    def _watch_request(self) -> pb.WatchRequest:
        with self.lock:
            known = {
                j: r.job.assignments.topology_version
                for j, r in self.runners.items()
                if not r.closed
            }
        health, held = self._sent_heartbeat = self._heartbeat()
        return pb.WatchRequest(
            host_id=self.config.host_id,
            rack=self.config.rack,
            labels=self.config.labels,
            data_address=self.data_address,
            held_versions=held,
            health=health,
            data_refusals=self.data_refusals(),
            known_topology_versions=known,
        )

    def reopen_watch_if_changed(self) -> bool:
        """Opening a watch is the heartbeat: when this host's health or held versions
        changed since the open watches were asked for, end them, and the next opens at once
        with the news (the coordinator ends a watch only every ~20 s)."""
        if self._sent_heartbeat is None or self._heartbeat() == self._sent_heartbeat:
            return False
        with self.lock:
            calls = list(self.watch_calls)
            self._reopening += len(calls)
        for call in calls:
            call.cancel()
        return bool(calls)

    def watch_cancelled_by_us(self, exc: grpc.RpcError) -> bool:
        """A watch this host ended to send news (reopen_watch_if_changed): reopen at once,
        no back-off, not a lost coordinator."""
        if exc.code() != grpc.StatusCode.CANCELLED:
            return False
        with self.lock:
            ours = self._reopening > 0
            self._reopening = max(0, self._reopening - 1)
        return ours

    def _watch_once(self) -> None:
        """One watch stream, until the coordinator ends it (its lifetime), it breaks, or
        this host has news for its heartbeat."""
        events = self.stub.stream(
            "Watch", self._watch_request(), self.config.watch_timeout_s, self.watch_calls
        )
        try:
            for event in events:
                self.reach.ok()  # a leader answers
                started = self._reconcile({j.job_id: j for j in event.jobs})
                self.deliver(event.assignments)
                if self.stop_event.is_set():
                    return
                if started - {a.job_id for a in event.assignments}:
                    # a runner restarted on a job this stream already pushed: reopen the
                    # watch with its version (0), so its assignment comes at once
                    return
        except grpc.RpcError as exc:
            if not self.watch_cancelled_by_us(exc):
                raise
        finally:
            events.close()

    def deliver(self, assignments: Any) -> None:
        """Hand each pushed assignment to its job's runner (if this host runs the job)."""
        for a in assignments:
            with self.lock:
                r = self.runners.get(a.job_id)
            if r is not None:
                r.control.deliver(a)

    def _watch_loop(self) -> None:
        while not self.stop_event.is_set():
            try:
                # coordinator unreachable: running jobs keep streaming on their last assignment
                retry_call(
                    self._watch_once,
                    retry_on=grpc.RpcError,
                    backoff=WATCH_RETRY,
                    stop_event=self.stop_event,
                    on_retry=self._unreachable,
                )
            except grpc.RpcError:
                return  # stopping

    def _unreachable(self, exc: BaseException, _failures: int) -> None:
        self.reach.failed(exc)

    def _reconcile(self, listed: dict[str, pb.JobRef]) -> set[str]:
        """Start a runner for every listed job; forget ended runners of unlisted ones.
        Returns the jobs a runner was started for."""
        started: set[str] = set()
        with self.lock:
            for job_id, ref in listed.items():
                r = self.runners.get(job_id)
                # a job this host gave up on (HOST_FAILED, NO_SPACE, a refused manifest) is
                # not started again by every push while it stays listed: the same refusal,
                # again and again (a restarted agent tries afresh)
                if r is None or (r.closed and not r.job.failed):
                    rank = priority_rank(ref.priority or "normal")
                    r = JobRunner(self, job_id, ref.model, ref.version, rank)
                    self.runners[job_id] = r
                    r.start()
                    started.add(job_id)
            for job_id, r in list(self.runners.items()):
                # An unlisted job finished (DONE) or was cancelled. The runner learns which
                # from the ended job's assignment on the watch (and discards staging if
                # cancelled); here we only forget runners that have ended.
                if job_id not in listed and (r.closed or not r.alive):
                    r.stop()
                    del self.runners[job_id]
                    bytelog.remove(self.config.models_root, job_id)  # its figures are final
                    # its counters stay on /metrics (a counter that vanishes reads as a
                    # reset); the last ENDED_JOBS_KEPT ended jobs
                    self.ended[job_id] = r.job
                    while len(self.ended) > ENDED_JOBS_KEPT:
                        self.ended.pop(next(iter(self.ended)))
        return started
