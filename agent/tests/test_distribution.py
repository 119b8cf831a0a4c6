"""End-to-end distribution with real processes on loopback: coordinator + >= 8 agents, 2 racks."""

from __future__ import annotations

import hashlib
import json
import signal
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import pytest
from conftest import write_checkpoint
from harness import Cluster

from relgate_agent.manifest import build_manifest, sign_manifest, write_envelope

KiB = 1024
MiB = 1024 * KiB
HOSTS = [(f"h{i:02d}", f"r{i % 2}") for i in range(8)]


@pytest.fixture
def checkpoint(tmp_path: Path, keypair) -> dict[str, Any]:
    key, _, trusted = keypair
    src = write_checkpoint(
        tmp_path / "origin" / "ckpt",
        {
            "model-00001-of-00003.safetensors": 10 * MiB + 123,
            "model-00002-of-00003.safetensors": 9 * MiB,
            "model-00003-of-00003.safetensors": 5 * MiB - 7,
            "config.json": 513,
        },
    )
    m = build_manifest(src, "claude-x", "2026-10-12.3", chunk_size=1 * MiB, block_size=64 * KiB)
    env_path = tmp_path / "origin" / "manifest.dsse.json"
    write_envelope(sign_manifest(m, key), env_path)
    digests = {f.path: hashlib.sha256((src / f.path).read_bytes()).hexdigest() for f in m.files}
    return {"manifest": m, "envelope": env_path, "origin": src, "trusted": trusted, "digests": digests}


@pytest.fixture
def cluster(tmp_path: Path, checkpoint):
    c = Cluster(tmp_path / "cluster", checkpoint["trusted"], ["--dead-after", "3", "--report-interval", "0.5"])
    try:
        yield c
    finally:
        c.stop_all()


class Webhook:
    def __init__(self) -> None:
        self.events: list[dict[str, Any]] = []
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers["Content-Length"])
                outer.events.append(json.loads(self.rfile.read(n)))
                self.send_response(204)
                self.end_headers()

            def log_message(self, *a: Any) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), H)
        self.url = f"http://127.0.0.1:{self.server.server_port}/deploy"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def webhook():
    w = Webhook()
    try:
        yield w
    finally:
        w.close()


def assert_placed(cluster: Cluster, checkpoint: dict[str, Any], host: str) -> None:
    m = checkpoint["manifest"]
    final = cluster.models_root(host) / m.model / m.version
    assert final.is_dir(), f"{host} has no placed copy"
    for f in m.files:
        got = hashlib.sha256((final / f.path).read_bytes()).hexdigest()
        assert got == checkpoint["digests"][f.path], f"{host}:{f.path} differs"
    assert not (cluster.models_root(host) / ".staging" / m.model / m.version).exists()


def start_hosts(cluster: Cluster, hosts=HOSTS, env_for: dict[str, dict[str, str]] | None = None) -> None:
    for h, r in hosts:
        cluster.start_agent(h, r, env=(env_for or {}).get(h))
    cluster.wait_registered(len(hosts))


def create_job(cluster: Cluster, checkpoint: dict[str, Any], **kw: Any) -> str:
    c = cluster.client()
    try:
        spec = {
            "model": "claude-x",
            "version": "2026-10-12.3",
            "manifest_uri": str(checkpoint["envelope"]),
            "origin_uri": str(checkpoint["origin"]),
            "target_selector": "cluster=inf-a",
            "ready_threshold_ppm": 1_000_000,
            "stripes": 4,
        }
        spec.update(kw)
        return c.create_job(**spec).job_id
    finally:
        c.close()


def stats(cluster: Cluster, host: str, job: str) -> list[dict[str, Any]]:
    d = cluster.models_root(host) / ".agent-stats"
    return [json.loads(p.read_text()) for p in sorted(d.glob(f"{job}.*.json"))]


def test_fanout_all_hosts_byte_exact(cluster: Cluster, checkpoint, webhook) -> None:
    cluster.start_coordinator()
    start_hosts(cluster)
    job = create_job(cluster, checkpoint, webhook_url=webhook.url)
    st = cluster.wait_for(lambda: (s := cluster.status(job))["hosts_ready"] == 8 and s, 120, "all hosts READY")
    for h, _ in HOSTS:
        assert_placed(cluster, checkpoint, h)
    size = checkpoint["manifest"].total_size
    # origin read ~once: roots read each block of their stripe once
    origin = sum(s["origin_bytes"] for h, _ in HOSTS for s in stats(cluster, h, job))
    assert origin <= 1.05 * size
    assert st["origin_bytes"] <= 1.05 * size
    cluster.wait_for(lambda: webhook.events, 30, "DistributionComplete webhook")
    ev = webhook.events[0]
    assert ev["type"] == "DistributionComplete" and ev["job"] == job and ev["version"] == "2026-10-12.3"
    assert sorted(ev["readyHosts"]) == sorted(h for h, _ in HOSTS)
