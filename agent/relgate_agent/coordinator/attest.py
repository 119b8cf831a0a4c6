"""The coordinator's side of a verifiable handoff (:mod:`relgate_agent.attestation`).

A READY report carries the host's signed placement attestation; with the fleet CA known
(a server with its TLS identity) the coordinator checks it (issued by the CA to that host,
for this job's digest, signature valid) and refuses READY with a forged or missing one, so
a deployer never sees a READY host it cannot verify. Attestations are kept per (host,
digest) (``dist_placements``): a host that already holds the digest carries its earlier
one into a later job's events. Every deployer event carries the attestations of the hosts
it names and is signed with the coordinator's certificate key.
"""

from __future__ import annotations

import json
import logging
import time
from typing import Any

from relgate_agent.attestation import (
    CHECK_ATTESTATION_MALFORMED,
    CHECK_ATTESTATION_MISSING,
    CertSigner,
    HandoffError,
    sign_event,
    verify_placement,
)
from relgate_agent.contracts import ProgressReport
from relgate_agent.coordinator.jobstate import HostProgress, JobState, ReadyRefused
from relgate_agent.coordinator.outbox import Seal
from relgate_agent.coordinator.store import JobStore
from relgate_agent.identity.cabundle import BundleRefused, TrustFile

log = logging.getLogger(__name__)
MAX_ATTESTATION_CHARS = 64 << 10


class HandoffSigning:
    """Mixed into the coordinator: its signer and the fleet CA (None: no TLS identity, as
    the in-process simulator runs it; attestations are then kept unchecked and events go
    unsigned, which a deployer's verifier refuses)."""

    store: JobStore
    handoff_signer: CertSigner | None = None
    fleet_ca: TrustFile | None = None

    def use_identity(self, signer: CertSigner, ca: TrustFile) -> None:
        self.handoff_signer, self.fleet_ca = signer, ca

    def _seal(self) -> Seal | None:
        signer = self.handoff_signer
        if signer is None:
            return None
        return lambda event: sign_event(signer, event, int(time.time() * 1000))

    def _accept_attestation(self, job: JobState, hp: HostProgress, report: ProgressReport) -> None:
        """Keep the READY host's attestation; with the fleet CA, only a valid one."""
        raw = report.placement_attestation
        digest = job.manifest.digest
        if self.fleet_ca is not None:
            try:
                if not raw:
                    raise HandoffError("no placement attestation", check=CHECK_ATTESTATION_MISSING)
                if len(raw) > MAX_ATTESTATION_CHARS:
                    raise HandoffError("attestation too large", check=CHECK_ATTESTATION_MALFORMED)
                verify_placement(
                    json.loads(raw),
                    self.fleet_ca.bundle(),  # the bundle now: a rotation may have changed it
                    host_id=hp.host_id,
                    manifest_digest=digest,
                )
            except (HandoffError, BundleRefused, ValueError) as exc:
                check = getattr(exc, "check", CHECK_ATTESTATION_MALFORMED)
                why = f"READY refused: placement attestation ({check}): {exc}"
                job.ready_refusals += 1
                hp.errors.append(why)
                log.warning("job %s: %s from %s", job.job_id, why, hp.host_id)
                raise ReadyRefused(f"{why} (job {job.job_id}, host {hp.host_id})") from exc
        if raw:
            self.store.put_attestation(hp.host_id, digest, raw[:MAX_ATTESTATION_CHARS])


def attestations_for(store: JobStore, job: JobState, hosts: tuple[str, ...]) -> dict[str, Any]:
    """Host -> its attestation of the job's digest, for those of ``hosts`` that sent one."""
    out: dict[str, Any] = {}
    for host, raw in store.attestations(job.manifest.digest, list(hosts)).items():
        try:
            out[host] = json.loads(raw)
        except ValueError:
            continue  # kept unchecked (no CA) and not JSON: the deployer finds it missing
    return out


__all__ = ["HandoffSigning", "attestations_for"]
