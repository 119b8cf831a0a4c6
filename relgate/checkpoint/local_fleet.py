"""The embedded local fleet, a harness: agent processes on loopback, a free port for each, and
the deployer's webhook.

Only the embedded default of ``relgate distribute`` (no ``--coordinator``), the demo and the
tests start it; a distribution to a running fleet (:class:`relgate.checkpoint.fleet.FleetService`)
never imports this module.

The supervisor starts ``relgate-agent agent serve`` processes (mutual TLS with a dev PKI
under the workspace) and stops each by PID on exit; the webhook sink receives the
coordinator's DistributionComplete POSTs, as a deployer would.
"""

from __future__ import annotations

import json
import secrets
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from relgate_trust.datacenter import rack_dc, with_dc

from relgate.checkpoint.fleet import FleetMember
from relgate.integrity.contract import Contract, JsonObject
from relgate.workspace import Workspace
from relgate_agent.attestation import (
    CHECK_HANDOFF_MALFORMED,
    MAX_EVENT_BYTES,
    HandoffError,
    load_ca,
    verify_event_bytes,
)
from relgate_agent.pki import ensure_dev_pki

_STOP_GRACE_S = 10.0


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class WebhookSink:
    """Receives DistributionComplete POSTs on loopback (the deployer's side, for the demo).

    With ``ca`` (the fleet CA certificate) an event is accepted only if the coordinator
    signed it and every READY host it names attested its placement
    (:func:`relgate_agent.attestation.verify_event_bytes`); an unsigned or forged event is
    answered 403 and kept in ``refused`` (its check) instead."""

    def __init__(self, ca: Path | None = None) -> None:
        self.events: list[JsonObject] = []
        self.refused: list[str] = []
        sink = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", 0) or 0)
                if length > MAX_EVENT_BYTES:
                    sink.refused.append(CHECK_HANDOFF_MALFORMED)
                    self.send_response(413)
                    self.end_headers()
                    return
                body = self.rfile.read(length)
                if ca is not None:
                    try:
                        verify_event_bytes(body, load_ca(ca))
                    except HandoffError as exc:
                        sink.refused.append(exc.check)
                        self.send_response(403)
                        self.end_headers()
                        return
                try:
                    sink.events.append(json.loads(body))
                except ValueError:
                    sink.events.append({"raw": body.decode(errors="replace")})
                self.send_response(204)
                self.end_headers()

            def log_message(self, format: str, *args: object) -> None:
                pass

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}/distribution-complete"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def first_event(self, timeout_s: float = 10.0) -> JsonObject | None:
        """The first event received, waiting up to ``timeout_s``; None if none arrived."""
        deadline = time.monotonic() + timeout_s
        while not self.events and time.monotonic() < deadline:
            time.sleep(0.1)
        return self.events[0] if self.events else None

    def close(self) -> None:
        self.server.shutdown()
        self.server.server_close()


def new_fleet_label() -> str:
    """Labels (and the target selector) of one local fleet run: a job started for this run
    targets exactly the agents it started, never hosts an earlier run left in the store."""
    return f"cluster=demo,fleet={secrets.token_hex(4)}"


class FleetSpec(Contract):
    """How many agents to start, over how many racks, reporting to which coordinator."""

    hosts: int
    racks: int
    coordinator: str
    labels: str = "cluster=demo"
    #: data centers the racks are split into (contiguous; each host labelled dc=dc<d>)
    dcs: int = 1

    def host_labels(self, rack: int) -> str:
        labels: str = with_dc(self.labels, rack_dc(rack, self.racks, self.dcs))
        return labels


def _agent_argv(
    ws: Workspace, spec: FleetSpec, host: str, rack: str, labels: str, root: Path, pki: Path
) -> list[str]:
    return [
        sys.executable,
        "-m",
        "relgate_agent.cli",
        "agent",
        "serve",
        "--host-id",
        host,
        "--rack",
        rack,
        "--labels",
        labels,
        "--coordinator",
        spec.coordinator,
        "--models-root",
        str(root / "models"),
        "--trusted-keys",
        *ws.config["keys"]["trusted"],
        "--listen",
        f"127.0.0.1:{free_port()}",
        "--pki",
        str(pki),
    ]


def _stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for proc in procs:
        proc.terminate()
    deadline = time.monotonic() + _STOP_GRACE_S
    for proc in procs:
        try:
            proc.wait(timeout=max(0.1, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@contextmanager
def local_fleet(
    ws: Workspace,
    *,
    hosts: int,
    racks: int,
    coordinator: str,
    labels: str = "cluster=demo",
    dcs: int = 1,
) -> Iterator[list[FleetMember]]:
    """Start ``hosts`` agent processes on loopback; stop each by PID on exit."""
    spec = FleetSpec(hosts=hosts, racks=racks, coordinator=coordinator, labels=labels, dcs=dcs)
    fleet_dir = ws.home / "fleet"
    procs: list[subprocess.Popen[bytes]] = []
    members: list[FleetMember] = []
    # dev fleet CA + certificates under the workspace (mutual TLS on both planes, no set-up)
    pki = ensure_dev_pki(ws.home, {f"host-{i:02d}": f"rack-{i % racks}" for i in range(hosts)})
    try:
        for i in range(hosts):
            host, rack = f"host-{i:02d}", f"rack-{i % racks}"
            host_labels = spec.host_labels(i % racks)
            root = fleet_dir / host
            (root / "models").mkdir(parents=True, exist_ok=True)
            with open(root / "agent.log", "ab") as log:  # the child keeps its own descriptor
                cmd = _agent_argv(ws, spec, host, rack, host_labels, root, Path(pki))
                procs.append(subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT))  # noqa: S603 - argv we built
            members.append(
                FleetMember(
                    host=host,
                    models_root=str(root / "models"),
                    pid=procs[-1].pid,
                    host_id=host,
                    rack=rack,
                    labels=host_labels,
                )
            )
        yield members
    finally:
        _stop(procs)
