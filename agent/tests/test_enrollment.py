"""Enrollment by CSR against a real coordinator process over real TLS: token -> request ->
approve -> fetch, and each refusal with the check it names (docs/agent-enrollment.md)."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_harness import Cluster
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import NameOID

from relgate_agent.cli import EXIT_OK, EXIT_REJECTED, main
from relgate_agent.cli.enroll import _enroll_stub
from relgate_agent.client import CoordinatorClient
from relgate_agent.identity.authz import rpc_check
from relgate_agent.pki import (
    CA_CERT,
    Identity,
    TlsFiles,
    data_server_context,
    identity_from_pem,
    identity_uri,
)
from relgate_agent.proto import distribution_pb2 as pb


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, dict[str, Any]]:
    rc = main(list(argv))
    out = capsys.readouterr().out.strip().splitlines()
    return rc, json.loads(out[-1]) if out else {}


@pytest.fixture
def fleet(cluster: Cluster) -> dict[str, Any]:
    cluster.start_coordinator(extra=["--enroll-listen", "127.0.0.1:0"])
    enroll = cluster.coordinator_info["enroll"]
    assert enroll
    pki = cluster.pki
    op = ["--json", "--coordinator", cluster.coordinator, "--pki", str(pki)]
    return {"pki": pki, "op": op, "enroll": enroll, "ca": str(pki / CA_CERT)}


def cluster_client(fleet: dict[str, Any]) -> CoordinatorClient:
    return CoordinatorClient(fleet["op"][2], TlsFiles.from_pki(fleet["pki"], "operator"))


def _token(
    capsys: pytest.CaptureFixture[str], fleet: dict[str, Any], host: str, ttl: int = 600
) -> str:
    rc, out = _run(
        capsys,
        "hosts", "token", "create", *fleet["op"], "--host-id", host, "--rack", "r1", "--ttl", str(ttl),
    )  # fmt: skip
    assert rc == EXIT_OK, out
    return str(out["token"])


def _request(
    capsys: pytest.CaptureFixture[str], fleet: dict[str, Any], token: str, host: str, out_dir: Path,
    *extra: str,
) -> tuple[int, dict[str, Any]]:  # fmt: skip
    return _run(
        capsys,
        "hosts", "request", "--json", "--coordinator", fleet["enroll"], "--ca", fleet["ca"],
        "--token", token, "--host-id", host, "--rack", "r1", "--out-dir", str(out_dir), *extra,
    )  # fmt: skip


def test_token_request_approve_fetch_gives_a_working_host_identity(
    capsys: pytest.CaptureFixture[str], fleet: dict[str, Any], tmp_path: Path
) -> None:
    token = _token(capsys, fleet, "h-new")
    out_dir = tmp_path / "h-new"
    rc, out = _request(capsys, fleet, token, "h-new", out_dir)
    assert rc == EXIT_OK and out["approved"] is False, out
    key_before = (out_dir / "h-new.key").read_bytes()

    rc, out = _run(capsys, "hosts", "pending", *fleet["op"])
    assert rc == EXIT_OK and [p["hostId"] for p in out["pending"]] == ["h-new"]

    rc, out = _run(
        capsys,
        "hosts",
        "approve",
        *fleet["op"],
        "--host-id",
        "h-new",
        "--ca-dir",
        str(fleet["pki"]),
    )
    assert rc == EXIT_OK and out["serial"], out
    rc, out = _run(capsys, "hosts", "pending", *fleet["op"])
    assert out["pending"] == []

    rc, out = _request(capsys, fleet, token, "h-new", out_dir, "--fetch")
    assert rc == EXIT_OK and out["approved"] is True, out
    assert (out_dir / "h-new.key").read_bytes() == key_before  # the key never moved
    pem = (out_dir / "h-new.pem").read_bytes()
    ca = x509.load_pem_x509_certificate((fleet["pki"] / CA_CERT).read_bytes())
    cert = x509.load_pem_x509_certificate(pem)
    cert.verify_directly_issued_by(ca)
    want = Identity("host", "h-new", "r1")
    assert identity_from_pem(pem) == want
    # the same profile as ``ca issue --role host``
    ref = x509.load_pem_x509_certificate((fleet["pki"] / "coordinator.pem").read_bytes())
    assert cert.subject.rfc4514_string() == "L=r1,CN=h-new,OU=host,O=relgate"
    assert {e.oid for e in cert.extensions} == {e.oid for e in ref.extensions}
    tls = TlsFiles(out_dir / CA_CERT, out_dir / "h-new.pem", out_dir / "h-new.key")
    assert tls.identity() == want
    data_server_context(tls)  # certificate and key load together: agent serve can use them
    assert rpc_check("Watch", want, "h-new", "r1") is None


def test_a_used_token_is_refused(
    capsys: pytest.CaptureFixture[str], fleet: dict[str, Any], tmp_path: Path
) -> None:
    token = _token(capsys, fleet, "h-once")
    assert _request(capsys, fleet, token, "h-once", tmp_path / "a")[0] == EXIT_OK
    rc, out = _request(capsys, fleet, token, "h-once", tmp_path / "b")
    assert (rc, out["check"]) == (EXIT_REJECTED, "bootstrap-token"), out


def test_an_expired_or_unknown_token_is_refused(
    capsys: pytest.CaptureFixture[str], fleet: dict[str, Any], tmp_path: Path
) -> None:
    token = _token(capsys, fleet, "h-late", ttl=1)
    time.sleep(2.1)
    rc, out = _request(capsys, fleet, token, "h-late", tmp_path / "a")
    assert (rc, out["check"]) == (EXIT_REJECTED, "bootstrap-token"), out
    rc, out = _request(capsys, fleet, "not-a-token", "h-late", tmp_path / "b")
    assert (rc, out["check"]) == (EXIT_REJECTED, "bootstrap-token"), out


def test_a_csr_for_another_host_is_refused(
    capsys: pytest.CaptureFixture[str], fleet: dict[str, Any], tmp_path: Path
) -> None:
    token = _token(capsys, fleet, "h-mine")
    rc, out = _request(capsys, fleet, token, "h-other", tmp_path / "a")
    assert (rc, out["check"]) == (EXIT_REJECTED, "csr-subject"), out
    # a CSR naming another host, sent with this host id, is refused the same way
    from relgate_agent.identity.enroll import make_csr

    csr = make_csr("h-other", "r1", tmp_path)
    channel, stub = _enroll_stub(fleet["enroll"], fleet["ca"])
    try:
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitCsr(pb.SubmitCsrRequest(token=token, host_id="h-mine", csr_pem=csr.decode()))
        assert dict(err.value.trailing_metadata())["relgate-check"] == "csr-subject"
        # an RSA key is not allowed, even with the right subject
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        name = [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "relgate"),
            x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, "host"),
            x509.NameAttribute(NameOID.COMMON_NAME, "h-mine"),
            x509.NameAttribute(NameOID.LOCALITY_NAME, "r1"),
        ]
        san = x509.SubjectAlternativeName(
            [x509.UniformResourceIdentifier(identity_uri("host", "h-mine", "r1"))]
        )
        rsa_csr = (
            x509.CertificateSigningRequestBuilder()
            .subject_name(x509.Name(name))
            .add_extension(san, critical=False)
            .sign(key, hashes.SHA256())
        ).public_bytes(serialization.Encoding.PEM)
        with pytest.raises(grpc.RpcError) as err:
            stub.SubmitCsr(
                pb.SubmitCsrRequest(token=token, host_id="h-mine", csr_pem=rsa_csr.decode())
            )
        assert dict(err.value.trailing_metadata())["relgate-check"] == "csr-key"
    finally:
        channel.close()


def test_approving_a_host_with_no_pending_request_is_refused(
    capsys: pytest.CaptureFixture[str], fleet: dict[str, Any]
) -> None:
    rc, out = _run(
        capsys,
        "hosts",
        "approve",
        *fleet["op"],
        "--host-id",
        "h-none",
        "--ca-dir",
        str(fleet["pki"]),
    )
    assert (rc, out["check"]) == (EXIT_REJECTED, "pending-request"), out
    # the coordinator refuses it too (an operator calling the RPC directly)
    c = cluster_client(fleet)
    try:
        with pytest.raises(grpc.RpcError) as err:
            c.approve_enrollment("h-none", (fleet["pki"] / "operator.pem").read_text())
        assert dict(err.value.trailing_metadata())["relgate-check"] == "pending-request"
    finally:
        c.close()


def test_the_enrollment_listener_serves_nothing_else(fleet: dict[str, Any]) -> None:
    """No client certificate there, so no operator or agent RPC either."""
    from relgate_agent.proto import distribution_pb2_grpc as pbg

    channel, _ = _enroll_stub(fleet["enroll"], fleet["ca"])
    try:
        jobs: Any = pbg.JobServiceStub(channel)  # type: ignore[no-untyped-call]
        with pytest.raises(grpc.RpcError) as err:
            jobs.ListEnrollRequests(pb.ListEnrollRequestsRequest(), timeout=10)
        assert err.value.code() == grpc.StatusCode.UNIMPLEMENTED
    finally:
        channel.close()
