"""Certificate renewal, the coordinator's part (docs/agent-renewal.md).

A host renews over its mTLS channel (``AgentService.RenewCert``): the call is authenticated
by the host's current certificate, so only a host the fleet CA already certified, and not
expired or revoked, gets here (``Calls.authorize``). The CSR must name exactly the caller's
host id and rack (``csr-subject``) and carry an allowed key (``csr-key``); the new
certificate has the fleet's host profile, for the caller's identity, never the CSR's words.

Signing needs the CA key. A coordinator started without ``--ca-dir`` holds none and refuses
every renewal (``renewal-signer``); with it, it signs renewals only: first enrollment still
takes a bootstrap token and an operator's ``hosts approve``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509

from relgate_agent.identity.enroll import EnrollRefused, cert_matches_csr, check_csr
from relgate_agent.pki import (
    CA_CERT,
    DEFAULT_VALIDITY_H,
    ROLE_HOST,
    Identity,
    issue_for_csr,
)

log = logging.getLogger(__name__)

CHECK_RENEWAL_SIGNER = "renewal-signer"


# a renewal refused, naming its check: the enrollment refusal (same checks, same status)
RenewalRefused = EnrollRefused


@dataclass(frozen=True)
class Renewals:
    """Signs renewals with the CA in ``ca_dir`` (None: this coordinator signs none)."""

    ca_dir: Path | None = None
    validity_h: float = DEFAULT_VALIDITY_H

    def renew(self, caller: Identity, csr_pem: str) -> tuple[str, str]:
        """(certificate PEM, serial hex) for the caller's CSR; else a refusal naming its check."""
        if caller.role != ROLE_HOST:
            raise RenewalRefused(
                f"only a host renews its certificate here, not {caller}", check="agent-role"
            )
        csr = check_csr(csr_pem.encode("utf-8"), caller.name, caller.rack)  # csr-subject
        if self.ca_dir is None:
            raise RenewalRefused(
                "this coordinator signs no renewals (started without --ca-dir)",
                check=CHECK_RENEWAL_SIGNER,
            )
        pem = issue_for_csr(self.ca_dir, csr, caller.name, caller.rack, self.validity_h)
        if not cert_matches_csr(pem, csr):  # the signer's own output, checked all the same
            raise EnrollRefused("the renewed certificate is not for the CSR", check="csr-key")
        serial = format(x509.load_pem_x509_certificate(pem).serial_number, "x")
        return pem.decode("ascii"), serial

    @staticmethod
    def check_ca_dir(ca_dir: Path, fleet_ca: Path) -> None:
        """The CA in ``ca_dir`` must be the fleet's (the coordinator's ``ca.pem``)."""
        try:
            ours = (Path(ca_dir) / CA_CERT).read_bytes().strip()
            fleet = Path(fleet_ca).read_bytes()
        except OSError as exc:
            raise RenewalRefused(f"--ca-dir: {exc}", check=CHECK_RENEWAL_SIGNER) from exc
        if not ours or ours not in fleet:
            raise RenewalRefused(
                f"{ca_dir} holds another CA than the fleet's {fleet_ca}",
                check=CHECK_RENEWAL_SIGNER,
            )


__all__ = ["CHECK_RENEWAL_SIGNER", "RenewalRefused", "Renewals"]
