"""Real-process distribution harness: one coordinator and N agents on loopback."""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import signal
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Any

import grpc
import pytest
from prometheus_client.parser import text_string_to_metric_families
from relgate_lab import lab_env
from relgate_lab.faults import FAULT_ENV

from relgate_agent.attestation import HandoffError, load_ca, verify_event_bytes
from relgate_agent.client import CoordinatorClient, job_to_dict
from relgate_agent.pki import TlsFiles, ensure_dev_pki

# Helper module names are prefixed (agent_harness, not harness): the main package's tests
# directory has its own `harness` package and may be on sys.path in a combined run.
HOSTS = [(f"h{i:02d}", f"r{i % 2}") for i in range(8)]
# a coordinator still starting or electing answers these; anything else is a refusal
TRANSIENT = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)


def write_checkpoint(root: Path, sizes: dict[str, int], seed: int = 7) -> Path:
    """Deterministic pseudo-random checkpoint files (not compressible, not all zeros)."""
    import random

    rng = random.Random(seed)
    piece = 64 << 20  # randbytes of more than 256 MiB overflows; a multiple of 4 bytes
    for rel, size in sizes.items():  # keeps the stream identical to one call
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        with p.open("wb") as fh:
            for start in range(0, size, piece):
                fh.write(rng.randbytes(min(piece, size - start)))
    return root


class Webhook:
    """A deployer's webhook on loopback: answers ``fail_status`` to the first ``fail_first``
    POSTs, then 204. ``requests`` holds every POST (headers by lower-case name, body),
    ``events`` the accepted."""

    def __init__(self, fail_first: int = 0, fail_status: int = 503, ca: Path | None = None) -> None:
        self.events: list[dict[str, Any]] = []
        self.requests: list[tuple[dict[str, str], dict[str, Any]]] = []
        self.refused: list[str] = []  # with ``ca``: the check of each event refused (403)
        self.fail_first, self.fail_status = fail_first, fail_status
        self.lock = threading.Lock()
        outer = self

        class H(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                n = int(self.headers["Content-Length"])
                raw = self.rfile.read(n)
                body = json.loads(raw)
                if ca is not None:  # a deployer that verifies the handoff
                    try:
                        verify_event_bytes(raw, load_ca(ca))
                    except HandoffError as exc:
                        with outer.lock:
                            outer.refused.append(exc.check)
                        self.send_response(403)
                        self.end_headers()
                        return
                with outer.lock:
                    outer.requests.append(({k.lower(): v for k, v in self.headers.items()}, body))
                    failing = outer.fail_first > 0
                    if failing:
                        outer.fail_first -= 1
                    else:
                        outer.events.append(body)
                self.send_response(outer.fail_status if failing else 204)
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


def job_spec(checkpoint: dict[str, Any], **overrides: Any) -> dict[str, Any]:
    """CreateJob's fields for the test checkpoint to every ``cluster=inf-a`` host."""
    return {
        "model": "claude-x",
        "version": "2026-10-12.3",
        "manifest_uri": str(checkpoint["envelope"]),
        "origin_uri": str(checkpoint["origin"]),
        "target_selector": "cluster=inf-a",
        "ready_threshold_ppm": 1_000_000,
        "stripes": 4,
        **overrides,
    }


def assert_placed(cluster: Any, checkpoint: dict[str, Any], host: str) -> None:
    m = checkpoint["manifest"]
    final = cluster.models_root(host) / m.model / m.version
    assert final.is_dir(), f"{host} has no placed copy"
    for f in m.files:
        got = hashlib.sha256((final / f.path).read_bytes()).hexdigest()
        assert got == checkpoint["digests"][f.path], f"{host}:{f.path} differs"
    assert not (cluster.models_root(host) / ".staging" / m.model / m.version).exists()


def _spawn(
    cmd: list[str], log: Path, env: dict[str, str] | None = None, prefix: list[str] | None = None
) -> subprocess.Popen[str]:
    env = {**os.environ, **(env or {})}
    # an agent with faults runs through the lab's entry point (hooks installed, same CLI)
    module = "relgate_lab.faulty_agent" if env.get(FAULT_ENV) else "relgate_agent"
    with open(log, "a") as fh:  # the child keeps its own descriptor
        return subprocess.Popen(
            [*(prefix or []), sys.executable, "-m", module, "--json", *cmd],
            stdout=subprocess.PIPE,
            stderr=fh,
            text=True,
            env=lab_env(env),
        )


def _ready(proc: subprocess.Popen[str], log: Path) -> dict[str, Any]:
    """The first stdout line of a serve command is its JSON banner (address, pid)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if not line:
        proc.wait(10)
        raise RuntimeError(f"process exited early; see {log}:\n{log.read_text()[-3000:]}")
    return json.loads(line)


def _start(
    cmd: list[str], log: Path, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen[str], dict[str, Any]]:
    proc = _spawn(cmd, log, env)
    return proc, _ready(proc, log)


@dataclass
class Cluster:
    base: Path
    trusted: Path
    coordinator_args: list[str] = field(default_factory=list)
    agent_trusted: Path | None = None
    procs: dict[str, subprocess.Popen[str]] = field(default_factory=dict)
    coordinator: str = ""
    agents: dict[str, dict[str, Any]] = field(default_factory=dict)
    # host -> (rack, labels) enrolled with every coordinator this cluster starts
    enrolled: dict[str, tuple[str, str]] = field(default_factory=dict)
    enroll: bool = True

    @property
    def pki(self) -> Path:
        """Fleet dev PKI (CA, coordinator, operator, one cert per host started)."""
        return ensure_dev_pki(self.base, {h: r for h, (r, _) in self.enrolled.items()})

    def tls(self, name: str = "operator") -> TlsFiles:
        return TlsFiles.from_pki(self.base / "pki", name)

    def enroll_host(self, host: str, rack: str, labels: str = "cluster=inf-a") -> None:
        labels_d = dict(i.split("=", 1) for i in labels.split(",") if "=" in i)
        self.wait_for(
            lambda: self._enroll(host, rack, labels_d), 30, f"enrolling {host}", interval=0.2
        )

    def _enroll(self, host: str, rack: str, labels: dict[str, str]) -> bool:
        c = self.client()
        try:
            c.enroll_host(host, rack, labels, timeout=5)
            return True
        finally:
            c.close()

    def start_coordinator_with_db(self, db: str, listen: str = "127.0.0.1:0") -> str:
        self.db = db
        return self.start_coordinator(listen)

    def start_coordinator(
        self, listen: str = "127.0.0.1:0", name: str = "coordinator", extra: list[str] | None = None
    ) -> str:
        (self.base / "logs").mkdir(parents=True, exist_ok=True)
        proc, info = _start(
            [
                "coordinator",
                "serve",
                "--listen",
                listen,
                "--db",
                getattr(self, "db", "") or str(self.base / "coordinator.sqlite"),
                "--trusted-keys",
                str(self.trusted),
                "--pki",
                str(self.pki),
                *self.coordinator_args,
                *(extra or []),
            ],
            self.base / "logs" / f"{name}.log",
        )
        self.procs[name] = proc
        self.coordinator = info["listening"]
        self.coordinator_info = info  # what serve printed: addresses, metrics, pid
        if self.enroll and "--ha" not in (extra or []):
            for h, (r, labels) in self.enrolled.items():
                self.enroll_host(h, r, labels)
        return self.coordinator

    def models_root(self, host: str) -> Path:
        return self.base / "hosts" / host / "models"

    def journaled(self, host: str, manifest: Any) -> int:
        """How many chunks ``host``'s journal for ``manifest``'s version records verified."""
        return journaled_chunks(self.models_root(host), manifest)

    def start_agent(
        self,
        host: str,
        rack: str,
        labels: str = "cluster=inf-a",
        env: dict[str, str] | None = None,
        journal_interval: float = 0.3,
        wait: bool = True,
        extra_args: list[str] | None = None,
        prefix: list[str] | None = None,
    ) -> None:
        self.models_root(host).mkdir(parents=True, exist_ok=True)
        self.enrolled.setdefault(host, (rack, labels))
        pki = self.pki  # issues this host's certificate if missing
        if self.enroll and self.coordinator:
            self.enroll_host(host, rack, labels)
        proc = _spawn(
            [
                "agent",
                "serve",
                "--host-id",
                host,
                "--rack",
                rack,
                "--labels",
                labels,
                "--coordinator",
                self.coordinator,
                "--models-root",
                str(self.models_root(host)),
                "--trusted-keys",
                str(self.agent_trusted or self.trusted),
                "--journal-interval",
                str(journal_interval),
                "--report-interval",
                "0.5",
                "--pki",
                str(pki),
                *(extra_args or []),
            ],
            self.base / "logs" / f"{host}.log",
            env,
            prefix,
        )
        self.procs[host] = proc
        if wait:
            self.agents[host] = _ready(proc, self.base / "logs" / f"{host}.log")

    def wait_started(self) -> None:
        """Collect the banners of agents started with wait=False (they boot in parallel)."""
        for host, proc in self.procs.items():
            if not host.startswith("coordinator") and host not in self.agents:
                self.agents[host] = _ready(proc, self.base / "logs" / f"{host}.log")

    def kill(self, name: str, sig: int = signal.SIGKILL) -> None:
        proc = self.procs.pop(name)
        self.agents.pop(name, None)
        proc.send_signal(sig)
        proc.wait(20)
        if proc.stdout:
            proc.stdout.close()

    def stop_all(self) -> None:
        for name in list(self.procs):
            proc = self.procs[name]
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + 15
        for name in list(self.procs):
            proc = self.procs.pop(name)
            try:
                proc.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait(5)
            if proc.stdout:
                proc.stdout.close()

    def client(self) -> CoordinatorClient:
        return CoordinatorClient(self.coordinator, self.tls("operator"))

    def status(self, job_id: str) -> dict[str, Any]:
        c = self.client()
        try:
            return job_to_dict(c.get_job(job_id))
        finally:
            c.close()

    def wait_for(self, pred: Any, timeout: float, what: str, interval: float = 0.2) -> Any:
        deadline = time.monotonic() + timeout
        last: Any = None
        while time.monotonic() < deadline:
            with contextlib.suppress(Exception):
                last = pred()
                if last:
                    return last
            time.sleep(interval)
        raise AssertionError(
            f"timed out waiting for {what}; last={last!r}; logs in {self.base / 'logs'}"
        )

    def create_full_job(self, n: int, job_id: str, timeout: float = 60, **spec: Any) -> str:
        """Create a job that covers n hosts and return its id.

        A job created before every agent's first heartbeat covers fewer hosts, and job creation
        is idempotent per id: asking again under the same id returns the short job forever. So a
        short job is cancelled and the next try uses a fresh id (``<job_id>_r<k>``). Only a
        coordinator that is not answering yet is waited out; a refusal fails the test at once.
        """
        c = self.client()
        deadline, attempt, last = time.monotonic() + timeout, 0, "nothing yet"
        try:
            while time.monotonic() < deadline:
                jid = job_id if attempt == 0 else f"{job_id}_r{attempt}"
                try:
                    total = c.create_job(job_id=jid, **spec).hosts_total
                except grpc.RpcError as exc:
                    if exc.code() not in TRANSIENT:
                        raise
                    last = f"{exc.code().name}: {exc.details()}"
                else:
                    if total == n:
                        return jid
                    last, attempt = f"{jid} covered {total}", attempt + 1
                    c.cancel_job(jid)
                time.sleep(0.5)
        finally:
            c.close()
        raise AssertionError(f"no job over {n} hosts ({last}); logs in {self.base / 'logs'}")

    def wait_registered(self, n: int, timeout: float = 30) -> None:
        import sqlite3

        def count() -> bool:
            con = sqlite3.connect(self.base / "coordinator.sqlite")
            try:
                return con.execute("SELECT COUNT(*) FROM dist_hosts").fetchone()[0] >= n
            finally:
                con.close()

        self.wait_for(count, timeout, f"{n} agents to register")


def journaled_chunks(models_root: Path, m: Any) -> int:
    """How many chunks the journal under ``models_root`` for ``m``'s version records
    verified (0 without one: not started, or placed and its staging gone)."""
    import base64

    p = models_root / ".staging" / m.model / m.version / "journal"
    try:
        doc = json.loads(p.read_bytes())
    except (OSError, ValueError):
        return 0
    return sum(bin(b).count("1") for b in base64.b64decode(doc["verified"]))


def create_lab_job(
    client: CoordinatorClient,
    checkpoint: dict[str, Any],
    hosts: int,
    timeout: float = 60,
    **spec: Any,
) -> str:
    """The test checkpoint to every ``cluster=lab`` host (4 stripes unless ``spec`` says),
    created again until all ``hosts`` registered; a replica taking over answers UNAVAILABLE
    for a moment (retried); any other error fails at once."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            job = client.create_job(**job_spec(checkpoint, target_selector="cluster=lab", **spec))
            if job.hosts_total == hosts:
                return str(job.job_id)
            client.cancel_job(job.job_id)
            last: object = f"{job.hosts_total} of {hosts} hosts registered"
        except grpc.RpcError as exc:
            if exc.code() != grpc.StatusCode.UNAVAILABLE:
                raise
            last = exc
        assert time.monotonic() < deadline, f"timed out creating the lab job (last: {last})"
        time.sleep(0.5)


def scrape(address: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """``/metrics`` parsed: (sample name, sorted labels) -> value."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in text_string_to_metric_families(text)
        for s in family.samples
    }


@contextlib.contextmanager
def running_lab(spec: Any) -> Iterator[dict[str, Any]]:
    """A network-namespace lab for one test (skipped without root and ``ip netns``): up,
    yielded, then down, with every namespace it made gone."""
    from relgate_lab.netns import lab_down, lab_up, netns_available

    if not netns_available():
        pytest.skip("network-namespace lab needs root and `ip netns`")
    state = lab_up(spec)
    try:
        yield state
    finally:
        lab_down(spec.state_dir)
        leftover = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
        assert f"rgl{state['id']}" not in leftover
