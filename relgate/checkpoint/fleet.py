"""Which fleet a distribution runs on, as typed models: a running fleet service, or a member
of the embedded local fleet.

:class:`FleetService` names a fleet that already runs (its coordinator replicas, the
operator's PKI, the hosts to target); a request with one creates its job there and starts
nothing.  Without one, ``relgate distribute`` starts the embedded local fleet
(:mod:`relgate.checkpoint.local_fleet`), whose agents are :class:`FleetMember` rows.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field
from relgate_trust.job_request import Enrollment

from relgate.errors import RejectedError
from relgate.integrity.contract import Contract
from relgate_agent.errors import AgentError
from relgate_agent.pki import TlsFiles

#: The operator's identity in a fleet PKI directory (``relgate-agent --pki DIR`` layout).
OPERATOR = "operator"
CHECK_OPERATOR_CREDENTIALS = "operator-credentials"
CHECK_COORDINATOR_ADDRESS = "coordinator-address"
CHECK_TARGET_SELECTOR = "target-selector"


class FleetMember(Contract):
    """One agent process of a local fleet, and what the coordinator enrolls for it."""

    host: str
    models_root: str
    pid: int
    host_id: str
    rack: str
    labels: str

    def enrollment(self) -> Enrollment:
        """What the coordinator enrolls for this agent (``JobRequest.serve.enroll``)."""
        return Enrollment(self.host_id, self.rack, Enrollment.parse_labels(self.labels))


class FleetService(Contract):
    """A fleet that already runs: the job is created on its coordinator with the operator's
    certificate and reaches the hosts ``selector`` matches.

    ``coordinators`` are replicas tried in order: a call goes to the first that answers as
    leader (one that is down or not the lease holder answers UNAVAILABLE and the next one is
    tried).  ``pki_dir`` holds ``ca.pem``, ``operator.pem`` and ``operator.key``, the files
    ``relgate-agent --pki DIR`` reads.  ``webhook_url`` is where the coordinator POSTs
    DistributionComplete (the deployer's own endpoint; "" = the coordinator's default)."""

    coordinators: list[str] = Field(default_factory=list)
    pki_dir: str = ""
    selector: str = ""
    webhook_url: str = ""
    #: the origin's data center ("" = the DC with the most target hosts)
    origin_dc: str = ""

    @property
    def address(self) -> str:
        """The replicas as the coordinator client takes them (comma-separated, in order)."""
        return ",".join(self.coordinators)

    def operator_tls(self) -> TlsFiles:
        return TlsFiles.from_pki(self.pki_dir, OPERATOR)

    def check(self) -> None:
        """Refuse (exit 3, naming the check) a service that cannot be asked for a job: no
        coordinator address, no target selector, or operator credentials missing or not an
        operator certificate of a relgate fleet."""
        subject = self.address or "fleet"
        if not self.coordinators or not all(a.strip() for a in self.coordinators):
            raise RejectedError(
                "no coordinator address given for the fleet",
                object=subject,
                check=CHECK_COORDINATOR_ADDRESS,
            )
        if not self.selector.strip():
            raise RejectedError(
                "a job on a running fleet needs a target selector (k=v,...): it never "
                "targets every host by default",
                object=subject,
                check=CHECK_TARGET_SELECTOR,
            )
        tls = self.operator_tls()
        missing = [str(p) for p in (tls.ca, tls.cert, tls.key) if not Path(p).is_file()]
        if not self.pki_dir or missing:
            raise RejectedError(
                "operator credentials missing: " + (", ".join(missing) or "no PKI directory"),
                object=self.pki_dir or subject,
                check=CHECK_OPERATOR_CREDENTIALS,
            )
        try:
            tls.identity()
        except AgentError as exc:
            raise RejectedError(
                f"operator credentials unreadable: {exc}",
                object=str(tls.cert),
                check=CHECK_OPERATOR_CREDENTIALS,
            ) from None
