"""gRPC clients for the coordinator (used by agents, the CLI and the Dagster Pipes entry)."""

from __future__ import annotations

from typing import Any

from relgate_agent.pki import TlsFiles
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg
from relgate_agent.rpc import FailoverStub


class CoordinatorClient:
    def __init__(self, address: str, tls: TlsFiles) -> None:
        self.address = address  # one address or a comma-separated list of replicas
        self.jobs: Any = FailoverStub(address, pbg.JobServiceStub, tls)

    def close(self) -> None:
        self.jobs.close()

    def create_job(self, timeout: float = 60.0, **spec: Any) -> pb.CreateJobResponse:
        return self.jobs.CreateJob(pb.CreateJobRequest(**spec), timeout=timeout)

    def get_job(self, job_id: str, timeout: float = 10.0) -> pb.GetJobResponse:
        return self.jobs.GetJob(pb.GetJobRequest(job_id=job_id), timeout=timeout)

    def cancel_job(self, job_id: str, timeout: float = 10.0) -> None:
        self.jobs.CancelJob(pb.CancelJobRequest(job_id=job_id), timeout=timeout)

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

    def list_hosts(self, timeout: float = 10.0) -> dict[str, Any]:
        r = self.jobs.ListHosts(pb.ListHostsRequest(), timeout=timeout)
        return {
            "control_refusals": r.control_refusals,
            "hosts": [
                {
                    "host_id": h.host_id,
                    "rack": h.rack,
                    "labels": dict(h.labels),
                    "enrolled": h.enrolled,
                    "last_seen_age_s": h.last_seen_age_s,
                    "live": h.live,
                    "health": h.health,
                    "data_refusals": h.data_refusals,
                }
                for h in r.hosts
            ],
        }


def job_to_dict(resp: pb.GetJobResponse) -> dict[str, Any]:
    return {
        "job_id": resp.job_id,
        "state": resp.state,
        "model": resp.model,
        "version": resp.version,
        "manifest_digest": resp.manifest_digest,
        "hosts_total": resp.hosts_total,
        "hosts_ready": resp.hosts_ready,
        "ready_hosts": list(resp.ready_hosts),
        "bytes_moved": resp.bytes_moved,
        "origin_bytes": resp.origin_bytes,
        "checkpoint_bytes": resp.checkpoint_bytes,
        "stragglers": list(resp.stragglers),
        "eta_s": resp.eta_s,
        "topology_version": resp.topology_version,
        "completion_emitted": resp.completion_emitted,
        "duration_s": resp.duration_s,
        "control_refusals": resp.control_refusals,
        "hosts": [
            {
                "host_id": h.host_id,
                "rack": h.rack,
                "state": h.state,
                "chunks_verified": h.chunks_verified,
                "rx_bytes": h.rx_bytes,
                "tx_bytes": h.tx_bytes,
                "origin_bytes": h.origin_bytes,
                "errors": list(h.errors),
                "health": h.health,
                "data_refusals": h.data_refusals,
            }
            for h in resp.hosts
        ],
    }
