"""The coordinator's certificate revocation list (coordinator/crl.py, agent/revocations.py),
with real processes on real mutual TLS: mid-job, with bytes flowing (the origin paces the
job), an operator revokes one host by host id; its next call is refused (cert-revoked, CLI
exit 3), it is REMOVED from the job, which ends DONE on the others, and its peers refuse
its data-plane connections with the list they received from the coordinator."""

from __future__ import annotations

import json
from typing import Any

import grpc
import pytest
from agent_harness import Cluster, assert_placed
from test_distribution import create_job
from test_security import channel

from relgate_agent.cli import main
from relgate_agent.dataplane.transport import _connect
from relgate_agent.errors import CHECK_METADATA_KEY
from relgate_agent.identity.certlife import CHECK_CERT_REVOKED, life_of_pem, serial_hex
from relgate_agent.pki import data_client_context
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg

MiB = 1024 * 1024


def _refused_on_data_plane(address: str, ctx: Any, peer: str) -> bool:
    """True when the peer at ``address`` refuses this client, naming cert-revoked."""
    try:
        sock = _connect(address, 5, ctx, peer)
    except Exception as exc:
        return CHECK_CERT_REVOKED in str(exc)
    sock.settimeout(5)
    with sock, sock.makefile("rb") as f:  # one error frame naming the check, then closed
        return CHECK_CERT_REVOKED.encode() in f.read()


def test_a_host_revoked_mid_job_is_refused_cut_off_and_dropped_by_peers(
    cluster: Cluster, checkpoint: dict[str, Any], capsys: pytest.CaptureFixture[str]
) -> None:
    hosts = [(f"h{i:02d}", f"r{i % 2}") for i in range(4)]
    victim, m = "h02", checkpoint["manifest"]
    cluster.start_coordinator()
    cluster.enrolled.update({h: (r, "cluster=inf-a") for h, r in hosts})
    for h, r in hosts:
        cluster.start_agent(h, r, wait=False)
    cluster.wait_started()
    cluster.wait_registered(len(hosts))
    job = create_job(cluster, checkpoint, origin_cap_bytes_per_s=MiB)
    cluster.wait_for(lambda: cluster.journaled(victim, m) > 0, 60, "bytes at the victim")
    assert cluster.journaled(victim, m) < m.num_chunks  # mid-transfer

    op = ["--json", "--coordinator", cluster.coordinator, "--pki", str(cluster.pki)]
    capsys.readouterr()
    rc = main(["hosts", "revoke", "--host-id", victim, "--reason", "stolen disk", *op])
    out = json.loads(capsys.readouterr().out)
    serial = serial_hex(life_of_pem(cluster.tls(victim).cert.read_bytes()).serial)
    assert rc == 0 and out["revoked"] == serial and out["hostId"] == victim
    assert job in out["leftJobs"]
    # --serial and --host-id: exactly one
    assert main(["hosts", "revoke", *op]) == 2
    assert main(["hosts", "revoke", "--host-id", "h99", *op]) == 3  # never seen: by --serial
    assert main(["hosts", "revoke", "--serial", "zz", *op]) == 3

    # its next call is refused, by name, on a fresh channel and from the CLI (exit 3)
    ch = channel(cluster, cluster.tls(victim))
    try:
        with pytest.raises(grpc.RpcError) as exc:
            pbg.AgentServiceStub(ch).Register(
                pb.RegisterRequest(job_id=job, host_id=victim, rack="r0"), timeout=10
            )
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert dict(exc.value.trailing_metadata() or ()).get(CHECK_METADATA_KEY) == (
            CHECK_CERT_REVOKED
        )
    finally:
        ch.close()
    tls = cluster.tls(victim)
    capsys.readouterr()
    as_victim = ["--coordinator", cluster.coordinator, "--ca", str(tls.ca)]
    as_victim += ["--cert", str(tls.cert), "--key", str(tls.key)]
    assert main(["job", "get", job, *as_victim]) == 3
    assert f"check: {CHECK_CERT_REVOKED}" in capsys.readouterr().out

    # the job ends DONE without it
    st = cluster.wait_for(
        lambda: (s := cluster.status(job))["state"] == "DONE" and s, 120, "the job DONE"
    )
    states = {h["host_id"]: h for h in st["hosts"]}
    assert states[victim]["state"] == "REMOVED"
    assert any(CHECK_CERT_REVOKED in e for e in states[victim]["errors"]), states[victim]
    for h, _ in hosts:
        if h != victim:
            assert states[h]["state"] == "READY", (h, states[h])
            assert_placed(cluster, checkpoint, h)

    # every peer refuses its data-plane connections, from the list the coordinator sent
    ctx = data_client_context(tls)
    for h, _ in hosts:
        if h != victim:
            cluster.wait_for(
                lambda h=h: _refused_on_data_plane(cluster.agents[h]["dataAddress"], ctx, h),
                10,
                f"{h} refusing {victim}",
            )
    assert (
        "certificates revoked by the coordinator" in (cluster.base / "logs" / "h00.log").read_text()
    )
