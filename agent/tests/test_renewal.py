"""Certificate renewal over the authenticated channel (docs/agent-renewal.md): agents renew
while a job's bytes flow, load the new certificate without a restart (same PID), present it
on their next calls and data-plane handshakes, and the job ends DONE byte-exact."""

from __future__ import annotations

import re
import socket
import ssl
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_harness import Cluster, assert_placed, job_spec

from relgate_agent.agent.renew import serial_of
from relgate_agent.client import sent_check
from relgate_agent.coordinator.renewal import CHECK_RENEWAL_SIGNER, RenewalRefused, Renewals
from relgate_agent.identity.enroll import CHECK_CSR_SUBJECT, make_csr
from relgate_agent.pki import CA_CERT, ROLE_HOST, Identity, ca_init, data_client_context
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg
from relgate_agent.rpc import FailoverStub

WAIT_S = 60  # bounded waits
HOSTS = {"h1": "r1", "h2": "r1"}
RENEWED = re.compile(r"renewed host:(\w+)@\w+: presented serial (\w+), issued serial (\w+)")


def _renewals(cluster: Cluster) -> list[tuple[str, str, str]]:
    text = (cluster.base / "logs" / "coordinator.log").read_text(errors="replace")
    return RENEWED.findall(text)


def _presented_renewed(cluster: Cluster, host: str) -> bool:
    """A renewal call of ``host`` presented a certificate an earlier renewal issued."""
    seen = [r for r in _renewals(cluster) if r[0] == host]
    issued = {i for _, _, i in seen}
    return any(p in issued for _, p, _ in seen)


def _data_plane_serial(cluster: Cluster, host: str) -> str:
    """The serial of the certificate ``host``'s data plane presents to a new handshake."""
    ctx = data_client_context(cluster.tls("operator"))
    addr, _, port = cluster.agents[host]["dataAddress"].rpartition(":")
    with (
        socket.create_connection((addr, int(port)), timeout=10) as raw,
        ctx.wrap_socket(raw) as conn,
    ):
        der = conn.getpeercert(binary_form=True)
    assert der is not None
    return serial_of(ssl.DER_cert_to_PEM_cert(der).encode("ascii"))


def test_agents_renew_while_a_job_runs(cluster: Cluster, checkpoint: dict[str, Any]) -> None:
    cluster.enrolled.update({h: (r, "cluster=inf-a") for h, r in HOSTS.items()})
    pki = cluster.pki
    first = {h: serial_of((pki / f"{h}.pem").read_bytes()) for h in HOSTS}
    # renewed certificates live 2 h; agents renew with 100 h left: at once, then every
    # few seconds, so renewals happen while the job's bytes flow
    cluster.start_coordinator(extra=["--ca-dir", str(pki), "--renew-validity", "2"])
    for h, r in HOSTS.items():
        cluster.start_agent(h, r, extra_args=["--renew-before", "100", "--max-rate", "3000000"])
    pids = {h: cluster.agents[h]["pid"] for h in HOSTS}
    job_id = cluster.create_full_job(len(HOSTS), "renew-1", **job_spec(checkpoint))
    cluster.wait_for(
        lambda: cluster.status(job_id)["state"] == "DONE", WAIT_S, f"{job_id} DONE", interval=0.5
    )
    for h in HOSTS:
        cluster.wait_for(lambda h=h: _presented_renewed(cluster, h), WAIT_S, f"{h} renewed")
        assert_placed(cluster, checkpoint, h)
        on_disk = serial_of((pki / f"{h}.pem").read_bytes())
        issued = {i for host, _, i in _renewals(cluster) if host == h}
        assert on_disk != first[h] and on_disk in issued
        assert _data_plane_serial(cluster, h) in issued
        assert (pki / f"{h}.key").stat().st_mode & 0o777 == 0o600
        assert cluster.procs[h].poll() is None and cluster.procs[h].pid == pids[h]
        log = (cluster.base / "logs" / f"{h}.log").read_text(errors="replace")
        assert "certificate renewed" in log and "certificate renewal failed" not in log


def test_a_renewal_for_another_host_is_refused(cluster: Cluster, tmp_path: Path) -> None:
    cluster.enrolled.update({h: (r, "cluster=inf-a") for h, r in HOSTS.items()})
    pki = cluster.pki
    cluster.start_coordinator(extra=["--ca-dir", str(pki)])
    stub: Any = FailoverStub(cluster.coordinator, pbg.AgentServiceStub, cluster.tls("h1"))
    try:
        other = make_csr("h2", "r1", tmp_path).decode("ascii")
        with pytest.raises(grpc.RpcError) as refused:
            stub.RenewCert(pb.RenewCertRequest(host_id="h1", rack="r1", csr_pem=other), timeout=10)
        assert sent_check(refused.value) == CHECK_CSR_SUBJECT
        own = make_csr("h1", "r1", tmp_path).decode("ascii")
        resp = stub.RenewCert(pb.RenewCertRequest(host_id="h1", rack="r1", csr_pem=own), timeout=10)
        assert resp.serial == serial_of(resp.cert_pem.encode("ascii"))
    finally:
        stub.close()


def test_a_coordinator_without_a_ca_signs_no_renewal(tmp_path: Path) -> None:
    csr = make_csr("h1", "r1", tmp_path).decode("ascii")
    with pytest.raises(RenewalRefused) as refused:
        Renewals().renew(Identity(ROLE_HOST, "h1", "r1"), csr)
    assert refused.value.check == CHECK_RENEWAL_SIGNER


def test_a_ca_dir_of_another_ca_is_refused(tmp_path: Path) -> None:
    ca_init(tmp_path / "fleet")
    ca_init(tmp_path / "other")
    Renewals.check_ca_dir(tmp_path / "fleet", tmp_path / "fleet" / CA_CERT)
    for ca_dir in (tmp_path / "other", tmp_path / "missing"):
        with pytest.raises(RenewalRefused) as refused:
            Renewals.check_ca_dir(ca_dir, tmp_path / "fleet" / CA_CERT)
        assert refused.value.check == CHECK_RENEWAL_SIGNER
