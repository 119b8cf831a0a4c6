"""gRPC front end of the coordinator (JobService + AgentService) and its background sweeper.

The server is grpc.aio on its own event loop thread: a handler never holds a thread while it
waits, so thousands of open watch streams cost no threads. The coordinator logic stays
synchronous (one lock, the store); unary handlers run it on a small thread pool, and the
watch hub (:mod:`.watchhub`) pushes job and assignment changes to every stream in batches.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import random
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict
from functools import lru_cache
from typing import Any, NoReturn, TypeVar

import grpc
from google.protobuf import message_factory
from prometheus_client import Histogram
from relgate_trust.job_request import JobSpec

from relgate_agent.attestation import CertSigner
from relgate_agent.contracts import ProgressReply, WatchCursor
from relgate_agent.coordinator import crl
from relgate_agent.coordinator.batch import LockBatch
from relgate_agent.coordinator.certs import cut_off
from relgate_agent.coordinator.credentials import ReloadingCredentials
from relgate_agent.coordinator.enrollment import Enrollments
from relgate_agent.coordinator.jobstate import (
    CoordinatorConfig,
    NotEnrolled,
    NotFound,
    NotLeader,
    ReadyRefused,
    Rejected,
)
from relgate_agent.coordinator.metrics import LOOP_PROBE_S
from relgate_agent.coordinator.pace import sweep_wait
from relgate_agent.coordinator.renewal import Renewals
from relgate_agent.coordinator.service import Coordinator
from relgate_agent.coordinator.store import Fenced
from relgate_agent.coordinator.watchhub import RECHECK_S, WatchClosed, WatchHub
from relgate_agent.coordinator.wire import (
    WatchEncoder,
    job_summary_to_pb,
    job_topology_to_pb,
    news,
    peer_to_pb,
    registration_to_pb,
    reply_to_pb,
    report_from_pb,
    status_to_pb,
)
from relgate_agent.errors import CHECK_METADATA_KEY, LEADER_METADATA_KEY, AgentError
from relgate_agent.identity import cabundle, certlife
from relgate_agent.identity.authz import CHECK_CLIENT_IDENTITY, rpc_check
from relgate_agent.identity.cabundle import CHECK_CERT_ISSUER, TrustFile, issued_by
from relgate_agent.identity.certlife import RevokedCerts
from relgate_agent.pki import (
    Identity,
    PkiError,
    TlsFiles,
    identity_from_pem,
)
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg
from relgate_agent.rpc import GRPC_SERVER_OPTIONS

log = logging.getLogger(__name__)

T = TypeVar("T")
RPC_THREADS = 8  # the logic holds one lock: more threads only queue on it
WATCH_JITTER = 0.2  # a watch lives watch_max_s +- 20%: reconnects spread, never in step
CERT_RECHECK_S = RECHECK_S  # an open watch re-checks its caller's certificate this often

# (exception type, status): the first match maps a refusal of the logic to its status
_STATUS: tuple[tuple[type[AgentError], grpc.StatusCode], ...] = (
    (NotLeader, grpc.StatusCode.UNAVAILABLE),
    (Fenced, grpc.StatusCode.UNAVAILABLE),  # a write without the job's lease: not the leader
    (NotFound, grpc.StatusCode.NOT_FOUND),
    (NotEnrolled, grpc.StatusCode.PERMISSION_DENIED),
    (ReadyRefused, grpc.StatusCode.FAILED_PRECONDITION),
    (Rejected, grpc.StatusCode.INVALID_ARGUMENT),
    (AgentError, grpc.StatusCode.FAILED_PRECONDITION),
)


def status_of(exc: AgentError) -> grpc.StatusCode:
    return next(code for kind, code in _STATUS if isinstance(exc, kind))


@lru_cache(maxsize=65536)
def _identity(pem: bytes) -> Identity | None:
    return identity_from_pem(pem)  # one parse per certificate, not per call


def caller_pem(context: grpc.aio.ServicerContext) -> bytes | None:
    """The client certificate gRPC verified against the fleet CA (None: not exactly one).
    Read once per call or stream: ``auth_context()`` builds a new dict every time."""
    certs = (context.auth_context() or {}).get("x509_pem_cert") or []
    return bytes(certs[0]) if len(certs) == 1 else None


def caller_identity(context: grpc.aio.ServicerContext) -> Identity | None:
    """The identity in the client certificate gRPC verified against the fleet CA."""
    return identity_of(caller_pem(context))


def identity_of(pem: bytes | None) -> Identity | None:
    return _identity(pem) if pem is not None else None


def cert_refusal(
    pem: bytes | None,
    revoked: RevokedCerts | None,
    trust: TrustFile | None = None,
) -> tuple[str, str] | None:
    """(check, why) when this certificate expired, is revoked, or its CA is no longer
    trusted (retired in a CA rotation) now (identity/certlife.py, cabundle.py): TLS checked
    it when the connection opened, which may be hours ago."""
    if pem is None:
        return None  # no identity: rpc_refusal says so
    if trust is not None and not issued_by(pem, trust.bundle()):
        return CHECK_CERT_ISSUER, "the caller's certificate is from a CA the fleet no longer trusts"
    return certlife.refusal(certlife.life_of_pem(pem), revoked, time.time())


def caller_cert_refusal(
    context: grpc.aio.ServicerContext,
    revoked: RevokedCerts | None,
    trust: TrustFile | None = None,
) -> tuple[str, str] | None:
    """:func:`cert_refusal` of the caller's certificate."""
    return cert_refusal(caller_pem(context), revoked, trust)


def serial_of(pem: bytes | None) -> int:
    """The serial of a certificate (0 when there is none)."""
    return certlife.life_of_pem(pem).serial if pem is not None else 0


def caller_serial(context: grpc.aio.ServicerContext) -> int:
    """The serial of the caller's certificate (0 when there is none)."""
    return serial_of(caller_pem(context))


def caller_serial_hex(context: grpc.aio.ServicerContext) -> str:
    """The same serial in hex, as logs print it ("" when there is none)."""
    serial = caller_serial(context)
    return format(serial, "x") if serial else ""


class Calls:
    """Authorization and the thread hop every handler shares."""

    def __init__(
        self,
        coord: Coordinator,
        executor: ThreadPoolExecutor,
        revoked: RevokedCerts | None = None,
        trust: TrustFile | None = None,
    ) -> None:
        self.coord = coord
        self.executor = executor
        self.revoked = revoked  # the fleet's revoked certificates (next to the CA bundle)
        self.trust = trust  # the CA bundle as it is now (a rotation retires a CA)
        self.seen_serials: dict[str, int] = {}  # host id -> its certificate's serial (crl.py)
        self.batch = LockBatch(coord.lock, executor)  # reports that found the lock taken
        coord.apply_waiting = self.batch.apply_waiting  # a tick's phases let them in

    async def check_cert(
        self, context: grpc.aio.ServicerContext, ident: Identity | None, pem: bytes | None
    ) -> None:
        """Abort with UNAUTHENTICATED (naming the check) when the caller's certificate
        (``pem``, read off this call once) expired or was revoked since its connection
        opened; a host's is also cut off from its jobs (coordinator/certs.py)."""
        if ident is not None and ident.role == "host":
            self.seen_serials[ident.name] = serial_of(pem)
        refused = cert_refusal(pem, self.revoked, self.trust)
        if refused is None:
            return
        check, why = refused
        self.coord.control_refusals += 1
        log.warning("%s: %s (peer %s)", check, why, context.peer())
        # a retired CA's certificate on an old connection is not a host to drop: its
        # next connection presents the certificate it renewed onto the new CA
        if ident is not None and ident.role == "host" and check != CHECK_CERT_ISSUER:
            name = ident.name
            await self.run(context, lambda: cut_off(self.coord, name, check, why))
        context.set_trailing_metadata(((CHECK_METADATA_KEY, check),))
        await context.abort(grpc.StatusCode.UNAUTHENTICATED, why)

    async def authorize(
        self, context: grpc.aio.ServicerContext, method: str, host_id: str = "", rack: str = ""
    ) -> Identity:
        """Abort with PERMISSION_DENIED unless the caller's certificate allows this call."""
        pem = caller_pem(context)
        return await self.authorize_as(context, method, pem, host_id, rack)

    async def authorize_as(
        self,
        context: grpc.aio.ServicerContext,
        method: str,
        pem: bytes | None,
        host_id: str = "",
        rack: str = "",
    ) -> Identity:
        """:meth:`authorize` for a certificate already read off this call (a stream's
        later messages)."""
        ident = identity_of(pem)
        await self.check_cert(context, ident, pem)  # every call: a certificate's whole life
        refused = rpc_check(method, ident, host_id, rack)
        if refused is None and ident is not None:
            return ident
        check, why = refused or (CHECK_CLIENT_IDENTITY, "no client identity")
        self.coord.control_refusals += 1  # a counter read by ListHosts; the loop thread only
        log.warning("%s (peer %s)", why, context.peer())
        context.set_trailing_metadata(((CHECK_METADATA_KEY, check),))
        await context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
        raise AssertionError("unreachable")  # abort raises

    async def run(self, context: grpc.aio.ServicerContext, fn: Callable[[], T]) -> T:
        """``fn()`` on the RPC pool; a refusal of the logic aborts with its status."""
        try:
            return await asyncio.get_running_loop().run_in_executor(self.executor, fn)
        except AgentError as exc:
            await abort_with(context, exc)

    async def run_inline_if_free(self, context: grpc.aio.ServicerContext, fn: Callable[[], T]) -> T:
        """``fn()`` on the event loop when the coordinator lock is free at once (a progress
        report: microseconds of work under the lock, cheaper than the hop to a thread),
        else in a batch with the others that found it taken (coordinator/batch.py)."""
        if not self.coord.lock.acquire(blocking=False):
            try:
                return await self.batch.submit(fn)
            except AgentError as exc:
                await abort_with(context, exc)
        # never held across an await: the lock is reentrant for this thread, so another
        # coroutine of the loop must never find it taken by one suspended mid-call
        try:
            result, refusal = fn(), None
        except AgentError as exc:
            refusal = exc
        finally:
            self.coord.lock.release()
        if refusal is not None:
            await abort_with(context, refusal)
        return result

    async def call(
        self,
        context: grpc.aio.ServicerContext,
        method: str,
        fn: Callable[[], T],
        host_id: str = "",
        rack: str = "",
    ) -> T:
        await self.authorize(context, method, host_id, rack)
        return await self.run(context, fn)


class EnrollServicer(pbg.EnrollServiceServicer):
    """The enrollment listener: no client certificate, the bootstrap token is the caller's
    only credential (identity/enroll.py)."""

    def __init__(self, calls: Calls, enrollments: Enrollments) -> None:
        self.calls = calls
        self.enrollments = enrollments

    async def SubmitCsr(
        self, request: pb.SubmitCsrRequest, context: grpc.aio.ServicerContext
    ) -> pb.SubmitCsrResponse:
        rack = await self.calls.run(
            context,
            lambda: self.enrollments.submit(request.token, request.host_id, request.csr_pem),
        )
        return pb.SubmitCsrResponse(host_id=request.host_id, rack=rack)

    async def FetchCert(
        self, request: pb.FetchCertRequest, context: grpc.aio.ServicerContext
    ) -> pb.FetchCertResponse:
        cert = await self.calls.run(
            context, lambda: self.enrollments.fetch(request.token, request.host_id)
        )
        return pb.FetchCertResponse(approved=bool(cert), cert_pem=cert)


async def abort_with(context: grpc.aio.ServicerContext, exc: AgentError) -> NoReturn:
    check = str(getattr(exc, "check", "") or "")
    leader = exc.leader if isinstance(exc, NotLeader) else ""
    metadata: tuple[tuple[str, str], ...] = ((CHECK_METADATA_KEY, check),) if check else ()
    if leader:  # the replica that leads the job: the client calls it next
        metadata += ((LEADER_METADATA_KEY, leader),)
    if metadata:
        context.set_trailing_metadata(metadata)
    await context.abort(status_of(exc), str(exc))
    raise AssertionError("unreachable")  # abort raises


class JobServicer(pbg.JobServiceServicer):
    def __init__(self, calls: Calls, enrollments: Enrollments | None = None) -> None:
        self.calls = calls
        self.coord = calls.coord
        self.enrollments = enrollments

    def _enrollments(self) -> Enrollments:
        if self.enrollments is None:
            raise AgentError("this coordinator does not enroll by CSR")
        return self.enrollments

    async def CreateEnrollToken(
        self, request: pb.CreateEnrollTokenRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateEnrollTokenResponse:
        token, expires_at = await self.calls.call(
            context,
            "CreateEnrollToken",
            lambda: self._enrollments().create_token(
                request.host_id, request.rack, int(request.ttl_s)
            ),
        )
        return pb.CreateEnrollTokenResponse(
            host_id=request.host_id, rack=request.rack, token=token, expires_at=expires_at
        )

    async def ListEnrollRequests(
        self, request: pb.ListEnrollRequestsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListEnrollRequestsResponse:
        pending = await self.calls.call(
            context, "ListEnrollRequests", lambda: self._enrollments().pending()
        )
        return pb.ListEnrollRequestsResponse(
            pending=[
                pb.EnrollRequest(
                    host_id=p.host_id, rack=p.rack, csr_pem=p.csr_pem, requested_at=p.requested_at
                )
                for p in pending
            ]
        )

    async def ApproveEnrollment(
        self, request: pb.ApproveEnrollmentRequest, context: grpc.aio.ServicerContext
    ) -> pb.ApproveEnrollmentResponse:
        serial = await self.calls.call(
            context,
            "ApproveEnrollment",
            lambda: self._enrollments().approve(request.host_id, request.cert_pem),
        )
        return pb.ApproveEnrollmentResponse(host_id=request.host_id, serial=serial)

    async def EnrollHost(
        self, request: pb.EnrollHostRequest, context: grpc.aio.ServicerContext
    ) -> pb.EnrollHostResponse:
        enrolled = await self.calls.call(
            context,
            "EnrollHost",
            lambda: self.coord.enroll(
                request.host_id, request.rack, dict(request.labels), request.remove
            ),
        )
        return pb.EnrollHostResponse(host_id=request.host_id, enrolled=enrolled)

    async def ListHosts(
        self, request: pb.ListHostsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListHostsResponse:
        hosts = await self.calls.call(context, "ListHosts", self.coord.inventory)
        return pb.ListHostsResponse(
            hosts=[pb.InventoryHost(**asdict(h)) for h in hosts],
            control_refusals=self.coord.control_refusals,
        )

    async def CreateJob(
        self, request: pb.CreateJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.CreateJobResponse:
        spec = JobSpec(
            model=request.model,
            version=request.version,
            manifest_uri=request.manifest_uri,
            origin_uri=request.origin_uri,
            target_selector=request.target_selector,
            priority=request.priority or "normal",
            origin_cap_bytes_per_s=request.origin_cap_bytes_per_s,
            ready_threshold_ppm=request.ready_threshold_ppm,
            deadline_s=request.deadline_s,
            stripes=request.stripes,
            webhook_url=request.webhook_url,
            job_id=request.job_id,
            origin_dc=request.origin_dc,
        )
        job = await self.calls.call(context, "CreateJob", lambda: self.coord.create_job(spec))
        return pb.CreateJobResponse(
            job_id=job.job_id,
            state=job.state,
            manifest_digest=job.manifest.digest,
            hosts_total=len(job.targets),
        )

    async def GetJob(
        self, request: pb.GetJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetJobResponse:
        report = await self.calls.call(
            context, "GetJob", lambda: self.coord.job_status(request.job_id)
        )
        return status_to_pb(report)

    async def CancelJob(
        self, request: pb.CancelJobRequest, context: grpc.aio.ServicerContext
    ) -> pb.CancelJobResponse:
        placed, total = await self.calls.call(
            context, "CancelJob", lambda: self.coord.cancel_job(request.job_id)
        )
        return pb.CancelJobResponse(state="CANCELLED", placed_hosts=placed, hosts_total=total)

    async def EvictHost(
        self, request: pb.EvictHostRequest, context: grpc.aio.ServicerContext
    ) -> pb.EvictHostResponse:
        ident = await self.calls.authorize(context, "EvictHost")
        removed = await self.calls.run(
            context,
            lambda: self.coord.evict_host(
                request.job_id, request.host_id, request.reason, str(ident)
            ),
        )
        return pb.EvictHostResponse(state="REMOVED", removed=removed)

    async def ClearHost(
        self, request: pb.ClearHostRequest, context: grpc.aio.ServicerContext
    ) -> pb.ClearHostResponse:
        was = await self.calls.call(
            context, "ClearHost", lambda: self.coord.clear_host(request.host_id, request.note)
        )
        return pb.ClearHostResponse(cleared=bool(was), was=was)

    async def ListJobs(
        self, request: pb.ListJobsRequest, context: grpc.aio.ServicerContext
    ) -> pb.ListJobsResponse:
        jobs = await self.calls.call(
            context, "ListJobs", lambda: self.coord.list_jobs(request.state)
        )
        return pb.ListJobsResponse(jobs=[job_summary_to_pb(j) for j in jobs])

    async def GetJobTopology(
        self, request: pb.GetJobTopologyRequest, context: grpc.aio.ServicerContext
    ) -> pb.GetJobTopologyResponse:
        view = await self.calls.call(
            context, "GetJobTopology", lambda: self.coord.job_topology(request.job_id)
        )
        return job_topology_to_pb(view)


class AgentServicer(pbg.AgentServiceServicer):
    def __init__(self, calls: Calls, hub: WatchHub, renewals: Renewals | None = None) -> None:
        self.calls = calls
        self.trust = calls.trust
        self.renewals = renewals or Renewals()  # no CA key: every renewal is refused
        self.coord = calls.coord
        self.hub = hub
        self.encoder = WatchEncoder()  # the event loop's alone

    async def Watch(
        self, request: pb.WatchRequest, context: grpc.aio.ServicerContext
    ) -> AsyncIterator[bytes]:
        pem = caller_pem(context)
        ident = await self.calls.authorize_as(context, "Watch", pem, request.host_id, request.rack)
        # counted from the moment the host is authenticated: a heartbeat that waits behind
        # a busy coordinator must not leave a gap in which the host looks gone
        watching = self.coord.watching
        watching[request.host_id] = watching.get(request.host_id, 0) + 1
        try:
            async for event in self._watch(request, context, ident, pem):
                yield event
        finally:
            if watching.get(request.host_id, 0) <= 1:
                watching.pop(request.host_id, None)
                self.coord.watch_ended[request.host_id] = self.coord.clock()
            else:
                watching[request.host_id] -= 1

    async def _watch(
        self,
        request: pb.WatchRequest,
        context: grpc.aio.ServicerContext,
        ident: Identity,
        pem: bytes | None,
    ) -> AsyncIterator[bytes]:
        await self.calls.run(
            context,
            lambda: self.coord.heartbeat(
                request.host_id,
                ident.rack,  # the certificate's rack, not a claim
                request.data_address,
                list(request.held_versions),
                health=request.health,
                data_refusals=request.data_refusals,
            ),
        )
        loop = asyncio.get_running_loop()
        lifetime = self.coord.config.watch_max_s * random.uniform(1 - WATCH_JITTER, 1)  # noqa: S311 - spreading reconnects, not a secret
        deadline = loop.time() + lifetime
        revoked, trust = self.calls.revoked, self.calls.trust
        watcher = self.hub.add(
            WatchCursor(request.host_id, versions=dict(request.known_topology_versions)),
            # the hub's sweep asks every CERT_RECHECK_S: a host whose certificate expires or
            # is revoked loses its open watch within that, not at its lifetime
            refused=lambda: cert_refusal(pem, revoked, trust) is not None,
        )
        sequence = 0
        try:
            while True:
                try:
                    update = await watcher.next(deadline - loop.time())
                except WatchClosed as exc:
                    await context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
                    return
                if watcher.take_recheck():
                    await self.calls.check_cert(context, ident, pem)  # aborts, naming the check
                if update is None and loop.time() < deadline:
                    continue
                if update is None:
                    return  # lifetime over: the agent opens its next watch (its heartbeat)
                sequence += 1
                yield self.encoder.event(update, sequence)
        finally:
            self.hub.remove(watcher)

    async def Register(
        self, request: pb.RegisterRequest, context: grpc.aio.ServicerContext
    ) -> pb.RegisterResponse:
        ident = await self.calls.authorize(context, "Register", request.host_id, request.rack)
        r = await self.calls.run(
            context,
            lambda: self.coord.register(
                request.job_id,
                request.host_id,
                ident.rack,
                request.have,
                request.free_disk_bytes,
                request.data_address,
                serving_rate=request.serving_rate_bytes_per_s,
                envelope_from_peers=request.envelope_from_peers,
            ),
        )
        return registration_to_pb(r)

    async def ReportProgress(
        self, request: pb.ReportProgressRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportProgressResponse:
        await self.calls.authorize(context, "ReportProgress", request.host_id, request.rack)
        return reply_to_pb(await self._report(request, context), request)

    async def ReportStream(
        self,
        requests: AsyncIterator[pb.ReportProgressRequest],
        context: grpc.aio.ServicerContext,
    ) -> AsyncIterator[pb.ReportProgressResponse]:
        """Reports on one stream, in order: the certificate is read once; every message must
        still name the host (and rack) it names. A report is answered (its ``seq`` echoed)
        unless it is ``quiet`` and the answer holds no news (:func:`news`): half the
        coordinator's cost of a streamed report is writing its answer."""
        pem = caller_pem(context)
        timer = self.coord.metrics.rpc_seconds.labels("ReportStream")
        answered = self.coord.metrics.report_replies
        sent: dict[str, tuple[tuple[int, int], ...]] = {}  # job -> origin shares last sent
        async for request in requests:
            started = time.perf_counter()
            await self.calls.authorize_as(
                context, "ReportStream", pem, request.host_id, request.rack
            )
            r = await self._report(request, context)
            timer.observe(time.perf_counter() - started)
            if request.quiet and not news(r, sent.get(request.job_id, ())):
                answered.labels("quiet").inc()
                continue
            answered.labels("answered").inc()
            sent[request.job_id] = r.origin_shares or sent.get(request.job_id, ())
            yield reply_to_pb(r, request)

    async def _report(
        self, request: pb.ReportProgressRequest, context: grpc.aio.ServicerContext
    ) -> ProgressReply:
        report = report_from_pb(request)
        return await self.calls.run_inline_if_free(
            context, lambda: self.coord.report_progress(request.job_id, request.host_id, report)
        )

    async def ReportSuspect(
        self, request: pb.ReportSuspectRequest, context: grpc.aio.ServicerContext
    ) -> pb.ReportSuspectResponse:
        r = await self.calls.call(
            context,
            "ReportSuspect",
            lambda: self.coord.report_suspect(
                request.job_id,
                request.reporter,
                request.suspect_host,
                request.reason,
                request.stripe,
            ),
            request.reporter,
        )
        return pb.ReportSuspectResponse(
            topology_version=r.topology_version, new_upstream=peer_to_pb(r.new_upstream)
        )

    async def FindPeers(
        self, request: pb.FindPeersRequest, context: grpc.aio.ServicerContext
    ) -> pb.FindPeersResponse:
        found = await self.calls.call(
            context,
            "FindPeers",
            lambda: self.coord.find_peers(
                request.job_id,
                request.host_id,
                request.chunk,
                set(request.exclude),
                request.limit or 3,
            ),
            request.host_id,
        )
        return pb.FindPeersResponse(
            peers=[peer_to_pb(p) for p in found.peers], holders=found.holders
        )

    async def RenewCert(
        self, request: pb.RenewCertRequest, context: grpc.aio.ServicerContext
    ) -> pb.RenewCertResponse:
        """A new certificate for the caller's CSR (coordinator/renewal.py)."""
        ident = await self.calls.authorize(context, "RenewCert", request.host_id, request.rack)
        presented = caller_serial_hex(context)
        pem, serial = await self.calls.run(
            context, lambda: self.renewals.renew(ident, request.csr_pem)
        )
        log.info("renewed %s: presented serial %s, issued serial %s", ident, presented, serial)
        return pb.RenewCertResponse(cert_pem=pem, serial=serial)

    async def TrustBundle(
        self, request: pb.TrustBundleRequest, context: grpc.aio.ServicerContext
    ) -> pb.TrustBundleResponse:
        """The CA bundle this coordinator trusts now (hosts poll it: a CA rotation)."""
        await self.calls.authorize(context, "TrustBundle", request.host_id, request.rack)
        if self.trust is None:
            await abort_with(context, AgentError("this coordinator serves no trust bundle"))
        raw = self.trust.pem()
        sha = cabundle.digest(raw)
        return pb.TrustBundleResponse(
            ca_pem="" if sha == request.have_sha256 else raw.decode("ascii"), sha256=sha
        )


# (client streaming, server streaming) -> how gRPC wraps such a handler
_HANDLER_KINDS: dict[tuple[bool, bool], Callable[..., grpc.RpcMethodHandler]] = {
    (False, False): grpc.unary_unary_rpc_method_handler,
    (False, True): grpc.unary_stream_rpc_method_handler,
    (True, False): grpc.stream_unary_rpc_method_handler,
    (True, True): grpc.stream_stream_rpc_method_handler,
}


def service_handlers(
    name: str, servicer: object, histogram: Histogram, raw: frozenset[str] = frozenset()
) -> grpc.GenericRpcHandler:
    """Service ``name``'s handlers, from the proto's descriptor (as the generated
    registration would build them), each unary call timed into ``histogram`` (reports on a
    stream are timed one by one where they are answered); the methods in ``raw`` send
    responses their handler already encoded (Watch: see ``wire.WatchEncoder``)."""
    service = pb.DESCRIPTOR.services_by_name[name]
    handlers = {}
    for m in service.methods:
        request = message_factory.GetMessageClass(m.input_type)
        response = message_factory.GetMessageClass(m.output_type)
        fn = getattr(servicer, m.name)
        if not (m.client_streaming or m.server_streaming):
            fn = _timed(fn, histogram.labels(m.name))
        handlers[m.name] = _HANDLER_KINDS[(m.client_streaming, m.server_streaming)](
            fn,
            request_deserializer=request.FromString,
            response_serializer=None if m.name in raw else response.SerializeToString,
        )
    return grpc.method_handlers_generic_handler(service.full_name, handlers)


def _timed(
    fn: Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]], child: Any
) -> Callable[[Any, grpc.aio.ServicerContext], Awaitable[Any]]:
    async def timed(request: Any, context: grpc.aio.ServicerContext) -> Any:
        started = time.perf_counter()
        try:
            return await fn(request, context)
        finally:
            child.observe(time.perf_counter() - started)

    return timed


class CoordinatorServer:
    """Runs the coordinator: the grpc.aio server on its own event-loop thread, the RPC
    thread pool, the watch hub, and a sweeper thread (lease, dead hosts, handoff)."""

    def __init__(
        self,
        config: CoordinatorConfig,
        listen: str | list[str] = "127.0.0.1:0",
        tick_s: float = 0.5,
        *,
        tls: TlsFiles,
        metrics_listen: str = "",
        enroll_listen: str = "",
        renewals: Renewals | None = None,
    ) -> None:
        self.coordinator = Coordinator(config)
        self.renewals = renewals  # signs agents' renewals (--ca-dir); None: refused
        # enrollment by CSR; its listener ("host:port", "" none) takes no client certificate
        self.trust = TrustFile(tls.ca)  # re-read when a CA rotation changes it
        self.enrollments = Enrollments(self.coordinator.store, self.trust)
        self.enroll_listen = enroll_listen
        self.enroll_address = ""
        self.enroll_server: grpc.aio.Server | None = None
        self.metrics_listen = metrics_listen  # "host:port" for /metrics ("": not served)
        self.metrics_address = ""
        self.identity = tls.identity()
        if self.identity.role != "coordinator":
            raise PkiError(
                f"{tls.cert} is a {self.identity.role} certificate, not a coordinator's",
                check="cert-role",
            )
        # deployer events are signed with this identity's key; READY attestations are
        # checked against the fleet CA
        self.coordinator.use_identity(CertSigner.from_tls(tls), self.trust)
        self.executor = ThreadPoolExecutor(max_workers=RPC_THREADS, thread_name_prefix="coord-rpc")
        self.hub = WatchHub(
            self.coordinator.watch_updates,
            self.executor,
            generation=lambda: self.coordinator.changed.generation,
            recheck_s=CERT_RECHECK_S,
        )
        self.listen = [listen] if isinstance(listen, str) else list(listen)
        self.tls = tls
        self.addresses: list[str] = []
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._sweeper = threading.Thread(
            target=self._sweep, name="coordinator-sweeper", daemon=True
        )
        # the lease on its own thread: a long sweep under load must not let it lapse
        self._leaser = threading.Thread(target=self._lease, name="coordinator-lease", daemon=True)
        self.loop = asyncio.new_event_loop()
        self._loop_thread = threading.Thread(
            target=self.loop.run_forever, name="coordinator-aio", daemon=True
        )
        self.server: grpc.aio.Server | None = None
        self._lag_probe: asyncio.Task[None] | None = None
        self._gc_timer = self.coordinator.metrics.time_gc()  # in gc.callbacks while serving
        self._loop_thread.start()
        try:
            # binding happens here, so a port in use is the constructor's error, as before
            asyncio.run_coroutine_threadsafe(self._bind(), self.loop).result(timeout=30)
        except BaseException:
            self._close_loop()
            raise
        # the first listen address is the one agents are told about
        self.address = self.addresses[0]

    async def _bind(self) -> None:
        server = grpc.aio.server(options=GRPC_SERVER_OPTIONS)
        calls = Calls(self.coordinator, self.executor, RevokedCerts.beside(self.tls.ca), self.trust)
        self.crl = crl.CertRevocations(self.coordinator, calls.revoked or RevokedCerts(None))
        self.crl.seen = calls.seen_serials
        self.crl.refresh()
        rpc_seconds = self.coordinator.metrics.rpc_seconds
        server.add_generic_rpc_handlers(
            (
                service_handlers("JobService", JobServicer(calls, self.enrollments), rpc_seconds),
                service_handlers(
                    "AgentService",
                    AgentServicer(calls, self.hub, self.renewals),
                    rpc_seconds,
                    raw=frozenset({"Watch"}),
                ),
                crl.handlers(calls, self.crl),
            )
        )
        # mutual TLS on every listener (unix sockets too): no certificate, no RPC
        # read again when the files change: a CA rotation, a reissued certificate
        # one per listener: gRPC does not bind one dynamic credentials object twice; the
        # first also re-reads the handoff signer when the files change
        self.credentials = [
            ReloadingCredentials(self.tls, self._signer_changed if i == 0 else None)
            for i in range(len(self.listen))
        ]
        for addr, reloading in zip(self.listen, self.credentials, strict=True):
            port = server.add_secure_port(addr, reloading.credentials)
            if port == 0:
                raise AgentError(f"coordinator cannot listen on {addr}")
            self.addresses.append(
                addr if addr.startswith("unix:") else f"{addr.rpartition(':')[0]}:{port}"
            )
        self.server = server
        if self.enroll_listen:
            self.enroll_server = self._bind_enroll(calls, rpc_seconds)

    def _signer_changed(self, tls: TlsFiles) -> None:
        """Deployer events are signed with the reloaded certificate from now on."""
        self.coordinator.use_identity(CertSigner.from_tls(tls), self.trust)

    def _bind_enroll(self, calls: Calls, rpc_seconds: Histogram) -> grpc.aio.Server:
        """A server with the enrollment service only: TLS with the coordinator's certificate,
        no client certificate asked (a host without one yet enrolls here)."""
        server = grpc.aio.server(options=GRPC_SERVER_OPTIONS)
        server.add_generic_rpc_handlers(
            (
                service_handlers(
                    "EnrollService", EnrollServicer(calls, self.enrollments), rpc_seconds
                ),
            )
        )
        _, cert, key = self.tls.read()
        creds = grpc.ssl_server_credentials([(key, cert)], require_client_auth=False)
        addr = self.enroll_listen
        port = server.add_secure_port(addr, creds)
        if port == 0:
            raise AgentError(f"coordinator cannot listen on {addr} (enrollment)")
        self.enroll_address = f"{addr.rpartition(':')[0]}:{port}"
        return server

    async def _start(self) -> None:
        if self.server is None:
            raise AgentError("coordinator server was never bound")
        self.hub.start()
        self.coordinator.changed.subscribe(self.hub.poke_threadsafe)
        self._lag_probe = asyncio.create_task(self._probe_lag())
        gc.callbacks.append(self._gc_timer)
        await self.server.start()
        if self.enroll_server is not None:
            await self.enroll_server.start()

    def start(self) -> CoordinatorServer:
        if self.coordinator.shard is not None:  # where other replicas send this one's jobs' calls
            self.coordinator.shard.address = self.address
        self.coordinator.maintain_lease()  # an HA replica may lead from its first moment
        asyncio.run_coroutine_threadsafe(self._start(), self.loop).result(timeout=30)
        self._sweeper.start()
        self._leaser.start()
        if self.metrics_listen:
            try:
                self.metrics_address = self.coordinator.metrics.endpoint.serve(self.metrics_listen)
            except AgentError:
                self.stop()
                raise
        log.info("coordinator listening on %s", self.address)
        return self

    async def _probe_lag(self) -> None:
        """How late this loop wakes a timer, every LOOP_PROBE_S (the loop_lag histogram)."""
        loop, lag = asyncio.get_running_loop(), self.coordinator.metrics.loop_lag
        while True:
            due = loop.time() + LOOP_PROBE_S
            await asyncio.sleep(LOOP_PROBE_S)
            lag.observe(max(0.0, loop.time() - due))

    def _lease(self) -> None:
        while not self._stop.wait(self.tick_s):
            self.coordinator.maintain_lease()  # steps down itself when it cannot renew

    def _sweep(self) -> None:
        coord, wait = self.coordinator, self.tick_s
        coord.metrics.sweep_wait.set(wait)
        while not self._stop.wait(wait):
            started = time.perf_counter()
            try:
                coord.tick()
            except NotLeader as exc:  # a refusal, not a bug: another replica moved on
                log.warning("coordinator tick stopped: %s", exc)
            except Exception as exc:  # the sweeper must survive one bad tick; the next retries
                log.exception("coordinator tick failed (%s)", type(exc).__name__)
            took = time.perf_counter() - started
            coord.metrics.tick_seconds.observe(took)
            own = took - coord.tick_applied_s  # the reports it let in are not its own work
            wait = sweep_wait(self.tick_s, own, coord.config.dead_after_s)
            coord.metrics.sweep_wait.set(wait)

    async def _shutdown(self, grace: float) -> None:
        if self._lag_probe is not None:
            self._lag_probe.cancel()
        with contextlib.suppress(ValueError):  # never started
            gc.callbacks.remove(self._gc_timer)
        await self.hub.stop("coordinator shutting down")
        if self.server is not None:
            await self.server.stop(grace)
        if self.enroll_server is not None:
            await self.enroll_server.stop(grace)

    def stop(self, grace: float = 1.0) -> None:
        self._stop.set()
        with self.coordinator.lock:
            self.coordinator.closing = True
            self.coordinator.changed.notify_all()
        self.coordinator.changed.unsubscribe(self.hub.poke_threadsafe)
        if self.loop.is_running():
            asyncio.run_coroutine_threadsafe(self._shutdown(grace), self.loop).result(
                timeout=grace + 30
            )
        for t in (self._sweeper, self._leaser):
            if t.is_alive():
                t.join(timeout=5)
        self._close_loop()
        self.executor.shutdown(wait=True, cancel_futures=True)
        self.coordinator.metrics.endpoint.stop()
        self.coordinator.release()
        self.coordinator.store.close()

    def _close_loop(self) -> None:
        if self.loop.is_running():
            self.loop.call_soon_threadsafe(self.loop.stop)
            self._loop_thread.join(timeout=10)
        if not self.loop.is_running() and not self.loop.is_closed():
            self.loop.close()

    def wait(self) -> None:
        """Until ``stop`` (from another thread or a signal handler) ends the server."""
        self._loop_thread.join()
