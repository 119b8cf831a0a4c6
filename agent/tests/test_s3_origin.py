"""S3 origin against moto's S3 server (a real process on loopback): ranged, version-pinned reads."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from agent_harness import Cluster, assert_placed

from relgate_agent.manifest import build_manifest, envelope_bytes, sign_manifest
from relgate_agent.origin import ManifestReader, S3Origin, open_origin, read_uri

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
