"""gRPC front end of the coordinator (JobService + AgentService) and its background sweeper."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from concurrent import futures
from dataclasses import asdict
from typing import TypeVar

import grpc

from relgate_agent.authz import rpc_refusal
from relgate_agent.contracts import AssignmentPlan, JobReport, JobSpec, PeerRef, ProgressReport
from relgate_agent.coordinator.jobstate import (
    CoordinatorConfig,
    NotEnrolled,
    NotFound,
    NotLeader,
    ReadyRefused,
    Rejected,
)
from relgate_agent.coordinator.service import Coordinator
from relgate_agent.errors import CHECK_METADATA_KEY, AgentError
from relgate_agent.pki import Identity, TlsFiles, grpc_server_credentials, identity_from_pem
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg
from relgate_agent.rpc import GRPC_OPTIONS

log = logging.getLogger(__name__)

T = TypeVar("T")


def _abort_with_check(
    context: grpc.ServicerContext, code: grpc.StatusCode, exc: AgentError
) -> None:
    check = str(getattr(exc, "check", "") or "")
    if check:
        context.set_trailing_metadata(((CHECK_METADATA_KEY, check),))
    context.abort(code, str(exc))


def _call(context: grpc.ServicerContext, fn: Callable[[], T]) -> T:
    try:
        return fn()
    except NotLeader as exc:
        context.abort(grpc.StatusCode.UNAVAILABLE, str(exc))
    except NotFound as exc:
        context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
    except NotEnrolled as exc:
        context.abort(grpc.StatusCode.PERMISSION_DENIED, str(exc))
    except ReadyRefused as exc:
        context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
    except Rejected as exc:
        _abort_with_check(context, grpc.StatusCode.INVALID_ARGUMENT, exc)
    except AgentError as exc:
        _abort_with_check(context, grpc.StatusCode.FAILED_PRECONDITION, exc)
    raise AssertionError("unreachable")


def caller_identity(context: grpc.ServicerContext) -> Identity | None:
    """The identity in the client certificate gRPC verified against the fleet CA."""
    certs = (context.auth_context() or {}).get("x509_pem_cert") or []
    return identity_from_pem(bytes(certs[0])) if len(certs) == 1 else None


def authorize(
    coord: Coordinator,
    context: grpc.ServicerContext,
    method: str,
    host_id: str = "",
    rack: str = "",
) -> Identity:
    """Abort with PERMISSION_DENIED unless the caller's certificate allows this call."""
    ident = caller_identity(context)
    why = rpc_refusal(method, ident, host_id, rack)
    if why is not None:
        with coord.lock:
            coord.control_refusals += 1
        log.warning("%s (peer %s)", why, context.peer())
        context.abort(grpc.StatusCode.PERMISSION_DENIED, why)
    if ident is None:  # rpc_refusal refuses a caller without an identity
        context.abort(grpc.StatusCode.PERMISSION_DENIED, "no client identity")
        raise AssertionError("unreachable")  # abort raises
    return ident


def _peer(p: PeerRef) -> pb.Peer:
    return pb.Peer(host_id=p.host_id, address=p.address, rack=p.rack)


def status_to_pb(s: JobReport) -> pb.GetJobResponse:
    """The report as GetJob's answer (fields named alike; ``error`` is the client's)."""
    values = s.to_dict()
    hosts = values.pop("hosts")
    del values["error"]
    values["duration_s"] = float(values["duration_s"])
    return pb.GetJobResponse(**values, hosts=[pb.HostStatus(**h) for h in hosts])


def assignment_to_pb(a: AssignmentPlan) -> pb.Assignment:
    return pb.Assignment(
        job_id=a.job_id,
        topology_version=a.topology_version,
        job_state=a.job_state,
        cancelled=a.cancelled,
        members=list(a.members),
        stripes=[
            pb.StripeAssignment(
                stripe=s.stripe,
                upstream=_peer(s.upstream),
                downstreams=[_peer(d) for d in s.downstreams],
                resume_block=s.resume_block,
                origin_rate_bytes_per_s=s.origin_rate_bytes_per_s,
            )
            for s in a.stripes
        ],
    )


def report_from_pb(request: pb.ReportProgressRequest) -> ProgressReport:
    return ProgressReport(
        topology_version=request.topology_version,
        have=bytes(request.have),
        rx=request.rx_bytes,
        tx=request.tx_bytes,
        origin=request.origin_bytes,
        rx_bps=request.rx_bytes_per_s,
        tx_bps=request.tx_bytes_per_s,
        ready=request.ready,
        data_address=request.data_address,
        placed_manifest_digest=request.placed_manifest_digest,
        health=request.health,
        data_refusals=request.data_refusals,
        verified_delta=bytes(request.verified_delta),
        verified_count=request.verified_count,
        errors=tuple(
            f"{e.kind} chunk={e.chunk} from={e.from_host} {e.detail}".strip()
            for e in request.errors
        ),
    )


class JobServicer(pbg.JobServiceServicer):
    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord

    def EnrollHost(
        self, request: pb.EnrollHostRequest, context: grpc.ServicerContext
    ) -> pb.EnrollHostResponse:
        authorize(self.coord, context, "EnrollHost")
        enrolled = _call(
            context,
            lambda: self.coord.enroll(
                request.host_id, request.rack, dict(request.labels), request.remove
            ),
        )
        return pb.EnrollHostResponse(host_id=request.host_id, enrolled=enrolled)

    def ListHosts(
        self, request: pb.ListHostsRequest, context: grpc.ServicerContext
    ) -> pb.ListHostsResponse:
        authorize(self.coord, context, "ListHosts")
        hosts = _call(context, self.coord.inventory)
        return pb.ListHostsResponse(
            hosts=[pb.InventoryHost(**asdict(h)) for h in hosts],
            control_refusals=self.coord.control_refusals,
        )

    def CreateJob(
        self, request: pb.CreateJobRequest, context: grpc.ServicerContext
    ) -> pb.CreateJobResponse:
        authorize(self.coord, context, "CreateJob")
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
        )
        job = _call(context, lambda: self.coord.create_job(spec))
        return pb.CreateJobResponse(
            job_id=job.job_id,
            state=job.state,
            manifest_digest=job.manifest.digest,
            hosts_total=len(job.targets),
        )

    def GetJob(self, request: pb.GetJobRequest, context: grpc.ServicerContext) -> pb.GetJobResponse:
        authorize(self.coord, context, "GetJob")
        return status_to_pb(_call(context, lambda: self.coord.job_status(request.job_id)))

    def CancelJob(
        self, request: pb.CancelJobRequest, context: grpc.ServicerContext
    ) -> pb.CancelJobResponse:
        authorize(self.coord, context, "CancelJob")
        _call(context, lambda: self.coord.cancel_job(request.job_id))
        return pb.CancelJobResponse()


class AgentServicer(pbg.AgentServiceServicer):
    def __init__(self, coord: Coordinator) -> None:
        self.coord = coord

    def WatchJobs(
        self, request: pb.WatchJobsRequest, context: grpc.ServicerContext
    ) -> pb.WatchJobsResponse:
        ident = authorize(self.coord, context, "WatchJobs", request.host_id, request.rack)
        jobs = _call(
            context,
            lambda: self.coord.watch_jobs(
                request.host_id,
                ident.rack,  # the certificate's rack, not a claim
                dict(request.labels),
                request.data_address,
                set(request.known_job_ids),
                list(request.held_versions),
                request.wait_ms / 1000.0,
                health=request.health,
                data_refusals=request.data_refusals,
            ),
        )
        return pb.WatchJobsResponse(jobs=[pb.JobRef(**asdict(j)) for j in jobs])

    def Register(
        self, request: pb.RegisterRequest, context: grpc.ServicerContext
    ) -> pb.RegisterResponse:
        ident = authorize(self.coord, context, "Register", request.host_id, request.rack)
        r = _call(
            context,
            lambda: self.coord.register(
                request.job_id,
                request.host_id,
                ident.rack,
                request.have,
                request.free_disk_bytes,
                request.data_address,
            ),
        )
        return pb.RegisterResponse(**asdict(r))

    def GetAssignment(
        self, request: pb.GetAssignmentRequest, context: grpc.ServicerContext
    ) -> pb.Assignment:
        authorize(self.coord, context, "GetAssignment", request.host_id)
        a = _call(
            context,
            lambda: self.coord.assignment(
                request.job_id,
                request.host_id,
                request.known_topology_version,
                request.wait_ms / 1000.0,
            ),
        )
        return assignment_to_pb(a)

    def ReportProgress(
        self, request: pb.ReportProgressRequest, context: grpc.ServicerContext
    ) -> pb.ReportProgressResponse:
        authorize(self.coord, context, "ReportProgress", request.host_id, request.rack)
        report = report_from_pb(request)
        r = _call(
            context, lambda: self.coord.report_progress(request.job_id, request.host_id, report)
        )
        return pb.ReportProgressResponse(topology_version=r.topology_version, actions=r.actions)

    def ReportSuspect(
        self, request: pb.ReportSuspectRequest, context: grpc.ServicerContext
    ) -> pb.ReportSuspectResponse:
        authorize(self.coord, context, "ReportSuspect", request.reporter)
        r = _call(
            context,
            lambda: self.coord.report_suspect(
                request.job_id,
                request.reporter,
                request.suspect_host,
                request.reason,
                request.stripe,
            ),
        )
        return pb.ReportSuspectResponse(
            topology_version=r.topology_version, new_upstream=_peer(r.new_upstream)
        )

    def FindPeers(
        self, request: pb.FindPeersRequest, context: grpc.ServicerContext
    ) -> pb.FindPeersResponse:
        authorize(self.coord, context, "FindPeers", request.host_id)
        peers = _call(
            context,
            lambda: self.coord.find_peers(
                request.job_id,
                request.host_id,
                request.chunk,
                set(request.exclude),
                request.limit or 3,
            ),
        )
        return pb.FindPeersResponse(peers=[_peer(p) for p in peers])


class CoordinatorServer:
    """Runs the coordinator: gRPC server plus a sweeper thread (dead hosts, handoff)."""

    def __init__(
        self,
        config: CoordinatorConfig,
        listen: str | list[str] = "127.0.0.1:0",
        tick_s: float = 0.5,
        *,
        tls: TlsFiles,
    ) -> None:
        self.coordinator = Coordinator(config)
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=256), options=GRPC_OPTIONS)
        pbg.add_JobServiceServicer_to_server(JobServicer(self.coordinator), self.server)  # type: ignore[no-untyped-call]
        pbg.add_AgentServiceServicer_to_server(AgentServicer(self.coordinator), self.server)  # type: ignore[no-untyped-call]
        self.addresses: list[str] = []
        # mutual TLS on every listener (unix sockets too): no certificate, no RPC
        creds = grpc_server_credentials(tls)
        self.identity = tls.identity()
        if self.identity.role != "coordinator":
            raise AgentError(
                f"{tls.cert} is a {self.identity.role} certificate, not a coordinator's"
            )
        for addr in [listen] if isinstance(listen, str) else listen:
            port = self.server.add_secure_port(addr, creds)
            if port == 0:
                raise AgentError(f"coordinator cannot listen on {addr}")
            self.addresses.append(
                addr if addr.startswith("unix:") else f"{addr.rpartition(':')[0]}:{port}"
            )
        # the first listen address is the one agents are told about
        self.address = self.addresses[0]
        self.tick_s = tick_s
        self._stop = threading.Event()
        self._sweeper = threading.Thread(
            target=self._sweep, name="coordinator-sweeper", daemon=True
        )

    def start(self) -> CoordinatorServer:
        self.coordinator.maintain_lease()  # an HA replica may lead from its first moment
        self.server.start()
        self._sweeper.start()
        log.info("coordinator listening on %s", self.address)
        return self

    def _sweep(self) -> None:
        while not self._stop.wait(self.tick_s):
            try:
                self.coordinator.maintain_lease()
                self.coordinator.tick()
            except Exception:
                log.exception("coordinator tick failed")

    def stop(self, grace: float = 1.0) -> None:
        self._stop.set()
        with self.coordinator.lock:
            self.coordinator.closing = True
            self.coordinator.changed.notify_all()
        self.server.stop(grace).wait()
        self._sweeper.join(timeout=5)
        self.coordinator.release()
        self.coordinator.store.close()

    def wait(self) -> None:
        self.server.wait_for_termination()
