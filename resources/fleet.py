"""Which fleet ``checkpoint_distribution`` reaches: a running fleet service, or (default) the
embedded local fleet started for each materialization.

With ``addresses`` set the asset creates the job on that fleet's coordinator with the
operator's credentials in ``pki_dir`` (the ``relgate-agent pipes`` process gets the
coordinator in its extras and serves nothing) and starts no agent.  Deployments set the
fields from the environment, e.g.
``FleetResource(addresses=[dg.EnvVar("RELGATE_FLEET_COORDINATOR")],
pki_dir=dg.EnvVar("RELGATE_FLEET_PKI"), selector=dg.EnvVar("RELGATE_FLEET_SELECTOR"))``
(docs/fleet-service.md).
"""

from __future__ import annotations

import dagster as dg
from pydantic import Field

from relgate.checkpoint.fleet import FleetService


class FleetResource(dg.ConfigurableResource):  # type: ignore[type-arg]  # Dagster's generic resource base
    """A running fleet's coordinator replicas (tried in order: the first that answers as
    leader), the operator's PKI and the default target selector; no addresses = the
    embedded local fleet."""

    addresses: list[str] = Field(
        default_factory=list,
        description="Coordinator host:port replicas, tried in order ([] = start the embedded"
        " local fleet for each materialization).",
    )
    pki_dir: str = Field(
        default="",
        description="The fleet PKI directory with ca.pem, operator.pem and operator.key.",
    )
    selector: str = Field(
        default="",
        description="The hosts a job targets, as labels k=v,... (required with addresses).",
    )
    webhook_url: str = Field(
        default="",
        description="Where the coordinator POSTs DistributionComplete ('' = its default).",
    )

    def service(self) -> FleetService | None:
        """The running fleet as the core takes it; None for the embedded local fleet."""
        addresses = [a.strip() for a in self.addresses if a and a.strip()]
        if not addresses:
            return None
        return FleetService(
            coordinators=addresses,
            pki_dir=self.pki_dir,
            selector=self.selector,
            webhook_url=self.webhook_url,
        )
