"""Enrollment by CSR: ``hosts token create``, ``hosts request``, ``hosts pending``,
``hosts approve`` (docs/agent-enrollment.md)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import click
import grpc

from relgate_agent.cli.ca import hosts
from relgate_agent.cli.params import (
    DEFAULT_COORDINATOR,
    TlsArgs,
    common,
    operator_client,
    output,
    tls_options,
)
from relgate_agent.identity.enroll import (
    CHECK_PENDING_REQUEST,
    DEFAULT_TOKEN_TTL_S,
    EnrollRefused,
    check_csr,
)
from relgate_agent.pki import GRPC_TLS_OPTIONS, PkiError
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg

FETCH_POLL_S = 1.0


@hosts.group("token", help="one-time bootstrap tokens for enrollment by CSR")
def token() -> None:
    pass


@token.command("create", help="mint a bootstrap token for HOST-ID (shown once)")
@common
@tls_options
@click.option("--coordinator", default=DEFAULT_COORDINATOR)
@click.option("--host-id", required=True)
@click.option("--rack", required=True, help="the rack its certificate will name")
@click.option("--ttl", type=int, default=DEFAULT_TOKEN_TTL_S, help="seconds until it expires")
def token_create(
    *, pki: str, ca: str, cert: str, key: str, coordinator: str, host_id: str, rack: str, ttl: int
) -> None:

    with operator_client(coordinator, TlsArgs(pki, ca, cert, key)) as c:
        r = c.create_enroll_token(host_id, rack, ttl)
    output().emit(
        {"hostId": r.host_id, "rack": r.rack, "token": r.token, "expiresAt": r.expires_at}
    )


def _enroll_stub(coordinator: str, ca: str) -> tuple[grpc.Channel, Any]:
    """TLS to the enrollment listener, the coordinator checked against ``ca``; no client
    certificate (the host has none yet)."""
    try:
        root = Path(ca).read_bytes()
    except OSError as exc:
        raise PkiError(f"CA file {ca}: {exc}") from exc
    creds = grpc.ssl_channel_credentials(root_certificates=root)
    channel = grpc.secure_channel(coordinator, creds, options=GRPC_TLS_OPTIONS)
    stub: Any = pbg.EnrollServiceStub(channel)  # type: ignore[no-untyped-call]
    return channel, stub


def _fetch(stub: Any, tok: str, host_id: str, wait_s: float) -> str:
    deadline = time.monotonic() + wait_s
    while True:
        r = stub.FetchCert(pb.FetchCertRequest(token=tok, host_id=host_id), timeout=10.0)
        if r.approved or time.monotonic() >= deadline:
            return str(r.cert_pem)
        time.sleep(FETCH_POLL_S)


@hosts.command(
    "request",
    help="make this host's key and CSR, send it with a bootstrap token; with --fetch (or"
    " --wait) write the approved certificate",
)
@common
@click.option("--coordinator", required=True, help="the coordinator's enrollment listener")
@click.option("--ca", required=True, help="the fleet CA certificate (checks the coordinator)")
@click.option("--token", "tok", required=True)
@click.option("--host-id", required=True)
@click.option("--rack", required=True)
@click.option("--out-dir", required=True, help="where <host-id>.key/.pem and ca.pem go")
@click.option("--fetch", is_flag=True, help="only fetch the certificate of an earlier request")
@click.option("--wait", "wait_s", type=float, default=0.0, help="seconds to wait for approval")
def hosts_request(
    *,
    coordinator: str,
    ca: str,
    tok: str,
    host_id: str,
    rack: str,
    out_dir: str,
    fetch: bool,
    wait_s: float,
) -> None:
    from relgate_trust.fstree import write_file_atomic

    from relgate_agent.identity.enroll import make_csr

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    channel, stub = _enroll_stub(coordinator, ca)
    try:
        if not fetch:
            csr = make_csr(host_id, rack, out)  # the key stays in out_dir, never sent
            write_file_atomic(out / f"{host_id}.csr", csr, 0o644)
            stub.SubmitCsr(
                pb.SubmitCsrRequest(token=tok, host_id=host_id, csr_pem=csr.decode()),
                timeout=10.0,
            )
        elif not (out / f"{host_id}.key").exists():
            raise PkiError(f"no key {out / f'{host_id}.key'}: run hosts request first")
        cert = _fetch(stub, tok, host_id, wait_s) if (fetch or wait_s > 0) else ""
    finally:
        channel.close()
    result: dict[str, object] = {"hostId": host_id, "rack": rack, "approved": bool(cert)}
    if cert:
        write_file_atomic(out / f"{host_id}.pem", cert.encode(), 0o644)
        write_file_atomic(out / "ca.pem", Path(ca).read_bytes(), 0o644)
        result["cert"] = str(out / f"{host_id}.pem")
    result["key"] = str(out / f"{host_id}.key")
    output().emit(result)


@hosts.command("pending", help="CSRs waiting for approval")
@common
@tls_options
@click.option("--coordinator", default=DEFAULT_COORDINATOR)
def hosts_pending(pki: str, ca: str, cert: str, key: str, coordinator: str) -> None:

    with operator_client(coordinator, TlsArgs(pki, ca, cert, key)) as c:
        pending = c.enroll_requests()
    output().emit(
        {
            "pending": [
                {"hostId": p.host_id, "rack": p.rack, "requestedAt": p.requested_at}
                for p in pending
            ]
        }
    )


@hosts.command("approve", help="sign HOST-ID's pending CSR with the fleet CA (--ca-dir)")
@common
@tls_options
@click.option("--coordinator", default=DEFAULT_COORDINATOR)
@click.option("--host-id", required=True)
@click.option("--ca-dir", required=True, help="the CA directory (ca.pem + ca.key)")
@click.option("--validity-hours", type=float, default=72.0)
def hosts_approve(
    *,
    pki: str,
    ca: str,
    cert: str,
    key: str,
    coordinator: str,
    host_id: str,
    ca_dir: str,
    validity_hours: float,
) -> None:
    from relgate_agent.pki import issue_for_csr

    with operator_client(coordinator, TlsArgs(pki, ca, cert, key)) as c:
        found = [p for p in c.enroll_requests() if p.host_id == host_id]
        if not found:
            raise EnrollRefused(
                f"host {host_id} has no pending request", check=CHECK_PENDING_REQUEST
            )
        req = found[0]
        csr = check_csr(req.csr_pem.encode(), req.host_id, req.rack)  # checked again here
        pem = issue_for_csr(Path(ca_dir), csr, req.host_id, req.rack, validity_hours)
        r = c.approve_enrollment(host_id, pem.decode())
    output().emit({"hostId": host_id, "rack": req.rack, "serial": r.serial, "approved": True})
