"""Distribution: fan a published checkpoint out to a fleet and wait for the handoff.

One :class:`DistributionRequest` describes the fan-out; :func:`distribution_session` builds
the coordinator job's extras exactly once, for either runner: :func:`distribute` runs the job
in this process (``relgate distribute``), the Dagster asset hands the same extras to
``relgate-agent pipes`` through Dagster Pipes.

Two fleets: a running one (``request.fleet``, a :class:`FleetService`), where the job is
created on its coordinator with the operator's credentials and nothing is started; or, by
default, the embedded local fleet: the deployer's webhook sink, agents on loopback and an
in-process coordinator (:mod:`relgate.checkpoint.local_fleet`, imported only on that path).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from typing import TYPE_CHECKING

import grpc
from pydantic import Field, JsonValue, model_validator
from relgate_trust.datacenter import rack_dc
from relgate_trust.job_request import JobRequest, JobSpec, ServeSpec

from relgate.checkpoint.fleet import FleetMember, FleetService
from relgate.checkpoint.location import ENVELOPE_NAME, ORIGIN_NAME, validate_names, version_dir
from relgate.errors import RejectedError, RelgateError
from relgate.integrity.contract import Contract, JsonObject
from relgate.progress import Task, task
from relgate.workspace import Workspace
from relgate_agent.client import CoordinatorRefusal
from relgate_agent.contracts import JobReport
from relgate_agent.errors import KIND_CHUNK_FAILED, AgentError
from relgate_agent.pipes import run_distribution_job

if TYPE_CHECKING:
    from relgate.checkpoint.local_fleet import WebhookSink

POLL_INTERVAL_S = 0.5
#: How long the deployer waits for DistributionComplete after the job ended.
WEBHOOK_WAIT_S = 10.0


class DistributionRequest(Contract):
    """Fan ``model/version`` out to the running ``fleet``, or (without one) to ``hosts``
    local agents over ``racks`` racks and ``dcs`` data centers started for the request."""

    model: str
    version: str
    hosts: int
    racks: int
    #: data centers the racks are split into; DC 0 holds the origin, the others are fed
    #: over one compressed WAN edge per stripe (docs/distribution-design.md, Topology)
    dcs: int = Field(default=1, ge=1)
    ready_threshold: float = 1.0
    origin_cap_bytes_per_s: int = 0
    timeout_s: float = 600.0
    #: a running fleet to create the job on (None: start the embedded local fleet)
    fleet: FleetService | None = None

    @model_validator(mode="after")
    def _a_rack_per_dc(self) -> DistributionRequest:
        if self.dcs > self.racks:
            raise ValueError(f"{self.dcs} data centers need at least as many racks ({self.racks})")
        return self

    @property
    def subject(self) -> str:
        return f"{self.model}/{self.version}"


class DistributionResult(Contract):
    """The coordinator's final job status (the agent's snake_case status object), the
    DistributionComplete event the deployer's webhook received (None if none did), and the
    local fleet the job ran on; on a running fleet, its coordinator replicas instead (the
    event goes to the deployer's own endpoint, and there are no local members)."""

    status: dict[str, JsonValue]
    distribution_complete: dict[str, JsonValue] | None
    fleet: list[FleetMember]
    coordinator: str = ""

    @property
    def complete(self) -> bool:
        """Local fleet: the webhook received DistributionComplete. Running fleet: the job
        ended DONE with the ready threshold met (its webhook is not ours to read)."""
        if self.coordinator:
            return self.status.get("state") == "DONE" and bool(self.status.get("threshold_met"))
        return self.distribution_complete is not None


@dataclass(frozen=True)
class DistributionSession:
    """The job one request runs, and (embedded local fleet only) the agents and webhook sink
    started for it."""

    request: DistributionRequest
    job: JobRequest
    fleet: list[FleetMember]
    sink: WebhookSink | None = None

    def await_complete(self, timeout_s: float = WEBHOOK_WAIT_S) -> JsonObject | None:
        """The DistributionComplete event, waiting up to ``timeout_s`` after the job ended
        (None on a running fleet: the event goes to the deployer's own endpoint)."""
        return self.sink.first_event(timeout_s) if self.sink is not None else None


def _job_spec(
    ws: Workspace, request: DistributionRequest, *, selector: str, webhook_url: str, origin_dc: str
) -> JobSpec:
    """The job as the coordinator stores it: the published version to the hosts
    ``selector`` matches."""
    target = version_dir(ws, request.model, request.version)
    return JobSpec(
        model=request.model,
        version=request.version,
        manifest_uri=str(target / ENVELOPE_NAME),
        origin_uri=str(target / ORIGIN_NAME),
        target_selector=selector,
        origin_cap_bytes_per_s=request.origin_cap_bytes_per_s,
        ready_threshold_ppm=round(request.ready_threshold * 1_000_000),
        webhook_url=webhook_url,
        origin_dc=origin_dc,
    )


def _service_job_request(
    ws: Workspace, request: DistributionRequest, fleet: FleetService
) -> JobRequest:
    """The job created on a running fleet's coordinator with the operator's credentials (no
    coordinator served here, no agents started)."""
    job = _job_spec(
        ws,
        request,
        selector=fleet.selector,
        webhook_url=fleet.webhook_url,
        origin_dc=fleet.origin_dc,
    )
    return JobRequest(
        job=job,
        pki=fleet.pki_dir,
        ready_threshold=request.ready_threshold,
        coordinator=fleet.address,
        poll_interval_s=POLL_INTERVAL_S,
        timeout_s=request.timeout_s,
        wait_for_all=True,
    )


def _job_request(
    ws: Workspace,
    request: DistributionRequest,
    *,
    address: str,
    label: str,
    fleet: list[FleetMember],
    webhook_url: str,
) -> JobRequest:
    """The coordinator job this request runs: on the fleet ``label`` names, served in
    process at ``address`` for the job's life."""
    job = _job_spec(
        ws,
        request,
        selector=label,
        webhook_url=webhook_url,
        origin_dc=rack_dc(0, request.racks, request.dcs),
    )
    serve = ServeSpec(
        db=str(ws.home / "coordinator.sqlite"),
        trusted_keys=tuple(str(k) for k in ws.config["keys"]["trusted"]),
        listen=address,
        min_hosts=request.hosts,
        enroll=tuple(m.enrollment() for m in fleet),
    )
    return JobRequest(
        job=job,
        pki=str(ws.home / "pki"),
        ready_threshold=request.ready_threshold,
        serve=serve,
        poll_interval_s=POLL_INTERVAL_S,
        timeout_s=request.timeout_s,
        wait_for_all=True,
    )


@contextmanager
def distribution_session(
    ws: Workspace, request: DistributionRequest
) -> Iterator[DistributionSession]:
    """Check the version is published, yield the job's extras: on ``request.fleet`` (its
    operator credentials checked first) with nothing started, else on the embedded local
    fleet (:func:`_local_session`)."""
    validate_names(request.model, request.version)
    if not (version_dir(ws, request.model, request.version) / ENVELOPE_NAME).exists():
        raise RejectedError(
            "checkpoint version is not published",
            object=request.subject,
            check="checkpoint-published",
        )
    if request.fleet is not None:
        request.fleet.check()
        yield DistributionSession(request, _service_job_request(ws, request, request.fleet), [])
        return
    with _local_session(ws, request) as session:
        yield session


@contextmanager
def _local_session(ws: Workspace, request: DistributionRequest) -> Iterator[DistributionSession]:
    """Start the sink and the embedded local fleet, yield the job's extras.

    The job targets exactly the agents started here: hosts from earlier runs stay in the
    coordinator's store but do not carry this run's label.  Every agent is stopped by PID
    and the sink closed on exit.
    """
    # the harness is imported on this path only: a running fleet never needs it
    from relgate.checkpoint.local_fleet import (  # noqa: PLC0415
        WebhookSink,
        free_port,
        local_fleet,
        new_fleet_label,
    )

    address = f"127.0.0.1:{free_port()}"
    label = new_fleet_label()
    # the deployer's side checks the coordinator's signature and every placement
    # attestation against the fleet CA (the dev PKI local_fleet uses)
    sink = WebhookSink(ca=ws.home / "pki" / "ca.pem")
    try:
        with local_fleet(
            ws,
            hosts=request.hosts,
            racks=request.racks,
            coordinator=address,
            labels=label,
            dcs=request.dcs,
        ) as fleet:
            job = _job_request(
                ws, request, address=address, label=label, fleet=fleet, webhook_url=sink.url
            )
            yield DistributionSession(request, job, fleet, sink)
    finally:
        sink.close()


def _run_job(session: DistributionSession, log: Callable[[str], None]) -> dict[str, JsonValue]:
    """Run the job in this process; refusals and failures become relgate errors."""
    subject = session.request.subject
    try:
        with ExitStack() as bars:
            watch = DistributionBars(bars)
            status: dict[str, JsonValue] = run_distribution_job(session.job, log, watch)
    except CoordinatorRefusal as exc:
        raise RejectedError(exc.details, object=subject, check=exc.check) from None
    except AgentError as exc:
        raise RelgateError(str(exc), object=subject, check="distribution-deadline") from None
    except grpc.RpcError as exc:
        # no replica answered as leader (down, not the lease holder, or not ours: TLS)
        # or one refused the operator (PERMISSION_DENIED)
        code = exc.code().name if hasattr(exc, "code") else "UNKNOWN"
        details = exc.details() if hasattr(exc, "details") else str(exc)
        raise RejectedError(
            f"coordinator {session.job.coordinator or 'in process'}: {code}: {details}",
            object=session.job.coordinator or subject,
            check="coordinator-leader" if code != "PERMISSION_DENIED" else "operator-credentials",
        ) from None
    if status["state"] == "FAILED":
        error = str(status.get("error") or "job FAILED")
        digest = status.get("manifest_digest")
        raise RejectedError(
            error,
            object=subject,
            check="chunk-verification" if KIND_CHUNK_FAILED in error else "placement-verification",
            digest=str(digest) if digest else None,
            details={"job": status["job_id"]},
        )
    return status


class DistributionBars:
    """A running job as three :mod:`relgate.progress` tasks: hosts READY, bytes moved over
    every host's copy, origin bytes over one copy (the ~1x the design promises). They begin
    with the first status that names the fleet and the checkpoint (the totals) and advance by
    what each later poll added, capped at the total."""

    FIELDS = (
        ("hosts ready", "hosts_ready"),
        ("bytes moved", "bytes_moved"),
        ("origin bytes (1x = one copy)", "origin_bytes"),
    )

    def __init__(self, stack: ExitStack) -> None:
        self.stack = stack
        self.tasks: list[tuple[Task, str, int]] = []
        self.seen: dict[str, int] = {}

    def __call__(self, status: JobReport) -> None:
        if not self.tasks:
            if status.hosts_total <= 0 or status.checkpoint_bytes <= 0:
                return
            totals = (
                status.hosts_total,
                status.hosts_total * status.checkpoint_bytes,
                status.checkpoint_bytes,
            )
            for (label, field), total in zip(self.FIELDS, totals, strict=True):
                self.tasks.append((self.stack.enter_context(task(label, total)), field, total))
        for bar, field, total in self.tasks:
            value = min(int(getattr(status, field)), total)
            if value > self.seen.get(field, 0):
                bar.advance(value - self.seen.get(field, 0))
                self.seen[field] = value


def distribute(
    ws: Workspace, request: DistributionRequest, *, log: Callable[[str], None] = print
) -> DistributionResult:
    """Fan a published checkpoint out to the request's fleet and wait for the handoff
    (and, on the embedded local fleet, for DistributionComplete at the webhook sink)."""
    with distribution_session(ws, request) as session:
        status = _run_job(session, log)
        return DistributionResult(
            status=status,
            distribution_complete=session.await_complete(),
            fleet=session.fleet,
            coordinator=session.job.coordinator,
        )
