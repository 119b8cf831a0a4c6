"""Every manifest read is bounded before it is parsed, regular files only, with a deadline:
real FIFOs, /dev/zero, sparse oversize files and HTTP servers that never stop or drip."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from agent_harness import Cluster
from relgate_trust.dsse import MAX_ENVELOPE_BYTES
from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import TrustedKeys
from test_cli import _run

from relgate_agent.cli import EXIT_REJECTED
from relgate_agent.client import CoordinatorRefusal
from relgate_agent.coordinator.service import Coordinator, CoordinatorConfig
from relgate_agent.dataplane.manifestread import (
    CHECK_MANIFEST_DEADLINE,
    CHECK_MANIFEST_NOT_REGULAR,
    CHECK_MANIFEST_READ,
    CHECK_MANIFEST_TOO_LARGE,
    ManifestReadError,
    read_manifest,
)


def _check(uri: str, **kw: Any) -> str:
    with pytest.raises(ManifestReadError) as exc:
        read_manifest(uri, **kw)
    return exc.value.check


@pytest.fixture
def http_base() -> Iterator[str]:
    """/endless: bytes until the client goes; /drip: a byte every 0.2 s; /huge: announces
    a 1 GiB body; /ok: a small body."""

    class H(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(200)
            if self.path == "/huge":
                self.send_header("Content-Length", str(1 << 30))
            elif self.path == "/ok":
                self.send_header("Content-Length", "2")
            self.end_headers()
            try:
                if self.path == "/ok":
                    self.wfile.write(b"{}")
                elif self.path == "/thousand":  # no length: the body ends with the stream
                    self.wfile.write(b"x" * 1000)
                elif self.path == "/endless":
                    while True:
                        self.wfile.write(bytes(64 << 10))
                elif self.path == "/drip":
                    for _ in range(200):
                        self.wfile.write(b"x")
                        self.wfile.flush()
                        time.sleep(0.2)
            except OSError:
                pass

        def log_message(self, *a: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


def test_local_reads_refuse_fifo_device_directory_and_oversize(tmp_path: Path) -> None:
    fifo = tmp_path / "manifest.fifo"
    os.mkfifo(fifo)
    # a FIFO with no writer: refused at once (a blocking open would wait for ever; the
    # deadline would then answer manifest-deadline, not this check)
    assert _check(str(fifo), deadline_s=5) == CHECK_MANIFEST_NOT_REGULAR
    assert _check(f"file://{fifo}", deadline_s=5) == CHECK_MANIFEST_NOT_REGULAR
    assert _check("/dev/zero", deadline_s=5) == CHECK_MANIFEST_NOT_REGULAR
    assert _check(str(tmp_path), deadline_s=5) == CHECK_MANIFEST_NOT_REGULAR
    assert _check(str(tmp_path / "missing.json")) == CHECK_MANIFEST_READ
    big = tmp_path / "big.json"
    with big.open("wb") as f:
        f.truncate(MAX_ENVELOPE_BYTES + 1)  # sparse: refused by its size, never read
    assert _check(str(big)) == CHECK_MANIFEST_TOO_LARGE
    small = tmp_path / "small.json"
    small.write_bytes(b"x" * 1001)
    assert _check(str(small), max_bytes=1000) == CHECK_MANIFEST_TOO_LARGE
    assert read_manifest(str(small), max_bytes=1001) == b"x" * 1001
    assert _check("ftp://host/manifest.json") == CHECK_MANIFEST_READ


def test_http_reads_refuse_endless_oversize_and_dripping_bodies(http_base: str) -> None:
    assert read_manifest(f"{http_base}/ok") == b"{}"
    assert read_manifest(f"{http_base}/ok", max_bytes=2) == b"{}"  # a length at the bound
    # a body without a length: at the bound it is read whole, one byte over it is refused
    # (never cut to the bound and parsed)
    assert read_manifest(f"{http_base}/thousand", max_bytes=1000) == b"x" * 1000
    assert _check(f"{http_base}/thousand", max_bytes=999) == CHECK_MANIFEST_TOO_LARGE
    assert _check(f"{http_base}/endless", max_bytes=1 << 20) == CHECK_MANIFEST_TOO_LARGE
    assert _check(f"{http_base}/huge") == CHECK_MANIFEST_TOO_LARGE  # by its header
    assert _check(f"{http_base}/drip", deadline_s=1.0) == CHECK_MANIFEST_DEADLINE


def test_cli_manifest_verify_refuses_fifo_and_dev_zero(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], checkpoint: dict[str, Any]
) -> None:
    fifo = tmp_path / "m.fifo"
    os.mkfifo(fifo)
    for uri in (str(fifo), "/dev/zero"):
        rc, out = _run(
            capsys,
            "manifest",
            "verify",
            "--json",
            uri,
            "--trusted-keys",
            str(checkpoint["trusted"]),
        )
        assert rc == EXIT_REJECTED and out["check"] == CHECK_MANIFEST_NOT_REGULAR, out
    rc, out = _run(
        capsys,
        "manifest",
        "verify",
        "--json",
        str(checkpoint["envelope"]),
        "--trusted-keys",
        str(checkpoint["trusted"]),
    )
    assert rc == 0 and out["manifestDigest"] == checkpoint["manifest"].digest


def test_fifo_creates_are_refused_and_the_coordinator_keeps_answering(
    cluster: Cluster, checkpoint: dict[str, Any], tmp_path: Path
) -> None:
    """Eight concurrent CreateJobs naming a FIFO (they used to block every RPC thread)."""
    cluster.start_coordinator()
    fifo = tmp_path / "manifest.fifo"
    os.mkfifo(fifo)
    checks: list[str] = []

    def create(i: int) -> None:
        c = cluster.client()
        try:
            c.create_job(
                model="claude-x",
                version="2026-10-12.3",
                manifest_uri=str(fifo),
                target_selector="cluster=inf-a",
                job_id=f"dj_fifo{i}",
                timeout=30,
            )
        except CoordinatorRefusal as exc:
            checks.append(exc.check)
        finally:
            c.close()

    threads = [threading.Thread(target=create, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert checks == [CHECK_MANIFEST_NOT_REGULAR] * 8
    c = cluster.client()
    try:  # GetJob still answers (NOT_FOUND for a job that was never created)
        with pytest.raises((CoordinatorRefusal, grpc.RpcError)) as exc:
            c.get_job("dj_fifo0", timeout=10)
        code = exc.value.code
        assert (code() if callable(code) else code) in (
            grpc.StatusCode.NOT_FOUND,
            grpc.StatusCode.NOT_FOUND.name,
        )
    finally:
        c.close()


def test_takeover_reads_a_fifo_manifest_bounded_and_fails_that_job(
    tmp_path: Path, checkpoint: dict[str, Any]
) -> None:
    """A job whose manifest became a FIFO: the next coordinator on the store marks it FAILED
    (it never blocks loading) and answers."""
    db = str(tmp_path / "c.sqlite")
    env = tmp_path / "manifest.dsse.json"
    env.write_bytes(Path(checkpoint["envelope"]).read_bytes())
    cfg = CoordinatorConfig(db=db, trusted_keys=TrustedKeys.load(checkpoint["trusted"]))
    first = Coordinator(cfg)
    first.enroll("h0", "r0", {"cluster": "x"})
    first.heartbeat("h0", "r0", "10.0.0.1:1", [])
    spec = JobSpec(
        model="claude-x",
        version="2026-10-12.3",
        manifest_uri=str(env),
        target_selector="cluster=x",
        job_id="dj_takeover",
    )
    first.create_job(spec)
    first.close()
    env.unlink()
    os.mkfifo(env)
    second = Coordinator(cfg)
    try:
        assert "dj_takeover" not in second.jobs
        assert second.store.job_state("dj_takeover") == "FAILED"
        assert second.job_status("dj_takeover").state == "FAILED"
    finally:
        second.close()
