"""Certificates checked for their whole life (identity/certlife.py): a real certificate that expires
while its connections are open, and a revoked one, on the control plane (a coordinator
process) and the data plane (a DataServer and a client on real TLS sockets)."""

from __future__ import annotations

import json
import ssl
import time
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_harness import Cluster
from test_security import agent_stub, channel, control, create, watch  # noqa: F401

from relgate_agent.cli import main
from relgate_agent.dataplane.transport import DataServer, TransportError, _connect
from relgate_agent.errors import CHECK_METADATA_KEY
from relgate_agent.identity import certlife
from relgate_agent.identity.certlife import (
    CHECK_CERT_EXPIRED,
    CHECK_CERT_REVOKED,
    REVOKED_CERTS_FILE,
    life_of_pem,
    serial_hex,
)
from relgate_agent.pki import TlsFiles, data_client_context, data_server_context, issue
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg

LIFE_S = 4.0  # the short-lived certificate's validity
MiB = 1024 * 1024


@pytest.fixture
def db_url(tmp_path: Path) -> str:
    """SQLite only (test_security's own tests cover the stores): the refusals are the
    server's, before any store."""
    return str(tmp_path / "coordinator.sqlite")


def _short_lived(
    cluster: Cluster, host: str, rack: str, out: Path, life_s: float = LIFE_S
) -> TlsFiles:
    """A real host certificate of the fleet CA that expires ``life_s`` from now."""
    cert, key = issue(
        cluster.base / "pki", "host", host_id=host, rack=rack, validity_h=life_s / 3600, out_dir=out
    )
    return TlsFiles(cluster.base / "pki" / "ca.pem", cert, key)


def _check(exc: grpc.RpcError) -> str:
    return dict(exc.trailing_metadata() or ()).get(CHECK_METADATA_KEY, "")


def _host_row(cluster: Cluster, job: str, host: str) -> dict[str, Any]:
    return next(h for h in cluster.status(job)["hosts"] if h["host_id"] == host)


def test_an_expired_certificate_is_refused_on_its_open_connection_and_cut_off(
    control: Cluster,  # noqa: F811 - test_security's fixture
    checkpoint: dict[str, Any],
    tmp_path: Path,
) -> None:
    tls = _short_lived(control, "h00", "r0", tmp_path / "short")
    expires = life_of_pem(tls.cert.read_bytes()).not_after
    ch = channel(control, tls)
    stub = pbg.AgentServiceStub(ch)
    try:
        watch(stub, "h00", "r0")  # live: a target of the next job
        job = create(control, checkpoint).job_id
        stub.Register(pb.RegisterRequest(job_id=job, host_id="h00", rack="r0"), timeout=10)
        stream = stub.Watch(
            pb.WatchRequest(host_id="h00", rack="r0", data_address="127.0.0.1:9"), timeout=60
        )
        next(stream)  # open across the expiry
        time.sleep(max(0.0, expires - time.time()) + 0.2)
        with pytest.raises(grpc.RpcError) as exc:  # the open watch is closed
            for _ in stream:
                pass
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert _check(exc.value) == CHECK_CERT_EXPIRED
        with pytest.raises(grpc.RpcError) as exc:  # every call on the same channel
            stub.ReportProgress(pb.ReportProgressRequest(job_id=job, host_id="h00"), timeout=10)
        assert exc.value.code() == grpc.StatusCode.UNAUTHENTICATED
        assert "expired" in exc.value.details() and _check(exc.value) == CHECK_CERT_EXPIRED
        row = _host_row(control, job, "h00")  # no longer a target the job waits for
        assert row["state"] == "REMOVED"
        assert any(e.startswith(f"REMOVED: {CHECK_CERT_EXPIRED}") for e in row["errors"])
    finally:
        ch.close()


def test_a_revoked_certificate_is_refused_on_its_open_connection(
    control: Cluster,  # noqa: F811 - test_security's fixture
    capsys: pytest.CaptureFixture[str],
) -> None:
    ch, stub = agent_stub(control, "h01")
    try:
        watch(stub, "h01", "r1")  # the connection is open and honoured
        cert = control.tls("h01").cert
        assert main(["ca", "revoke", "--json", "--dir", str(control.base / "pki"), str(cert)]) == 0
        out = json.loads(capsys.readouterr().out)
        assert out["revoked"] == serial_hex(life_of_pem(cert.read_bytes()).serial)

        def refused() -> grpc.RpcError | None:  # the list is re-read within a second
            try:
                watch(stub, "h01", "r1")
            except grpc.RpcError as exc:
                return exc
            return None

        exc = control.wait_for(refused, 10, "the revocation honoured")
        assert exc.code() == grpc.StatusCode.UNAUTHENTICATED
        assert _check(exc) == CHECK_CERT_REVOKED and "revoked" in exc.details()
    finally:
        ch.close()
    assert main(["ca", "revoke", "--dir", str(control.base / "pki"), "/dev/null"]) == 3


def test_the_data_plane_refuses_revoked_and_expired_peers(tmp_path: Path) -> None:
    cluster = Cluster(tmp_path / "c", tmp_path / "trusted", [])
    cluster.enrolled.update({"h00": ("r0", "x=y"), "h01": ("r1", "x=y")})
    pki = cluster.pki
    server = DataServer(
        "127.0.0.1",
        0,
        lambda job: None,
        tls=data_server_context(cluster.tls("h00")),
        authorize=lambda *a: "no",
    )
    server.start()
    try:
        client = data_client_context(cluster.tls("h01"))
        _connect(server.address, 5, client, "h00").close()  # both valid: it passes
        short = _short_lived(cluster, "h01", "r1", tmp_path / "short")
        expiring = data_client_context(short)
        time.sleep(LIFE_S + 0.2)
        with pytest.raises((ssl.SSLError, OSError, TransportError)):
            # OpenSSL itself refuses it at the handshake now
            _connect(server.address, 5, expiring, "h00").recv(1)
        (pki / REVOKED_CERTS_FILE).write_text(
            json.dumps(
                {
                    "schema": "relgate.revoked-certs.v1",
                    "serials": [
                        serial_hex(life_of_pem(cluster.tls("h01").cert.read_bytes()).serial)
                    ],
                }
            )
        )
        time.sleep(1.1)  # re-read within a second of the change
        sock = _connect(server.address, 5, client, "h00")
        try:
            sock.settimeout(5)
            data = b""
            while chunk := sock.recv(4096):  # one error frame naming the check, then closed
                data += chunk
            assert CHECK_CERT_REVOKED.encode() in data
        finally:
            sock.close()
        assert server.counters()["refusals"].get("certificate", 0) >= 1
        # and a client refuses a server whose certificate is revoked
        (pki / REVOKED_CERTS_FILE).write_text(
            json.dumps(
                {
                    "schema": "relgate.revoked-certs.v1",
                    "serials": [
                        serial_hex(life_of_pem(cluster.tls("h00").cert.read_bytes()).serial)
                    ],
                }
            )
        )
        time.sleep(1.1)
        with pytest.raises(TransportError, match=CHECK_CERT_REVOKED):
            _connect(server.address, 5, data_client_context(cluster.tls("h01")), "h00")
    finally:
        server.stop()


# ---------------------------------------------------------------------------- pure rules


def test_refusal_names_expiry_first_then_revocation(tmp_path: Path) -> None:
    life = certlife.CertLife(0xABC, 1000.0, "CN=h00")
    revoked = certlife.RevokedCerts(tmp_path / REVOKED_CERTS_FILE)
    assert certlife.refusal(life, revoked, 999.9) is None  # valid, nothing revoked
    assert certlife.refusal(life, None, 999.9) is None
    check, why = certlife.refusal(life, revoked, 1000.0) or ("", "")
    assert (
        check == CHECK_CERT_EXPIRED and why == "certificate CN=h00 expired at 1970-01-01T00:16:40Z"
    )
    certlife.revoke(tmp_path, 0xABC)
    assert certlife.refusal(life, certlife.RevokedCerts(revoked.path), 999.9) == (
        CHECK_CERT_REVOKED,
        "certificate CN=h00 (serial abc) is revoked",
    )
    # expired and revoked: expiry is named
    assert certlife.refusal(life, revoked, 2000.0)[0] == CHECK_CERT_EXPIRED  # type: ignore[index]
    assert certlife.refusal(certlife.CertLife(0xABD, 1000.0, "x"), revoked, 1.0) is None


def test_the_revocation_list_is_reread_on_change_and_a_bad_one_keeps_the_last(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    clock = [100.0]
    monkeypatch.setattr(certlife.time, "monotonic", lambda: clock[0])
    path = tmp_path / REVOKED_CERTS_FILE
    revoked = certlife.RevokedCerts(path)
    assert revoked.serials() == frozenset()  # no file: nothing revoked
    certlife.revoke(tmp_path, 1)
    assert revoked.serials() == frozenset()  # looked at less than RELOAD_S ago
    clock[0] += certlife.RELOAD_S
    assert revoked.serials() == {1}
    certlife.revoke(tmp_path, 0x2F)
    clock[0] += certlife.RELOAD_S
    assert revoked.serials() == {1, 0x2F}
    assert json.loads(path.read_text())["serials"] == ["1", "2f"]
    path.write_text('{"schema": "other", "serials": []}')
    clock[0] += certlife.RELOAD_S
    assert revoked.serials() == {1, 0x2F}  # refused: the last good list holds
    path.unlink()
    clock[0] += certlife.RELOAD_S
    assert revoked.serials() == frozenset()
    assert certlife.RevokedCerts(None).serials() == frozenset()


def test_a_serial_is_revoked_by_the_file_or_by_the_pushed_list(tmp_path: Path) -> None:
    revoked = certlife.RevokedCerts(tmp_path / REVOKED_CERTS_FILE)
    certlife.revoke(tmp_path, 0x11)
    revoked.pushed = frozenset({0x22})
    assert 0x11 in revoked and 0x22 in revoked and 0x33 not in revoked
    assert 0x11 not in certlife.RevokedCerts(None)
    life = certlife.CertLife(0x22, 2000.0, "CN=h")
    assert certlife.refusal(life, revoked, 1.0)[0] == CHECK_CERT_REVOKED  # type: ignore[index]


@pytest.mark.parametrize(
    "doc",
    [
        "[]",
        '{"schema": "relgate.revoked-certs.v1"}',
        '{"schema": "relgate.revoked-certs.v1", "serials": [12]}',
        '{"schema": "relgate.revoked-certs.v1", "serials": ["zz"]}',
        "not json",
    ],
)
def test_a_malformed_revocation_list_is_refused(tmp_path: Path, doc: str) -> None:
    (tmp_path / REVOKED_CERTS_FILE).write_text(doc)
    with pytest.raises(ValueError):
        certlife.load_revoked_serials(tmp_path / REVOKED_CERTS_FILE)


# ------------------------------------------------------------------ data plane, mid-stream

STREAM_LIFE_S = 12.0  # the streaming host's certificate: valid this long from its issue
CUT_WITHIN_S = 5.0  # a stream is cut by its next frame (>= one heartbeat a second) or stall


def _data_stats(cluster: Cluster, host: str, name: str) -> dict[str, Any]:
    path = cluster.models_root(host) / ".agent-stats" / name
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError):
        return {}


def test_an_open_stream_is_cut_when_a_peer_certificate_expires_and_the_job_ends_without_it(
    cluster: Cluster, checkpoint: dict[str, Any], tmp_path: Path
) -> None:
    """h02 (an interior host of every stripe: it receives from h00/h03 and feeds h04) runs
    on a real certificate valid for STREAM_LIFE_S; the origin cap keeps the job streaming
    past its expiry. Its upstreams cut the stream they serve it at their next block, its
    downstream cuts the stream it reads from it at the next frame, each naming
    cert-expired; the coordinator removes it (REMOVED, cert-expired) and the job ends DONE
    with the other four READY on the signed bytes."""
    from agent_harness import assert_placed
    from test_distribution import create_job

    hosts = [(f"h{i:02d}", f"r{i % 2}") for i in range(5)]
    victim, m = "h02", checkpoint["manifest"]
    cluster.start_coordinator()
    cluster.enrolled.update({h: (r, "cluster=inf-a") for h, r in hosts})
    short = _short_lived(cluster, victim, "r0", tmp_path / "short", STREAM_LIFE_S)
    expires = life_of_pem(short.cert.read_bytes()).not_after
    for h, r in hosts:
        tls = ["--cert", str(short.cert), "--key", str(short.key)] if h == victim else None
        cluster.start_agent(h, r, wait=False, extra_args=tls)
    cluster.wait_started()
    cluster.wait_registered(len(hosts))
    job = create_job(cluster, checkpoint, origin_cap_bytes_per_s=3 * MiB // 2)
    cluster.wait_for(lambda: time.time() > expires, STREAM_LIFE_S + 5, "the expiry")
    # it was mid-transfer when its certificate expired
    assert 0 < cluster.journaled(victim, m) < m.num_chunks
    st = cluster.wait_for(
        lambda: (s := cluster.status(job))["state"] == "DONE" and s, 90, "the job DONE"
    )
    states = {h["host_id"]: h for h in st["hosts"]}
    assert states[victim]["state"] == "REMOVED"
    assert any(e.startswith(f"REMOVED: {CHECK_CERT_EXPIRED}") for e in states[victim]["errors"])
    for h, _ in hosts:
        if h != victim:
            assert states[h]["state"] == "READY", (h, states[h])
            assert_placed(cluster, checkpoint, h)
    # downstream side: the stream read from the expired upstream was cut, by name, after
    # (never before) its notAfter
    cut = _data_stats(cluster, "h04", f"{job}.{cluster.agents['h04']['pid']}.json")
    assert cut["peer_cert_cuts"].get(CHECK_CERT_EXPIRED, 0) >= 1, cut
    assert expires <= cut["first_peer_cert_cut_at"] <= expires + CUT_WITHIN_S
    # upstream side: the stream served to the expired downstream was refused, by name
    served = [_data_stats(cluster, h, "dataplane.json") for h in ("h00", "h03")]
    assert sum(s.get("refusals", {}).get("certificate", 0) for s in served) >= 1, served
    logs = "".join((cluster.base / "logs" / f"{h}.log").read_text() for h in ("h00", "h03"))
    assert f"cut mid-stream: {CHECK_CERT_EXPIRED}" in logs
    h04_log = (cluster.base / "logs" / "h04.log").read_text()
    assert f"upstream {victim} refused, check={CHECK_CERT_EXPIRED}" in h04_log
