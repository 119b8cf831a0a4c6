"""Both planes under attack, for real: a coordinator process and agent processes on loopback
speaking mutual TLS; the test plays operators, hosts, impostors and hostile peers.

Control plane: no certificate, another CA's certificate, an operator calling agent RPCs, a
host calling operator RPCs or impersonating another host, an unenrolled host with a valid
fleet certificate, a forged READY (SQLite and PostgreSQL stores). Data plane: non-assigned
peers, impostor upstreams, idle and excess connections, every malformed request, EMFILE.
"""

from __future__ import annotations

import contextlib
import json
import os
import socket
import ssl
import struct
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_harness import Cluster

from relgate_agent.attestation import CertSigner, sign_placement
from relgate_agent.dataplane.transport import (
    CREDIT,
    FRAME,
    KIND_BLOCK,
    KIND_ERROR,
    KIND_PACE,
    MAGIC,
    OP_FETCH_CHUNK,
    OP_FETCH_MANIFEST,
    OP_STREAM_STRIPE,
    REQ,
    ChunkFetch,
    StripeStream,
    TransportError,
    fetch_manifest,
)
from relgate_agent.pki import (
    GRPC_TLS_OPTIONS,
    TlsFiles,
    ca_init,
    data_client_context,
    issue,
)
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg
from relgate_agent.staging.storage import bitmap_from_bits, held_versions, pack_indexes

MODEL, VERSION = "claude-x", "2026-10-12.3"


# ---------------------------------------------------------------------------- helpers


def channel(cluster: Cluster, cert: TlsFiles | None, root: Path | None = None) -> grpc.Channel:
    """A TLS channel trusting ``root`` (default: the fleet CA) presenting ``cert`` (or none)."""
    ca = (root or cluster.base / "pki" / "ca.pem").read_bytes()
    if cert is None:
        creds = grpc.ssl_channel_credentials(root_certificates=ca)
    else:
        creds = grpc.ssl_channel_credentials(
            root_certificates=ca,
            private_key=cert.key.read_bytes(),
            certificate_chain=cert.cert.read_bytes(),
        )
    return grpc.secure_channel(cluster.coordinator, creds, options=GRPC_TLS_OPTIONS)


def code_and_details(fn: Any) -> tuple[grpc.StatusCode, str]:
    with pytest.raises(grpc.RpcError) as exc:
        fn()
    return exc.value.code(), exc.value.details()


def first_event(stub: pbg.AgentServiceStub, request: pb.WatchRequest) -> pb.WatchEvent:
    """The first event of a watch stream (the host's jobs, newer assignments); then cancelled."""
    call = stub.Watch(request, timeout=10)
    try:
        return next(call)
    finally:
        call.cancel()


def watch(stub: pbg.AgentServiceStub, host: str, rack: str, **kw: Any) -> pb.WatchEvent:
    request = pb.WatchRequest(host_id=host, rack=rack, data_address="127.0.0.1:9", **kw)
    return first_event(stub, request)


def first_reply(
    stub: pbg.AgentServiceStub, requests: list[pb.ReportProgressRequest]
) -> list[pb.ReportProgressResponse]:
    """The replies to ``requests`` sent on one ReportStream (raises the stream's error)."""
    call = stub.ReportStream(iter(requests), timeout=10)
    try:
        return list(call)
    finally:
        call.cancel()


def agent_stub(cluster: Cluster, host: str) -> tuple[grpc.Channel, pbg.AgentServiceStub]:
    ch = channel(cluster, cluster.tls(host))
    return ch, pbg.AgentServiceStub(ch)


def create(cluster: Cluster, checkpoint: dict[str, Any], **kw: Any) -> pb.CreateJobResponse:
    c = cluster.client()
    try:
        spec = {
            "model": MODEL,
            "version": VERSION,
            "manifest_uri": str(checkpoint["envelope"]),
            "origin_uri": str(checkpoint["origin"]),
            "target_selector": "cluster=inf-a",
            "ready_threshold_ppm": 1_000_000,
            "stripes": 4,
            **kw,
        }
        return c.create_job(**spec)
    finally:
        c.close()


def new_database(dsn: str) -> str:
    import psycopg

    name = "t_" + uuid.uuid4().hex[:12]
    with psycopg.connect(dsn, autocommit=True) as conn:
        conn.execute(f"CREATE DATABASE {name}")
    return dsn.rsplit("/", 1)[0] + "/" + name


@pytest.fixture(params=["sqlite", pytest.param("postgres", marks=pytest.mark.postgres)])
def db_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "coordinator.sqlite")
    return new_database(request.getfixturevalue("pg_dsn"))


@pytest.fixture
def control(tmp_path: Path, checkpoint: dict[str, Any], db_url: str) -> Iterator[Cluster]:
    """A coordinator alone; the test plays the hosts (h00 r0, h01 r1 enrolled and live; h02
    enrolled, never seen; evil: a valid fleet certificate, never enrolled)."""
    c = Cluster(
        tmp_path / "cluster",
        checkpoint["trusted"],
        ["--report-interval", "0.5", "--dead-after", "3600", "--host-ttl", "60"],
    )
    c.enrolled.update(
        {
            "h00": ("r0", "cluster=inf-a"),
            "h01": ("r1", "cluster=inf-a"),
            "h02": ("r0", "cluster=inf-a"),
        }
    )
    c.enrolled["evil"] = ("r0", "cluster=inf-a")
    c.pki  # noqa: B018 - issues every certificate, evil's included
    del c.enrolled["evil"]  # ... but evil is never enrolled
    try:
        c.start_coordinator_with_db(db_url)
        yield c
    finally:
        c.stop_all()


def live_hosts(cluster: Cluster) -> set[str]:
    c = cluster.client()
    try:
        return {h.host_id for h in c.list_hosts().hosts if h.live}
    finally:
        c.close()


def refusals(cluster: Cluster) -> int:
    c = cluster.client()
    try:
        return c.list_hosts().control_refusals
    finally:
        c.close()


# ---------------------------------------------------------------------------- control plane

AGENT_CALLS = {
    "Watch": lambda s, h: first_event(s, pb.WatchRequest(host_id=h, rack="r1")),
    "Register": lambda s, h: s.Register(pb.RegisterRequest(job_id="dj_x", host_id=h), timeout=10),
    "ReportProgress": lambda s, h: s.ReportProgress(
        pb.ReportProgressRequest(job_id="dj_x", host_id=h, ready=True), timeout=10
    ),
    "ReportStream": lambda s, h: first_reply(
        s, [pb.ReportProgressRequest(job_id="dj_x", host_id=h, ready=True)]
    ),
    "ReportSuspect": lambda s, h: s.ReportSuspect(
        pb.ReportSuspectRequest(job_id="dj_x", reporter=h, suspect_host="h00", reason="BAD_DATA"),
        timeout=10,
    ),
    "FindPeers": lambda s, h: s.FindPeers(
        pb.FindPeersRequest(job_id="dj_x", host_id=h, chunk=0), timeout=10
    ),
}
OPERATOR_CALLS = {
    "CreateJob": lambda s: s.CreateJob(
        pb.CreateJobRequest(model=MODEL, version=VERSION), timeout=10
    ),
    "GetJob": lambda s: s.GetJob(pb.GetJobRequest(job_id="dj_x"), timeout=10),
    "CancelJob": lambda s: s.CancelJob(pb.CancelJobRequest(job_id="dj_x"), timeout=10),
    "EnrollHost": lambda s: s.EnrollHost(
        pb.EnrollHostRequest(host_id="evil", rack="r0", labels={"cluster": "inf-a"}), timeout=10
    ),
    "ListHosts": lambda s: s.ListHosts(pb.ListHostsRequest(), timeout=10),
    "ListJobs": lambda s: s.ListJobs(pb.ListJobsRequest(), timeout=10),
    "GetJobTopology": lambda s: s.GetJobTopology(
        pb.GetJobTopologyRequest(job_id="dj_x"), timeout=10
    ),
}


def test_no_certificate_or_foreign_ca_never_reaches_an_rpc(
    control: Cluster, tmp_path: Path
) -> None:
    before = refusals(control)
    # 1. TLS without a client certificate: the handshake fails (require_client_auth)
    ch = channel(control, None)
    for fn in (
        lambda: pbg.JobServiceStub(ch).GetJob(pb.GetJobRequest(job_id="x"), timeout=5),
        lambda: watch(pbg.AgentServiceStub(ch), "h00", "r0"),
    ):
        assert code_and_details(fn)[0] == grpc.StatusCode.UNAVAILABLE
    ch.close()
    # 2. plaintext
    ch = grpc.insecure_channel(control.coordinator)
    code, _ = code_and_details(
        lambda: pbg.JobServiceStub(ch).GetJob(pb.GetJobRequest(job_id="x"), timeout=5)
    )
    assert code == grpc.StatusCode.UNAVAILABLE
    ch.close()
    # 3. a certificate from another CA, for the same names (operator, host h00)
    other = tmp_path / "other-ca"
    ca_init(other)
    issue(other, "operator")
    issue(other, "host", host_id="h00", rack="r0")
    for name, fn in (
        ("operator", lambda s: pbg.JobServiceStub(s).ListHosts(pb.ListHostsRequest(), timeout=5)),
        ("h00", lambda s: watch(pbg.AgentServiceStub(s), "h00", "r0")),
    ):
        ch = channel(control, TlsFiles.from_pki(other, name))
        assert code_and_details(lambda: fn(ch))[0] == grpc.StatusCode.UNAVAILABLE  # noqa: B023
        ch.close()
    # nothing was enrolled or heartbeated by any of them
    assert refusals(control) == before
    c = control.client()
    try:
        hosts = c.list_hosts().by_host()
    finally:
        c.close()
    assert hosts["h00"].last_seen_age_s == -1


def test_roles_and_host_identity_enforced(control: Cluster) -> None:
    before = refusals(control)
    n = 0
    op_ch = channel(control, control.tls("operator"))
    op = pbg.AgentServiceStub(op_ch)
    for method, call in AGENT_CALLS.items():
        assert code_and_details(lambda: call(op, "h00")) == (  # noqa: B023
            grpc.StatusCode.PERMISSION_DENIED,
            f"{method} refused: agent RPC, caller is operator:operator",
        )
        n += 1
    op_ch.close()
    h_ch, h00 = agent_stub(control, "h00")
    h00_jobs = pbg.JobServiceStub(h_ch)
    for method, call in OPERATOR_CALLS.items():
        assert code_and_details(lambda: call(h00_jobs)) == (  # noqa: B023
            grpc.StatusCode.PERMISSION_DENIED,
            f"{method} refused: operator RPC, caller is host:h00@r0",
        )
        n += 1
    for method, call in AGENT_CALLS.items():  # h00's certificate acting as h01
        assert code_and_details(lambda: call(h00, "h01")) == (  # noqa: B023
            grpc.StatusCode.PERMISSION_DENIED,
            f"{method} refused: certificate is for host h00, request names host 'h01'",
        )
        n += 1
    # the right host id in the wrong rack
    assert code_and_details(lambda: watch(h00, "h00", "r1")) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "Watch refused: certificate is for rack r0, request names rack 'r1'",
    )
    n += 1
    # a coordinator certificate is no operator either
    co_ch = channel(control, control.tls("coordinator"))
    assert code_and_details(
        lambda: pbg.JobServiceStub(co_ch).ListHosts(pb.ListHostsRequest(), timeout=5)
    ) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "ListHosts refused: operator RPC, caller is coordinator:coordinator",
    )
    n += 1
    co_ch.close()
    assert watch(h00, "h00", "r0").jobs == []  # its own identity works
    h_ch.close()
    assert refusals(control) == before + n


def test_targets_are_enrolled_live_hosts_never_an_unenrolled_caller(
    control: Cluster, checkpoint: dict[str, Any]
) -> None:
    chans = {h: agent_stub(control, h) for h in ("h00", "h01", "evil")}
    watch(chans["h00"][1], "h00", "r0")
    watch(chans["h01"][1], "h01", "r1")
    evil = chans["evil"][1]
    # a valid fleet certificate is not enough: evil was never enrolled
    assert code_and_details(lambda: watch(evil, "evil", "r0")) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "host evil is not enrolled",
    )
    job = create(control, checkpoint)
    assert job.hosts_total == 2  # h00, h01; h02 is enrolled but never sent a heartbeat
    st = control.status(job.job_id)
    v = st["topology_version"]
    # evil keeps trying every door
    assert (
        code_and_details(lambda: watch(evil, "evil", "r0"))[0] == grpc.StatusCode.PERMISSION_DENIED
    )
    j = job.job_id
    evil_calls = {
        "Register": lambda: evil.Register(pb.RegisterRequest(job_id=j, host_id="evil"), timeout=5),
        "ReportSuspect": lambda: evil.ReportSuspect(
            pb.ReportSuspectRequest(
                job_id=j, reporter="evil", suspect_host="h00", reason="BAD_DATA"
            ),
            timeout=5,
        ),
        "FindPeers": lambda: evil.FindPeers(
            pb.FindPeersRequest(job_id=j, host_id="evil"), timeout=5
        ),
    }
    for method, fn in evil_calls.items():
        assert code_and_details(fn) == (
            grpc.StatusCode.NOT_FOUND,
            f"host evil is not a target of job {j}",
        ), method
    st = control.status(job.job_id)
    assert st["hosts_total"] == 2 and st["topology_version"] == v
    assert "evil" not in {h["host_id"] for h in st["hosts"]}
    for h, rack in (("h00", "r0"), ("h01", "r1")):
        event = watch(chans[h][1], h, rack)
        assert [j.job_id for j in event.jobs] == [job.job_id]
        (a,) = [a for a in event.assignments if a.job_id == job.job_id]
        assert sorted(a.members) == ["h00", "h01"]
        peers = {s.upstream.host_id for s in a.stripes} | {
            d.host_id for s in a.stripes for d in s.downstreams
        }
        assert "evil" not in peers and peers <= {"h00", "h01", "ORIGIN"}
    c = control.client()
    try:
        inv = c.list_hosts().by_host()
        assert "evil" not in inv
        assert inv["h02"].enrolled and not inv["h02"].live
        assert inv["h00"].live
        # a late host that is enrolled and matches may join
        c.enroll_host("h03", "r1", {"cluster": "inf-a"})
    finally:
        c.close()
    control.enrolled["h03"] = ("r1", "cluster=inf-a")
    control.pki  # noqa: B018 - issues h03's certificate
    chans["h03"] = agent_stub(control, "h03")
    refs = watch(chans["h03"][1], "h03", "r1")
    assert [j.job_id for j in refs.jobs] == [job.job_id]
    st = control.status(job.job_id)
    assert st["hosts_total"] == 3 and st["topology_version"] > v
    for ch, _ in chans.values():
        ch.close()


def forged_ready(job: str, host: str, have: bytes, digest: str) -> pb.ReportProgressRequest:
    """READY for ``host`` with every chunk and the right digest: what a forger sends."""
    return pb.ReportProgressRequest(
        job_id=job, host_id=host, have=have, ready=True, placed_manifest_digest=digest
    )


def test_forged_ready_refused_and_never_done(control: Cluster, checkpoint: dict[str, Any]) -> None:
    m = checkpoint["manifest"]
    h0_ch, h00 = agent_stub(control, "h00")
    h1_ch, h01 = agent_stub(control, "h01")
    watch(h00, "h00", "r0")
    watch(h01, "h01", "r1")
    job = create(control, checkpoint).job_id
    h00.Register(pb.RegisterRequest(job_id=job, host_id="h00", rack="r0"), timeout=10)
    full = bitmap_from_bits(bytearray([1]) * m.num_chunks)
    half = bitmap_from_bits(
        bytearray([1]) * (m.num_chunks // 2) + bytearray(m.num_chunks - m.num_chunks // 2)
    )

    def ready(have: bytes, digest: str, attestation: str = "") -> Any:
        return h00.ReportProgress(
            pb.ReportProgressRequest(
                job_id=job,
                host_id="h00",
                rack="r0",
                have=have,
                ready=True,
                placed_manifest_digest=digest,
                placement_attestation=attestation,
            ),
            timeout=10,
        )

    other = "sha256:" + "0" * 64
    for have, digest, why in (
        (b"", m.digest, f"READY refused: 0/{m.num_chunks} chunks verified"),
        (half, m.digest, f"READY refused: {m.num_chunks // 2}/{m.num_chunks} chunks verified"),
        (full, "", f"READY refused: placed digest (none) is not {m.digest}"),
        (full, other, f"READY refused: placed digest {other} is not {m.digest}"),
    ):
        assert code_and_details(lambda: ready(have, digest)) == (  # noqa: B023
            grpc.StatusCode.FAILED_PRECONDITION,
            f"{why} (job {job}, host h00)",
        )
    st = control.status(job)
    assert st["hosts_ready"] == 0 and st["state"] == "DISTRIBUTING" and not st["ready_hosts"]
    (h,) = [h for h in st["hosts"] if h["host_id"] == "h00"]
    assert sum(e.startswith("READY refused") for e in h["errors"]) == 4
    # h01 forges READY for h00 with its own certificate: refused before any logic runs
    assert (
        code_and_details(
            lambda: h01.ReportProgress(forged_ready(job, "h00", full, m.digest), timeout=10)
        )[0]
        == grpc.StatusCode.PERMISSION_DENIED
    )
    time.sleep(1.5)  # several sweeper ticks: nothing moves the job on
    st = control.status(job)
    assert st["hosts_ready"] == 0 and st["state"] == "DISTRIBUTING" and not st["completion_emitted"]
    # every chunk and the placed digest, without the host's signed placement attestation
    assert code_and_details(lambda: ready(full, m.digest))[0] == (
        grpc.StatusCode.FAILED_PRECONDITION
    )
    # the complete claim (every chunk, the placed digest, attested with h00's key) is READY
    attestation = sign_placement(
        CertSigner.from_tls(control.tls("h00")),
        host_id="h00",
        model=m.model,
        version=m.version,
        manifest_digest=m.digest,
        path="/models/claude-x/2026-10-12.3",
        placed_at_ms=int(time.time() * 1000),
    )
    ready(full, m.digest, json.dumps(attestation))
    st = control.status(job)
    assert st["hosts_ready"] == 1 and st["ready_hosts"] == ["h00"] and st["state"] == "DISTRIBUTING"
    h0_ch.close()
    h1_ch.close()


def test_a_report_stream_cannot_switch_hosts_midway(
    control: Cluster, checkpoint: dict[str, Any]
) -> None:
    """The certificate is read once per stream, and every message must still name its host:
    h00's stream that sends one honest report and then READY for h01 is cut at the second,
    and nothing of it reaches h01's record."""
    m = checkpoint["manifest"]
    h0_ch, h00 = agent_stub(control, "h00")
    h1_ch, h01 = agent_stub(control, "h01")
    watch(h00, "h00", "r0")
    watch(h01, "h01", "r1")
    job = create(control, checkpoint).job_id
    for stub, host, rack in ((h00, "h00", "r0"), (h01, "h01", "r1")):
        stub.Register(pb.RegisterRequest(job_id=job, host_id=host, rack=rack), timeout=10)
    before = refusals(control)
    full = bitmap_from_bits(bytearray([1]) * m.num_chunks)
    call = h00.ReportStream(
        iter(
            [
                pb.ReportProgressRequest(job_id=job, host_id="h00", rack="r0", have=full[:1]),
                forged_ready(job, "h01", full, m.digest),
            ]
        ),
        timeout=10,
    )
    first = next(call)
    assert first.topology_version >= 1
    assert code_and_details(lambda: next(call)) == (
        grpc.StatusCode.PERMISSION_DENIED,
        "ReportStream refused: certificate is for host h00, request names host 'h01'",
    )
    assert refusals(control) == before + 1
    st = control.status(job)
    hosts = {h["host_id"]: h for h in st["hosts"]}
    assert st["hosts_ready"] == 0 and hosts["h01"]["chunks_verified"] == 0
    assert hosts["h00"]["chunks_verified"] == min(8, m.num_chunks)  # the honest report landed
    h0_ch.close()
    h1_ch.close()


def test_quiet_reports_are_answered_only_with_news(
    control: Cluster, checkpoint: dict[str, Any]
) -> None:
    """On a report stream a quiet report gets no answer unless the coordinator has news for
    the agent (here FULL_PROGRESS: a delta that does not add up); every other report is
    answered, its seq and job echoed, in order; the quiet ones still land."""
    m = checkpoint["manifest"]
    ch, h00 = agent_stub(control, "h00")
    watch(h00, "h00", "r0")
    job = create(control, checkpoint).job_id
    h00.Register(pb.RegisterRequest(job_id=job, host_id="h00", rack="r0"), timeout=10)

    def report(seq: int, quiet: bool, **kw: Any) -> pb.ReportProgressRequest:
        return pb.ReportProgressRequest(
            job_id=job, host_id="h00", rack="r0", seq=seq, quiet=quiet, **kw
        )

    first8 = bitmap_from_bits(bytearray([1] * 8 + [0] * (m.num_chunks - 8)))
    answers = first_reply(
        h00,
        [
            report(1, True, have=first8),  # whole: chunks 0-7
            report(2, True, verified_delta=pack_indexes([8]), verified_count=9),
            report(3, False, verified_delta=pack_indexes([9]), verified_count=10),
            report(4, True, verified_delta=pack_indexes([10]), verified_count=99),  # not ours
            report(5, False, have=first8),
        ],
    )
    assert [(a.seq, a.job_id, list(a.actions)) for a in answers] == [
        (3, job, []),
        (4, job, ["FULL_PROGRESS"]),
        (5, job, []),
    ]
    hosts = {h["host_id"]: h for h in control.status(job)["hosts"]}
    assert hosts["h00"]["chunks_verified"] == 8  # the last whole bitmap
    ch.close()


def test_finished_job_keeps_its_figures(
    tmp_path: Path, checkpoint: dict[str, Any], db_url: str
) -> None:
    c = Cluster(tmp_path / "cluster", checkpoint["trusted"], ["--report-interval", "0.5"])
    hosts = [("f00", "r0"), ("f01", "r1"), ("f02", "r0")]
    size = checkpoint["manifest"].total_size
    try:
        c.start_coordinator_with_db(db_url)
        for h, r in hosts:
            c.start_agent(h, r, wait=False)
        c.wait_started()
        c.wait_for(lambda: {"f00", "f01", "f02"} <= live_hosts(c), 60, "3 live hosts")
        job = create(c, checkpoint, stripes=2).job_id
        done = c.wait_for(lambda: (s := c.status(job))["state"] == "DONE" and s, 120, "DONE")
        c.kill("coordinator")
        c.start_coordinator_with_db(db_url)  # figures come from the store now
        again = c.wait_for(lambda: c.status(job), 30, "restarted coordinator")
    finally:
        c.stop_all()
    for st in (done, again):
        assert st["state"] == "DONE" and st["hosts_ready"] == 3 and st["hosts_total"] == 3
        assert size <= st["origin_bytes"] <= 1.05 * size  # each byte read from the origin once
        assert st["bytes_moved"] >= size  # 2 of 3 hosts received every stripe they do not root
        assert st["duration_s"] > 0 and st["checkpoint_bytes"] == size
        assert st["eta_s"] == 0
    assert (done["origin_bytes"], done["bytes_moved"], done["duration_s"]) == (
        again["origin_bytes"],
        again["bytes_moved"],
        again["duration_s"],
    )


# ---------------------------------------------------------------------------- data plane


@pytest.fixture(scope="module")
def plane(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Two real agents (h00 with tight limits, h01) that finished a job which stays open
    (a third target, ghost h02, heartbeated once and went away), so both keep serving."""
    import hashlib

    from agent_harness import write_checkpoint
    from relgate_trust.manifest import (
        build_manifest,
        generate_private_key,
        sign_manifest,
        write_envelope,
        write_keypair,
    )

    base = tmp_path_factory.mktemp("plane")
    key = generate_private_key()
    (base / "trusted").mkdir()
    write_keypair(key, base / "signer.key", base / "trusted" / "builder-v1.pem")
    src = write_checkpoint(base / "origin" / "ckpt", {"a.bin": 3 << 20, "b.bin": 2 << 20})
    m = build_manifest(src, MODEL, VERSION, chunk_size=256 << 10, block_size=64 << 10)
    write_envelope(sign_manifest(m, key), base / "origin" / "manifest.dsse.json")
    ckpt = {
        "manifest": m,
        "envelope": base / "origin" / "manifest.dsse.json",
        "origin": src,
        "digests": {
            f.path: hashlib.sha256((src / f.path).read_bytes()).hexdigest() for f in m.files
        },
    }
    c = Cluster(
        base / "cluster", base / "trusted", ["--report-interval", "0.5", "--dead-after", "2"]
    )
    limits = [
        "--handshake-timeout", "1", "--request-timeout", "3", "--idle-timeout", "3",
        "--max-conns-per-peer", "8", "--max-handshaking-per-address", "16",
    ]  # fmt: skip
    c.enrolled.update({"h02": ("r0", "cluster=inf-a"), "h99": ("r1", "cluster=other")})
    try:
        c.start_coordinator()
        c.start_agent("h00", "r0", extra_args=limits)
        c.start_agent("h01", "r1")
        ch, ghost = agent_stub(c, "h02")
        c.wait_for(lambda: {"h00", "h01"} <= live_hosts(c), 30, "h00, h01 heartbeats")
        watch(ghost, "h02", "r0")
        ch.close()
        job = create(c, ckpt).job_id
        c.wait_for(
            lambda: set(c.status(job)["ready_hosts"]) == {"h00", "h01"}, 120, "h00, h01 READY"
        )
        yield {"cluster": c, "job": job, "manifest": m, "base": base}
    finally:
        c.stop_all()


def assignment(plane: dict[str, Any], host: str) -> pb.Assignment:
    """The host's current assignment, read on a watch of its own (with the running agent's
    data address and held versions: opening a watch is that host's heartbeat)."""
    c: Cluster = plane["cluster"]
    ch, stub = agent_stub(c, host)
    request = pb.WatchRequest(
        host_id=host,
        rack=c.tls(host).identity().rack,
        data_address=data_address(plane, host),
        held_versions=held_versions(c.models_root(host)),
    )
    try:
        (a,) = [a for a in first_event(stub, request).assignments if a.job_id == plane["job"]]
        return a
    finally:
        ch.close()


def data_address(plane: dict[str, Any], host: str) -> str:
    return str(plane["cluster"].agents[host]["dataAddress"])


def dataplane_counters(plane: dict[str, Any], host: str) -> dict[str, Any]:
    p = plane["cluster"].models_root(host) / ".agent-stats" / "dataplane.json"
    return json.loads(p.read_text())


def tls_socket(
    plane: dict[str, Any], as_host: str, to: str = "h00", ctx: ssl.SSLContext | None = None
) -> ssl.SSLSocket:
    host, _, port = data_address(plane, to).rpartition(":")
    raw = socket.create_connection((host, int(port)), timeout=10)
    return (ctx or data_client_context(plane["cluster"].tls(as_host))).wrap_socket(raw)


def read_frame(sock: socket.socket) -> tuple[int, bytes]:
    """The next frame that answers (PACE frames, the upstream's pace signal, skipped)."""
    while True:
        kind, payload = _read_any_frame(sock)
        if kind != KIND_PACE:
            return kind, payload


def _read_any_frame(sock: socket.socket) -> tuple[int, bytes]:
    head = b""
    while len(head) < FRAME.size:
        got = sock.recv(FRAME.size - len(head))
        if not got:
            raise EOFError("closed before a frame")
        head += got
    kind, _block, _off, length, _crc = FRAME.unpack(head)
    payload = b""
    while len(payload) < length:
        got = sock.recv(length - len(payload))
        if not got:
            raise EOFError("closed mid-frame")
        payload += got
    return kind, payload


def closed(sock: socket.socket) -> bool:
    try:
        return sock.recv(1) == b""
    except (ConnectionResetError, ssl.SSLError):
        return True


def wait_counter(plane: dict[str, Any], host: str, kind: str, at_least: int) -> dict[str, Any]:
    return plane["cluster"].wait_for(
        lambda: (d := dataplane_counters(plane, host))["refusals"].get(kind, 0) >= at_least and d,
        15,
        f"{host} refusals[{kind}] >= {at_least}",
    )


def _stripes_of(a: pb.Assignment, downstream: str) -> tuple[list[int], list[int]]:
    mine = [s.stripe for s in a.stripes if downstream in {d.host_id for d in s.downstreams}]
    return mine, [s.stripe for s in a.stripes if s.stripe not in mine]


def _outsider_refused(plane: dict[str, Any], outsider: str, s: int, topo: int) -> None:
    """A valid fleet certificate of a host outside the job: no stripe, chunk or envelope."""
    c: Cluster = plane["cluster"]
    job, m = plane["job"], plane["manifest"]
    ctx = data_client_context(c.tls(outsider))
    with pytest.raises(TransportError) as exc:
        list(StripeStream(data_address(plane, "h00"), job, s, 0, tls=ctx, peer="h00"))
    assert str(exc.value) == (
        f"upstream error: refused: {outsider} is not a downstream of stripe {s} of job {job} "
        f"(topology v{topo})"
    )
    with pytest.raises(TransportError) as exc:
        ChunkFetch(data_address(plane, "h00"), job, 0, tls=ctx, peer="h00").run()
    assert str(exc.value) == (
        f"upstream error: refused: {outsider} is not a peer of job {job} (topology v{topo})"
    )
    with pytest.raises(TransportError) as exc:  # nor the manifest envelope
        fetch_manifest(
            data_address(plane, "h00"), job, m.digest, tls=ctx, peer="h00", max_bytes=1 << 26
        )
    assert str(exc.value) == (
        f"upstream error: refused: {outsider} is not a peer of job {job} (topology v{topo})"
    )


def test_data_served_only_to_assigned_peers(plane: dict[str, Any]) -> None:
    c: Cluster = plane["cluster"]
    job, m = plane["job"], plane["manifest"]

    # ghost h02 is spliced out: dead after 2 s without a report (its downstream h00
    # bypassed it at once and may be READY before that)
    def spliced() -> pb.Assignment | None:
        got = assignment(plane, "h00")
        return got if sorted(got.members) == ["h00", "h01"] else None

    a = c.wait_for(spliced, 30, "ghost h02 spliced out")
    served, not_served = _stripes_of(a, "h01")
    assert served and not_served
    before = dataplane_counters(plane, "h00")["refusals"].get("unauthorized", 0)
    tls01 = data_client_context(c.tls("h01"))
    # a stripe h01 is a downstream of: every block, then END
    s = served[0]
    stream = StripeStream(
        data_address(plane, "h00"), job, s, 0, tls=tls01, peer="h00", topo=a.topology_version
    )
    got = []
    for b in stream:
        if b is not None:
            got.append(b.block)
            stream.grant(1)
    stream.close()
    assert got == m.stripe_blocks(s, 4)
    # a stripe h01 is not assigned (h00 pulls it from h01): refused
    s2 = not_served[0]
    with pytest.raises(TransportError) as exc:
        list(StripeStream(data_address(plane, "h00"), job, s2, 0, tls=tls01, peer="h00"))
    assert str(exc.value) == (
        f"upstream error: refused: h01 is not a downstream of stripe {s2} of job {job} "
        f"(topology v{a.topology_version})"
    )
    # the same from h01 holding an older assignment (its upstream changed a moment ago):
    # refused as stale, to be asked again, and not counted with what an attack raises
    stale = a.topology_version - 1
    with pytest.raises(TransportError) as exc:
        list(
            StripeStream(data_address(plane, "h00"), job, s2, 0, tls=tls01, peer="h00", topo=stale)
        )
    assert str(exc.value).startswith(f"upstream error: stale topology v{stale} < v")
    assert dataplane_counters(plane, "h00")["refusals"].get("stale", 0) == 0
    # valid fleet certificates of hosts outside the job: h99 (enrolled elsewhere), ghost h02
    for outsider in ("h99", "h02"):
        _outsider_refused(plane, outsider, s, a.topology_version)
    # a job peer may repair from h00, and fetch the envelope it holds, byte for byte
    blocks = ChunkFetch(data_address(plane, "h00"), job, 1, tls=tls01, peer="h00").run()
    assert [b.block for b in blocks] == list(m.chunk_blocks(1))
    envelope = fetch_manifest(
        data_address(plane, "h00"), job, m.digest, tls=tls01, peer="h00", max_bytes=1 << 26
    )
    assert envelope == (plane["base"] / "origin" / "manifest.dsse.json").read_bytes()
    # a bound below the envelope's size is enforced before a byte of it is read
    with pytest.raises(TransportError, match=r"frame of \d+ bytes exceeds 1000"):
        fetch_manifest(
            data_address(plane, "h00"), job, m.digest, tls=tls01, peer="h00", max_bytes=1000
        )
    d = wait_counter(plane, "h00", "unauthorized", before + 7)
    assert d["refusals"]["unauthorized"] == before + 7
    # the refusals reach the coordinator (ReportProgress) and GetJob shows them per host
    c.wait_for(
        lambda: (
            next(h for h in c.status(job)["hosts"] if h["host_id"] == "h00")["data_refusals"]
            >= before + 5
        ),
        20,
        "data_refusals in GetJob",
    )
    # and the downstream side checks who answers: h01's address does not serve as h00
    with pytest.raises(TransportError, match=r"presented host:h01@r1, expected host h00"):
        StripeStream(data_address(plane, "h01"), job, s, 0, tls=tls01, peer="h00")


def test_data_plane_refuses_no_certificate_and_foreign_ca(plane: dict[str, Any]) -> None:
    c: Cluster = plane["cluster"]
    before = dataplane_counters(plane, "h00")["refusals"].get("handshake", 0)
    ca = c.base / "pki" / "ca.pem"
    bare = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    bare.check_hostname = False
    bare.load_verify_locations(cafile=str(ca))
    other = plane["base"] / "other-ca"
    if not other.exists():
        ca_init(other)
        issue(other, "host", host_id="h01", rack="r1")
    foreign = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    foreign.check_hostname = False
    foreign.load_verify_locations(cafile=str(ca))
    foreign.load_cert_chain(str(other / "h01.pem"), str(other / "h01.key"))
    for ctx in (bare, foreign):
        with contextlib.suppress(ssl.SSLError, OSError):
            s = tls_socket(plane, "h01", ctx=ctx)
            # TLS 1.3: the server's verdict on our certificate arrives with the first read
            with pytest.raises((ssl.SSLError, ConnectionResetError, EOFError)):
                s.sendall(REQ.pack(MAGIC, OP_FETCH_CHUNK, 2) + b"{}")
                read_frame(s)
            s.close()
    d = wait_counter(plane, "h00", "handshake", before + 2)
    assert d["refusals"]["handshake"] == before + 2


def _body(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def _frame(op: int, doc: Any) -> bytes:
    b = _body(doc)
    return REQ.pack(MAGIC, op, len(b)) + b


MALFORMED = {
    "announces 1000 bytes, sends none": (
        lambda j: REQ.pack(MAGIC, OP_STREAM_STRIPE, 1000),
        "request header incomplete: 0/1000 bytes before the timeout",
    ),
    "announces 1 MiB": (
        lambda j: REQ.pack(MAGIC, OP_STREAM_STRIPE, 1 << 20),
        "request header too large (1048576 > 4096 bytes)",
    ),
    "oversized header": (
        lambda j: _frame(OP_STREAM_STRIPE, {"job": "j" * 13, "pad": "x" * 5000}),
        "request header too large (5035 > 4096 bytes)",
    ),
    "JSON list": (
        lambda j: _frame(OP_STREAM_STRIPE, [j, 0, 0]),
        "request header is not a JSON object",
    ),
    "not JSON": (
        lambda j: REQ.pack(MAGIC, OP_STREAM_STRIPE, 5) + b"{job:",
        "request header is not JSON",
    ),
    "unknown op": (lambda j: _frame(7, {"job": j}), "unknown op 7"),
    "bad magic": (lambda j: b"HTTP" + _frame(1, {"job": j})[4:], "bad magic"),
    "unknown job": (
        lambda j: _frame(OP_STREAM_STRIPE, {"job": "dj_nope", "stripe": 0, "fromPos": 0}),
        "unknown job",
    ),
    # a manifest source is named a moment before it holds the job: "not held", asked again
    "manifest of an unknown job": (
        lambda j: _frame(OP_FETCH_MANIFEST, {"job": "dj_nope", "digest": "sha256:" + "0" * 64}),
        "manifest not held",
    ),
    "huge stripe": (
        lambda j: _frame(OP_STREAM_STRIPE, {"job": j, "stripe": 10**30, "fromPos": 0}),
        f"stripe {10**30} out of range [0, 1048576]",
    ),
    "negative stripe": (
        lambda j: _frame(OP_STREAM_STRIPE, {"job": j, "stripe": -1, "fromPos": 0}),
        "stripe -1 out of range [0, 1048576]",
    ),
    "no such stripe": (
        lambda j: _frame(OP_STREAM_STRIPE, {"job": j, "stripe": 4, "fromPos": 0}),
        "stripe 4 out of range",
    ),
    "stripe as a string": (
        lambda j: _frame(OP_STREAM_STRIPE, {"job": j, "stripe": "0", "fromPos": 0}),
        "stripe must be an integer",
    ),
    "stripe as a bool": (
        lambda j: _frame(OP_STREAM_STRIPE, {"job": j, "stripe": True, "fromPos": 0}),
        "stripe must be an integer",
    ),
    "negative fromPos": (
        lambda j: _frame(OP_STREAM_STRIPE, {"job": j, "stripe": 0, "fromPos": -1}),
        "fromPos -1 out of range [0, 20]",
    ),
    "fromPos past the end": (
        lambda j: _frame(OP_STREAM_STRIPE, {"job": j, "stripe": 0, "fromPos": 21}),
        "fromPos 21 out of range [0, 20]",
    ),
    "toPos before fromPos": (
        lambda j: _frame(OP_STREAM_STRIPE, {"job": j, "stripe": 0, "fromPos": 5, "toPos": 4}),
        "toPos 4 out of range [5, 20]",
    ),
    "toPos past the end": (
        lambda j: _frame(OP_STREAM_STRIPE, {"job": j, "stripe": 0, "fromPos": 0, "toPos": 21}),
        "toPos 21 out of range [0, 20]",
    ),
    "toPos not an integer": (
        lambda j: _frame(OP_STREAM_STRIPE, {"job": j, "stripe": 0, "fromPos": 0, "toPos": "9"}),
        "toPos must be an integer",
    ),
    "unknown codec": (
        lambda j: _frame(
            OP_STREAM_STRIPE, {"job": j, "stripe": 0, "fromPos": 0, "compress": "lz4"}
        ),
        "unknown codec 'lz4' (speaks zstd-split2)",
    ),
    "zero credits": (
        lambda j: _frame(OP_STREAM_STRIPE, {"job": j, "stripe": 0, "fromPos": 0, "credits": 0}),
        "credits 0 out of range [1, 1024]",
    ),
    "negative topology": (
        lambda j: _frame(OP_FETCH_CHUNK, {"job": j, "chunk": 0, "topo": -1}),
        f"topo -1 out of range [0, {2**62}]",
    ),
    "negative chunk": (
        lambda j: _frame(OP_FETCH_CHUNK, {"job": j, "chunk": -1}),
        f"chunk -1 out of range [0, {1 << 40}]",
    ),
    "chunk not held": (
        lambda j: _frame(OP_FETCH_CHUNK, {"job": j, "chunk": 10**6}),
        "chunk not held",
    ),
    "manifest without a digest": (
        lambda j: _frame(OP_FETCH_MANIFEST, {"job": j}),
        "digest must be a non-empty string",
    ),
    "manifest digest as a number": (
        lambda j: _frame(OP_FETCH_MANIFEST, {"job": j, "digest": 7}),
        "digest must be a non-empty string",
    ),
    "manifest digest too long": (
        lambda j: _frame(OP_FETCH_MANIFEST, {"job": j, "digest": "s" * 129}),
        "digest must be a non-empty string",
    ),
    "manifest not the one held": (
        lambda j: _frame(OP_FETCH_MANIFEST, {"job": j, "digest": "sha256:" + "0" * 64}),
        f"manifest sha256:{'0' * 64} not held",
    ),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_request_gets_one_error_frame_and_a_closed_connection(
    plane: dict[str, Any], case: str
) -> None:
    make, message = MALFORMED[case]
    assert len(plane["manifest"].stripe_blocks(0, 4)) == 20  # the fromPos bounds above
    s = tls_socket(plane, "h01")
    try:
        s.sendall(make(plane["job"]))
        assert read_frame(s) == (KIND_ERROR, message.encode())
        assert closed(s)
    finally:
        s.close()
    log = (plane["cluster"].base / "logs" / "h00.log").read_text()
    assert "Traceback" not in log


def test_credit_overflow_is_an_error_not_a_stream(plane: dict[str, Any]) -> None:
    a = assignment(plane, "h00")
    served, _ = _stripes_of(a, "h01")
    s = tls_socket(plane, "h01")
    try:
        s.sendall(
            _frame(
                OP_STREAM_STRIPE,
                {"job": plane["job"], "stripe": served[0], "fromPos": 0, "credits": 1},
            )
        )
        assert read_frame(s)[0] == KIND_BLOCK
        s.sendall(CREDIT.pack(2**32 - 1))
        assert read_frame(s) == (KIND_ERROR, b"credit overflow (4294967295 > 1024)")
        assert closed(s)
    finally:
        s.close()


def test_idle_and_excess_connections_are_cut(plane: dict[str, Any]) -> None:
    c: Cluster = plane["cluster"]
    host, _, port = data_address(plane, "h00").rpartition(":")
    before = dataplane_counters(plane, "h00")["refusals"]
    # raw TCP that never starts TLS: cut after the handshake timeout; beyond 16 per address
    # still handshaking, connections are closed at once
    raws = [socket.create_connection((host, int(port)), timeout=10) for _ in range(20)]
    try:
        for r in raws:
            assert closed(r)
    finally:
        for r in raws:
            r.close()
    d = wait_counter(plane, "h00", "handshake", before.get("handshake", 0) + 16)
    assert d["refusals"].get("limit", 0) - before.get("limit", 0) == 4
    assert d["refusals"]["handshake"] - before.get("handshake", 0) == 16
    # authenticated but silent: ERROR after the request timeout; a 9th connection from the
    # same host beyond the per-peer limit of 8 is refused at once
    idle = [tls_socket(plane, "h01") for _ in range(8)]
    try:
        c.wait_for(
            lambda: dataplane_counters(plane, "h00")["authenticated"] >= 8, 10, "8 connections"
        )
        extra = tls_socket(plane, "h01")
        assert read_frame(extra) == (KIND_ERROR, b"too many connections from h01")
        extra.close()
        for s in idle:
            assert read_frame(s) == (
                KIND_ERROR,
                f"request header incomplete: 0/{REQ.size} bytes before the timeout".encode(),
            )
            assert closed(s)
    finally:
        for s in idle:
            s.close()
    # a downstream that stops reading and granting credit is cut after the idle timeout
    a = assignment(plane, "h00")
    served, _ = _stripes_of(a, "h01")
    s = tls_socket(plane, "h01")
    try:
        s.sendall(
            _frame(
                OP_STREAM_STRIPE,
                {"job": plane["job"], "stripe": served[0], "fromPos": 0, "credits": 1},
            )
        )
        assert read_frame(s)[0] == KIND_BLOCK
        assert read_frame(s) == (KIND_ERROR, b"idle: no credit granted before the timeout")
        assert closed(s)
    finally:
        s.close()
    # and the server still serves
    blocks = ChunkFetch(
        data_address(plane, "h00"),
        plane["job"],
        0,
        tls=data_client_context(c.tls("h01")),
        peer="h00",
    ).run()
    assert [b.block for b in blocks] == list(plane["manifest"].chunk_blocks(0))


def test_accept_loop_survives_emfile_and_reports_unhealthy(plane: dict[str, Any]) -> None:
    c: Cluster = plane["cluster"]
    nofile = 80
    c.start_agent(
        "h05",
        "r1",
        labels="cluster=spare",
        extra_args=["--handshake-timeout", "2", "--max-handshaking-per-address", "500"],
        prefix=["prlimit", f"--nofile={nofile}:{nofile}"],
    )
    pid = c.agents["h05"]["pid"]
    used = len(os.listdir(f"/proc/{pid}/fd"))
    assert used < nofile
    host, _, port = c.agents["h05"]["dataAddress"].rpartition(":")
    socks = []
    try:
        for _ in range(nofile - used + 40):  # more than it has descriptors left
            socks.append(socket.create_connection((host, int(port)), timeout=10))
        d = c.wait_for(
            lambda: (
                (x := dataplane_counters(plane, "h05"))["accept_errors"].get("EMFILE", 0) >= 1 and x
            ),
            30,
            "EMFILE in the accept loop",
        )
        assert d["health"].startswith("data plane accept failed: EMFILE")
    finally:
        for s in socks:
            s.close()
    # still serving: an authenticated request gets a proper answer
    s = c.wait_for(lambda: tls_socket(plane, "h01", to="h05"), 30, "h05 accepting again")
    try:
        s.sendall(_frame(OP_FETCH_CHUNK, {"job": "dj_none", "chunk": 0}))
        assert read_frame(s) == (KIND_ERROR, b"unknown job")
    finally:
        s.close()
    assert c.procs["h05"].poll() is None
    # and the coordinator heard it was unhealthy (heartbeat)
    cl = c.client()
    try:
        inv = c.wait_for(
            lambda: (h := cl.list_hosts().by_host()["h05"]).health and h,
            40,
            "h05 health in the inventory",
        )
    finally:
        cl.close()
    assert inv.health.startswith("data plane accept failed: EMFILE")
    log = (c.base / "logs" / "h05.log").read_text()
    assert "Traceback" not in log
    _ = struct  # keep the import for frame layout readers
