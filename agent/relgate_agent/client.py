"""gRPC clients for the coordinator (used by agents, the CLI and the Dagster Pipes entry)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, fields
from typing import Any, TypeVar

import grpc
from relgate_trust.job_request import JobSpec

from relgate_agent.contracts import (
    HostReason,
    HostRow,
    InventoryHost,
    JobReport,
    JobSummary,
    JobTopology,
    RemovedHost,
    StripeHop,
    StripeView,
)
from relgate_agent.errors import (
    CHECK_METADATA_KEY,
    KIND_CHUNK_FAILED,
    KIND_HOST_FAILED,
    AgentError,
)
from relgate_agent.identity.crlwire import RevocationStub
from relgate_agent.pki import TlsFiles
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg
from relgate_agent.rpc import FailoverStub

T = TypeVar("T")

REJECTED_CODES = (
    grpc.StatusCode.INVALID_ARGUMENT,
    grpc.StatusCode.FAILED_PRECONDITION,
    grpc.StatusCode.NOT_FOUND,
)


class CoordinatorRefusal(AgentError):
    """The coordinator refused an operator call (INVALID_ARGUMENT / FAILED_PRECONDITION /
    NOT_FOUND): a typed error naming the call, the check and the coordinator's reason."""

    def __init__(self, rpc: str, code: str, check: str, details: str) -> None:
        super().__init__(f"{rpc} refused ({check}): {details}")
        self.rpc = rpc
        self.code = code
        self.check = check
        self.details = details

    def to_json(self) -> dict[str, Any]:
        return {
            "error": "rejected",
            "rpc": self.rpc,
            "code": self.code,
            "check": self.check,
            "message": self.details,
        }


def sent_check(exc: grpc.RpcError) -> str:
    """The check the coordinator named in the refusal's trailing metadata ("" none)."""
    metadata = exc.trailing_metadata() if hasattr(exc, "trailing_metadata") else None
    for key, value in metadata or ():
        if key == CHECK_METADATA_KEY and isinstance(value, str) and value:
            return value
    return ""


def refusal_check(exc: grpc.RpcError, code: grpc.StatusCode) -> str:
    """The check the coordinator named in the refusal's trailing metadata."""
    return sent_check(exc) or (
        "job-not-found" if code == grpc.StatusCode.NOT_FOUND else "coordinator-validation"
    )


def typed_call(rpc: str, fn: Callable[[], T]) -> T:
    """Run a coordinator call; a refusal becomes CoordinatorRefusal (never raw RpcError text)."""
    try:
        return fn()
    except grpc.RpcError as exc:
        code = exc.code() if hasattr(exc, "code") else None
        if code in REJECTED_CODES:
            details = str(exc.details() or "") if hasattr(exc, "details") else ""
            raise CoordinatorRefusal(rpc, code.name, refusal_check(exc, code), details) from None
        raise


class CoordinatorClient:
    def __init__(self, address: str, tls: TlsFiles) -> None:
        self.address = address  # one address or a comma-separated list of replicas
        self.tls = tls
        self.jobs: Any = FailoverStub(address, pbg.JobServiceStub, tls)

    def close(self) -> None:
        self.jobs.close()

    def create(self, spec: JobSpec, timeout: float = 60.0) -> pb.CreateJobResponse:
        request = pb.CreateJobRequest(
            model=spec.model,
            version=spec.version,
            manifest_uri=spec.manifest_uri,
            origin_uri=spec.origin_uri,
            target_selector=spec.target_selector,
            priority=spec.priority,
            origin_cap_bytes_per_s=spec.origin_cap_bytes_per_s,
            ready_threshold_ppm=spec.ready_threshold_ppm,
            deadline_s=spec.deadline_s,
            stripes=spec.stripes,
            webhook_url=spec.webhook_url,
            job_id=spec.job_id,
            origin_dc=spec.origin_dc,
        )
        resp: pb.CreateJobResponse = typed_call(
            "CreateJob", lambda: self.jobs.CreateJob(request, timeout=timeout)
        )
        return resp

    def create_job(self, timeout: float = 60.0, **fields: Any) -> pb.CreateJobResponse:
        """:meth:`create` with the spec's fields as keywords (unknown ones are refused)."""
        return self.create(JobSpec(**fields), timeout)

    def get_job(self, job_id: str, timeout: float = 10.0) -> pb.GetJobResponse:
        resp: pb.GetJobResponse = self.jobs.GetJob(pb.GetJobRequest(job_id=job_id), timeout=timeout)
        return resp

    def list_jobs(self, state: str = "", timeout: float = 10.0) -> list[JobSummary]:
        """Every job the coordinator knows, oldest first (``state``: only those)."""
        r = self.jobs.ListJobs(pb.ListJobsRequest(state=state), timeout=timeout)
        return [
            JobSummary(
                job_id=j.job_id,
                model=j.model,
                version=j.version,
                state=j.state,
                hosts_total=j.hosts_total,
                hosts_ready=j.hosts_ready,
                created_at=j.created_at,
                leader_replica=j.leader_replica,
                leader_epoch=j.leader_epoch,
            )
            for j in r.jobs
        ]

    def job_topology(self, job_id: str, timeout: float = 10.0) -> JobTopology:
        """The job's current striped chains with each hop's rate and bytes done."""
        r = self.jobs.GetJobTopology(pb.GetJobTopologyRequest(job_id=job_id), timeout=timeout)
        return topology_from_pb(r)

    def cancel_job(self, job_id: str, timeout: float = 10.0) -> pb.CancelJobResponse:
        """Cancel; the answer names the hosts that had placed the version by then."""
        resp: pb.CancelJobResponse = self.jobs.CancelJob(
            pb.CancelJobRequest(job_id=job_id), timeout=timeout
        )
        return resp

    def evict_host(
        self, job_id: str, host_id: str, reason: str, timeout: float = 10.0
    ) -> pb.EvictHostResponse:
        """Remove a target from a job (the job no longer waits for it)."""
        request = pb.EvictHostRequest(job_id=job_id, host_id=host_id, reason=reason)
        resp: pb.EvictHostResponse = typed_call(
            "EvictHost", lambda: self.jobs.EvictHost(request, timeout=timeout)
        )
        return resp

    def revoke_cert(
        self, serial: str = "", host_id: str = "", reason: str = "", timeout: float = 10.0
    ) -> dict[str, Any]:
        """Revoke a certificate by hex serial, or the one ``host_id`` last presented: the
        coordinator refuses it from now on, cuts the host off its jobs and tells the agents."""
        stub: Any = FailoverStub(self.address, RevocationStub, self.tls)
        request = {"serial": serial, "host_id": host_id, "reason": reason}
        try:
            resp: dict[str, Any] = typed_call(
                "RevokeCert", lambda: stub.RevokeCert(request, timeout=timeout)
            )
        finally:
            stub.close()
        return resp

    def clear_host(self, host_id: str, note: str, timeout: float = 10.0) -> pb.ClearHostResponse:
        """Clear a host's health hold (after a scrub): a target of new jobs again."""
        request = pb.ClearHostRequest(host_id=host_id, note=note)
        resp: pb.ClearHostResponse = typed_call(
            "ClearHost", lambda: self.jobs.ClearHost(request, timeout=timeout)
        )
        return resp

    def enroll_host(
        self,
        host_id: str,
        rack: str,
        labels: dict[str, str] | None = None,
        remove: bool = False,
        timeout: float = 10.0,
    ) -> bool:
        r = self.jobs.EnrollHost(
            pb.EnrollHostRequest(host_id=host_id, rack=rack, labels=labels or {}, remove=remove),
            timeout=timeout,
        )
        return bool(r.enrolled)

    def create_enroll_token(
        self, host_id: str, rack: str, ttl_s: int = 0, timeout: float = 10.0
    ) -> pb.CreateEnrollTokenResponse:
        """A one-time bootstrap token for ``host_id`` (enrollment by CSR)."""
        request = pb.CreateEnrollTokenRequest(host_id=host_id, rack=rack, ttl_s=ttl_s)
        resp: pb.CreateEnrollTokenResponse = self.jobs.CreateEnrollToken(request, timeout=timeout)
        return resp

    def enroll_requests(self, timeout: float = 10.0) -> list[pb.EnrollRequest]:
        """CSRs waiting for an operator's approval."""
        r = self.jobs.ListEnrollRequests(pb.ListEnrollRequestsRequest(), timeout=timeout)
        return list(r.pending)

    def approve_enrollment(
        self, host_id: str, cert_pem: str, timeout: float = 10.0
    ) -> pb.ApproveEnrollmentResponse:
        request = pb.ApproveEnrollmentRequest(host_id=host_id, cert_pem=cert_pem)
        resp: pb.ApproveEnrollmentResponse = self.jobs.ApproveEnrollment(request, timeout=timeout)
        return resp

    def list_hosts(self, timeout: float = 10.0) -> Inventory:
        r = self.jobs.ListHosts(pb.ListHostsRequest(), timeout=timeout)
        return Inventory.from_response(r)


@dataclass(frozen=True)
class Inventory:
    control_refusals: int
    hosts: tuple[InventoryHost, ...]

    @classmethod
    def from_response(cls, r: pb.ListHostsResponse) -> Inventory:
        return cls(
            int(r.control_refusals),
            tuple(
                InventoryHost(
                    h.host_id,
                    h.rack,
                    dict(h.labels),
                    h.enrolled,
                    h.last_seen_age_s,
                    h.live,
                    h.health,
                    h.data_refusals,
                    h.hold,
                )
                for h in r.hosts
            ),
        )

    def by_host(self) -> dict[str, InventoryHost]:
        return {h.host_id: h for h in self.hosts}

    def to_json(self) -> dict[str, object]:
        return {
            "controlRefusals": self.control_refusals,
            "hosts": [h.to_json() for h in self.hosts],
        }


def topology_from_pb(r: pb.GetJobTopologyResponse) -> JobTopology:
    return JobTopology(
        job_id=r.job_id,
        state=r.state,
        topology_version=r.topology_version,
        live=r.live,
        stripes=tuple(
            StripeView(
                stripe=s.stripe,
                root=s.root,
                stripe_bytes=s.stripe_bytes,
                hops=tuple(
                    StripeHop(
                        host_id=h.host_id,
                        upstream=h.upstream,
                        downstreams=tuple(h.downstreams),
                        rx_bytes_per_s=h.rx_bytes_per_s,
                        bytes_done=h.bytes_done,
                        bypassed=h.bypassed,
                    )
                    for h in s.hops
                ),
            )
            for s in r.stripes
        ),
    )


def job_from_pb(resp: pb.GetJobResponse) -> JobReport:
    """GetJob's answer as the typed report (``error`` filled in for a FAILED job).

    The message's fields are named as the report's (``status_to_pb`` is the other way)."""
    values = {f.name: getattr(resp, f.name) for f in fields(JobReport) if f.name not in _DERIVED}
    hosts = tuple(
        HostRow(
            **{f.name: getattr(h, f.name) for f in fields(HostRow)}
            | {"errors": tuple(h.errors), "bypassed_stripes": tuple(h.bypassed_stripes)}
        )
        for h in resp.hosts
    )
    return JobReport(
        **values
        | {k: tuple(values[k]) for k in ("ready_hosts", "stragglers", "quarantined_hosts")},
        hosts=hosts,
        error=job_error(resp),
        straggler_reasons=tuple(HostReason(r.host_id, r.reason) for r in resp.straggler_reasons),
        removed_hosts=tuple(
            RemovedHost(r.host_id, r.reason, r.removed_at) for r in resp.removed_hosts
        ),
    )


#: Report fields that are not copied from GetJob's scalars.
_DERIVED = frozenset({"hosts", "error", "straggler_reasons", "removed_hosts"})


def job_to_dict(resp: pb.GetJobResponse) -> dict[str, Any]:
    """GetJob as the snake_case dict the Dagster Pipes entry and the test harness read."""
    return job_from_pb(resp).to_dict()


def job_error(resp: pb.GetJobResponse) -> str:
    """Why a FAILED job failed: the coordinator's reason (the CHUNK_FAILED that ended it,
    naming host, chunk, file and origin object; no target left; every pending host gave
    up), else (a coordinator without it) the first CHUNK_FAILED an agent reported, else
    every host's HOST_FAILED error; "" for other states."""
    if resp.state != "FAILED":
        return ""
    if resp.failure:
        return resp.failure
    for h in resp.hosts:
        for e in h.errors:
            if e.startswith(KIND_CHUNK_FAILED):
                return f"{h.host_id}: {e}"
    host_failed = [
        f"{h.host_id}: {e}" for h in resp.hosts for e in h.errors if e.startswith(KIND_HOST_FAILED)
    ]
    return "; ".join(host_failed) or "job FAILED (no agent error recorded)"
