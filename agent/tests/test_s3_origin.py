"""S3 origin against moto's S3 server (a real process on loopback): ranged, version-pinned
reads; parallel range GETs seen by a real proxy in front of it (concurrency, retries)."""

from __future__ import annotations

import contextlib
import http.client
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

import pytest
from agent_harness import Cluster, assert_placed
from relgate_trust.manifest import build_manifest, envelope_bytes, sign_manifest

from relgate_agent.dataplane.manifestread import (
    CHECK_MANIFEST_TOO_LARGE,
    ManifestReadError,
    read_manifest,
)
from relgate_agent.dataplane.origin import ManifestReader, S3Origin, open_origin, read_uri
from relgate_agent.dataplane.rangefetch import ParallelRanges, RangePlan, plan_ranges
from relgate_agent.errors import OriginError

pytestmark = pytest.mark.s3

CREDS = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
}


@pytest.fixture
def s3_endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    pytest.importorskip("moto")
    exe = shutil.which("moto_server", path=os.path.dirname(sys.executable)) or shutil.which(
        "moto_server"
    )
    if exe is None:
        pytest.skip("moto_server is not installed")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    log = open(tmp_path / "moto.log", "w")  # noqa: SIM115
    proc = subprocess.Popen([exe, "-H", "127.0.0.1", "-p", str(port)], stdout=log, stderr=log)
    endpoint = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "moto server did not start"
                time.sleep(0.1)
        for k, v in CREDS.items():
            monkeypatch.setenv(k, v)
        monkeypatch.setenv("AWS_ENDPOINT_URL", endpoint)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def _upload(client, bucket: str, prefix: str, src: Path) -> dict[str, str]:
    versions = {}
    for p in sorted(src.rglob("*")):
        if p.is_file():
            rel = p.relative_to(src).as_posix()
            resp = client.put_object(Bucket=bucket, Key=f"{prefix}/{rel}", Body=p.read_bytes())
            versions[rel] = resp["VersionId"]
    return versions


def test_s3_ranged_reads_pin_object_versions(s3_endpoint: str, checkpoint, keypair) -> None:
    import boto3

    key, _, _ = keypair
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="ckpt")
    client.put_bucket_versioning(Bucket="ckpt", VersioningConfiguration={"Status": "Enabled"})
    src = checkpoint["origin"]
    versions = _upload(client, "ckpt", "claude-x/v1", src)
    m = build_manifest(src, "claude-x", "v1", 1 << 20, 64 << 10, object_versions=versions)
    assert all(f.object_version for f in m.files)
    # overwrite one object: a pinned read must still return the bytes the manifest hashed
    victim = m.files[1].path
    client.put_object(Bucket="ckpt", Key=f"claude-x/v1/{victim}", Body=b"x" * 100)
    origin = open_origin("s3://ckpt/claude-x/v1")
    assert isinstance(origin, S3Origin)
    data = b"".join((src / f.path).read_bytes() for f in m.files)
    reader = ManifestReader(origin, m)
    for off, n in [(0, 1000), (m.files[1].offset - 10, 5000), (m.total_size - 77, 77)]:
        assert reader.read(off, n) == data[off : off + n]
    client.put_object(
        Bucket="ckpt",
        Key="claude-x/v1/manifest.dsse.json",
        Body=envelope_bytes(sign_manifest(m, key)),
    )
    assert read_uri("s3://ckpt/claude-x/v1/manifest.dsse.json").startswith(b"{")
    # the bounded manifest read (CreateJob, takeover, the CLI) takes the same object
    got = read_manifest("s3://ckpt/claude-x/v1/manifest.dsse.json")
    assert got == read_uri("s3://ckpt/claude-x/v1/manifest.dsse.json")
    with pytest.raises(ManifestReadError) as exc:
        read_manifest("s3://ckpt/claude-x/v1/manifest.dsse.json", max_bytes=10)
    assert exc.value.check == CHECK_MANIFEST_TOO_LARGE


def test_distribution_from_s3_origin(s3_endpoint: str, tmp_path: Path, checkpoint, keypair) -> None:
    import boto3

    key, _, trusted = keypair
    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="ckpt")
    client.put_bucket_versioning(Bucket="ckpt", VersioningConfiguration={"Status": "Enabled"})
    src = checkpoint["origin"]
    versions = _upload(client, "ckpt", "claude-x/2026-10-12.3", src)
    m = build_manifest(src, "claude-x", "2026-10-12.3", 1 << 20, 64 << 10, object_versions=versions)
    client.put_object(
        Bucket="ckpt",
        Key="claude-x/2026-10-12.3/manifest.dsse.json",
        Body=envelope_bytes(sign_manifest(m, key)),
    )
    cluster = Cluster(tmp_path / "c", trusted, ["--report-interval", "0.5"])
    hosts = [("h00", "r0"), ("h01", "r1"), ("h02", "r0")]
    try:
        cluster.start_coordinator()
        for h, r in hosts:
            cluster.start_agent(h, r)
        cluster.wait_registered(len(hosts))
        c = cluster.client()
        try:
            job = c.create_job(
                model="claude-x",
                version="2026-10-12.3",
                manifest_uri="s3://ckpt/claude-x/2026-10-12.3/manifest.dsse.json",
                target_selector="cluster=inf-a",
                ready_threshold_ppm=1_000_000,
                stripes=2,
            ).job_id
        finally:
            c.close()
        st = cluster.wait_for(
            lambda: (s := cluster.status(job))["hosts_ready"] == 3 and s, 120, "READY"
        )
    finally:
        cluster.stop_all()
    for h, _ in hosts:
        assert_placed(cluster, {**checkpoint, "manifest": m}, h)
    assert st["origin_bytes"] <= 1.05 * m.total_size


class _S3Proxy(ThreadingHTTPServer):
    """A threading HTTP proxy in front of moto that sees every ranged GET: how many are in
    flight at once (the most it saw), and which ranges it answered short (a fault).

    With ``gate`` > 1, the first ranged GETs are held until ``gate`` of them are in flight
    (or 10 s pass), so a reader that keeps N ranges in flight is seen with exactly N at once
    (a serial reader would be seen with one)."""

    daemon_threads = True

    def __init__(self, upstream: str, gate: int = 0, short: dict[str, int] | None = None) -> None:
        super().__init__(("127.0.0.1", 0), _ProxyHandler)
        self.upstream = urlparse(upstream)
        self.gate, self.short = gate, dict(short or {})
        self.cond = threading.Condition()
        self.inflight = self.most = 0
        self.gets: list[str] = []  # "key range" of every ranged GET, in arrival order

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.server_address[1]}"


class _ProxyHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server: _S3Proxy

    def log_message(self, format: str, *args: object) -> None:
        pass

    def _forward(self) -> None:
        srv, rng = self.server, self.headers.get("Range", "")
        what = f"{urlparse(self.path).path} {rng}"
        body = self.rfile.read(int(self.headers.get("Content-Length") or 0))
        if self.command == "GET" and rng:
            with srv.cond:
                srv.gets.append(what)
                srv.inflight += 1
                srv.most = max(srv.most, srv.inflight)
                srv.cond.notify_all()
                if srv.most < srv.gate:
                    srv.cond.wait_for(lambda: srv.most >= srv.gate, 10)
        try:
            conn = http.client.HTTPConnection(srv.upstream.hostname, srv.upstream.port, timeout=30)
            conn.request(self.command, self.path, body or None, dict(self.headers))
            resp = conn.getresponse()
            data = resp.read()
            conn.close()
        finally:
            if self.command == "GET" and rng:
                with srv.cond:
                    srv.inflight -= 1
        if rng and srv.short.get(what, 0) > 0:  # the fault: a short (but well-formed) body
            srv.short[what] -= 1
            data = data[: len(data) // 2]
        self.send_response(resp.status)
        for k, v in resp.getheaders():
            if k.lower() not in ("content-length", "transfer-encoding", "connection"):
                self.send_header(k, v)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    do_GET = do_PUT = do_HEAD = do_POST = do_DELETE = _forward


@contextlib.contextmanager
def _proxy(upstream: str, **kw: Any) -> Iterator[_S3Proxy]:
    srv = _S3Proxy(upstream, **kw)
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        yield srv
    finally:
        srv.shutdown()
        srv.server_close()
        t.join(10)


def _s3_reader(s3_endpoint: str, checkpoint: dict[str, Any]) -> tuple[Any, bytes]:
    """The checkpoint uploaded to moto; its manifest and its bytes (concatenated)."""
    import boto3

    client = boto3.client("s3", endpoint_url=s3_endpoint)
    client.create_bucket(Bucket="ckpt")
    client.put_bucket_versioning(Bucket="ckpt", VersioningConfiguration={"Status": "Enabled"})
    src = checkpoint["origin"]
    _upload(client, "ckpt", "claude-x/v1", src)
    m = build_manifest(src, "claude-x", "v1", 1 << 20, 64 << 10)
    return m, b"".join((src / f.path).read_bytes() for f in m.files)


def _read_all(endpoint: str, m: Any, plan: RangePlan) -> bytes:
    reader = ManifestReader(S3Origin("ckpt", "claude-x/v1", endpoint_url=endpoint), m)
    ranges = plan_ranges(range(m.num_blocks), m.block_range, plan.range_bytes)
    return b"".join(b for _, b in ParallelRanges(reader.read, plan).fetch(ranges))


def test_parallel_range_gets_are_concurrent_in_order_and_exact(
    s3_endpoint: str, checkpoint
) -> None:
    m, data = _s3_reader(s3_endpoint, checkpoint)
    plan = RangePlan(parallel=4, range_bytes=1 << 20)
    with _proxy(s3_endpoint, gate=4) as px:
        assert _read_all(px.endpoint, m, plan) == data  # in order, byte for byte
    assert px.most == 4  # the server saw four ranged GETs at once, never more
    assert len(px.gets) >= m.total_size // (1 << 20)
    with _proxy(s3_endpoint) as px1:  # one in flight: the serial read, for comparison
        assert _read_all(px1.endpoint, m, RangePlan(1, 1 << 20)) == data
    assert px1.most == 1
    # the S3 default: 16 x 64 MiB, configurable per agent
    assert RangePlan.for_origin("s3://b/p") == RangePlan(16, 64 << 20)
    assert RangePlan.for_origin("s3://b/p", 8, 1 << 20) == RangePlan(8, 1 << 20)
    assert RangePlan.for_origin("/dir").parallel < RangePlan.for_origin("http://x").parallel < 16


def test_a_short_range_is_retried_alone_and_a_lasting_one_is_an_origin_error(
    s3_endpoint: str, checkpoint
) -> None:
    m, data = _s3_reader(s3_endpoint, checkpoint)
    plan = RangePlan(parallel=4, range_bytes=1 << 20, attempts=3)
    # the range 2-3 MiB of the concatenated space lies inside one object: its key range
    f = next(f for f in m.files if f.offset <= 2 << 20 and f.offset + f.size >= 3 << 20)
    key_range = (
        f"/ckpt/claude-x/v1/{f.path} bytes={(2 << 20) - f.offset}-{(3 << 20) - f.offset - 1}"
    )
    with _proxy(s3_endpoint, short={key_range: 1}) as px:
        assert _read_all(px.endpoint, m, plan) == data  # retried, then exact
    assert px.gets.count(key_range) == 2  # that range twice (tenacity), no other range again
    assert all(px.gets.count(g) == 1 for g in px.gets if g != key_range)
    failed = rf"origin range {2 << 20}\+{1 << 20} failed 3 tries"
    with (
        _proxy(s3_endpoint, short={key_range: 99}) as bad,
        pytest.raises(OriginError, match=failed),
    ):
        _read_all(bad.endpoint, m, plan)
    assert bad.gets.count(key_range) == 3
