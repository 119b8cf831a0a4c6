"""The load side's floor for bench/coordinator.py: the same fleet of mTLS report streams from
one client process against a server that only echoes (no coordinator logic).

    python -m bench._echofloor server PKI_DIR PORT_FILE
    python -m bench._echofloor client SPEC.json OUT.json

The server answers each report that is not quiet with its ``seq`` (as the coordinator's
report stream does) and nothing else. The client runs ``hosts`` hosts on one event loop,
each with its own certificate and connection, booted in waves of 64 as the load generator
boots, on the load generator's transport (``transport: h2``, bench/_h2grpc.py) or on
grpc.aio (the baseline it replaced); each reports every ``interval_s`` with QUIET_REPORTS
quiet reports between answered ones and records, in the window that opens ``warmup_s``
after every host's first report went out, how long its write took to return and
(answered reports) how long the answer took. What a coordinator-side change cannot
improve is this: the latency and report rate the client side reaches with the
coordinator doing nothing.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import math
import random
import resource
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from bench import _h2grpc as h2grpc
from bench import _latency as latency
from relgate_agent import gcpolicy
from relgate_agent.pki import COORDINATOR_DNS, GRPC_TLS_OPTIONS, TlsFiles
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg
from relgate_agent.rpc import GRPC_CLIENT_OPTIONS, GRPC_SERVER_OPTIONS, QUIET_REPORTS
from relgate_agent.staging.storage import pack_indexes


class Echo(pbg.AgentServiceServicer):  # type: ignore[misc]
    async def ReportStream(self, requests: Any, context: Any) -> Any:
        async for r in requests:
            if not r.quiet:
                yield pb.ReportProgressResponse(topology_version=1, seq=r.seq)


async def serve(pki: Path, port_file: Path) -> None:
    ca, cert, key = TlsFiles.from_pki(pki, "coordinator").read()
    server = grpc.aio.server(options=GRPC_SERVER_OPTIONS)
    pbg.add_AgentServiceServicer_to_server(Echo(), server)
    creds = grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )
    port = server.add_secure_port("127.0.0.1:0", creds)
    await server.start()
    port_file.write_text(f"127.0.0.1:{port}")
    await server.wait_for_termination()


REPORT_STREAM = h2grpc.method_path(pb.DESCRIPTOR.services_by_name["AgentService"], "ReportStream")
CONNECT_WAIT_S = 120.0  # the window opens then even if some hosts never connected


@dataclass
class Window:
    """The measured window: it opens ``warmup_s`` after every host's first report went out
    (the boot's handshakes are not the floor) and lasts ``measure_s``."""

    hosts: int
    warmup_s: float
    measure_s: float
    warm: float = math.inf
    end: float = math.inf
    connected: int = 0
    all_in: asyncio.Event = field(default_factory=asyncio.Event)

    def arrived(self) -> None:
        self.connected += 1
        if self.connected == self.hosts:
            self.all_in.set()

    async def open_when_booted(self) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self.all_in.wait(), CONNECT_WAIT_S)
        self.warm = time.time() + self.warmup_s
        self.end = self.warm + self.measure_s


class FloorHost:
    """One simulated host's report stream on grpc.aio (the baseline transport)."""

    def __init__(self, spec: dict[str, Any], host: str) -> None:
        self.spec, self.host = spec, host
        self.rng = random.Random(host)
        self.waiting: dict[int, asyncio.Future[None]] = {}
        self.writes: list[float] = []
        self.answers: list[float] = []
        self.errors = 0

    def _answered(self, r: pb.ReportProgressResponse) -> None:
        f = self.waiting.pop(r.seq, None)
        if f is not None and not f.done():
            f.set_result(None)

    def _request(self, seq: int, quiet: bool) -> pb.ReportProgressRequest:
        return pb.ReportProgressRequest(
            job_id="j" * 32,
            host_id=self.host,
            rack="r",
            seq=seq,
            quiet=quiet,
            verified_delta=pack_indexes(sorted(self.rng.sample(range(12_500), 8))),
            verified_count=seq,
            rx_bytes_per_s=10_000_000_000,
            stripe_rx_bytes_per_s=[1_250_000_000] * 8,
        )

    async def open(self) -> None:
        ca, cert, key = TlsFiles.from_pki(self.spec["pki"], self.host).read()
        self.channel = grpc.aio.secure_channel(
            self.spec["address"],
            grpc.ssl_channel_credentials(ca, key, cert),
            options=GRPC_CLIENT_OPTIONS + GRPC_TLS_OPTIONS,
        )
        self.call = pbg.AgentServiceStub(self.channel).ReportStream()
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        async for r in self.call:
            self._answered(r)

    async def send(self, req: pb.ReportProgressRequest) -> None:
        await self.call.write(req)

    def close(self) -> None:
        self.reader.cancel()
        self.call.cancel()

    async def run(self, window: Window) -> None:
        interval = float(self.spec["interval_s"])
        try:
            await self.open()
        except (grpc.aio.AioRpcError, h2grpc.RpcError):
            self.errors += 1
            window.arrived()
            return
        await asyncio.sleep(self.rng.uniform(0, interval))
        seq, loop = 0, asyncio.get_running_loop()
        try:
            while time.time() < window.end:
                seq += 1
                quiet = seq % (QUIET_REPORTS + 1) != 1
                answer = None if quiet else loop.create_future()
                if answer is not None:
                    self.waiting[seq] = answer
                counted = time.time() >= window.warm
                t0 = time.monotonic()
                await self.send(self._request(seq, quiet))
                if seq == 1:
                    window.arrived()
                if counted:
                    self.writes.append(time.monotonic() - t0)
                if answer is not None:
                    await asyncio.wait_for(answer, 30)
                    if counted:
                        self.answers.append(time.monotonic() - t0)
                await asyncio.sleep(interval)
        except (grpc.aio.AioRpcError, h2grpc.RpcError, asyncio.InvalidStateError, TimeoutError):
            self.errors += 1
        finally:
            self.close()


class H2FloorHost(FloorHost):
    """The same reports on bench/_h2grpc.py: one h2 connection per host, as the load
    generator's simulated agents."""

    async def open(self) -> None:
        tls = TlsFiles.from_pki(self.spec["pki"], self.host)
        ctx = h2grpc.client_context(str(tls.ca), str(tls.cert), str(tls.key))
        self.conn = await h2grpc.connect(self.spec["address"], ctx, COORDINATOR_DNS, 60)
        self.stream = self.conn.open(REPORT_STREAM)
        self.reader = asyncio.create_task(self._read())

    async def _read(self) -> None:
        while (r := await self.stream.read(pb.ReportProgressResponse)) is not None:
            self._answered(r)

    async def send(self, req: pb.ReportProgressRequest) -> None:
        self.stream.write(req)
        await self.conn.drained()

    def close(self) -> None:
        self.reader.cancel()
        self.conn.close()


async def drive(spec: dict[str, Any]) -> dict[str, Any]:
    kind = H2FloorHost if spec.get("transport") == "h2" else FloorHost
    hosts = [kind(spec, h) for h in spec["hosts"]]
    # the client holds the fleet's state as the load generator does: the daemons' collector
    # policy (a full collection of 4,096 hosts' objects stalls the loop ~0.2 s otherwise)
    gcpolicy.apply(gcpolicy.parse_threshold(gcpolicy.DAEMON_DEFAULT))
    window = Window(len(hosts), float(spec["warmup_s"]), float(spec["measure_s"]))
    opener = asyncio.create_task(window.open_when_booted())
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    tasks = []
    for i, h in enumerate(hosts):  # in waves of 64, as the load generator boots
        tasks.append(asyncio.create_task(h.run(window)))
        if i % 64 == 63:
            await asyncio.sleep(0.05)
    await opener
    cpu_warm, t_warm = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    await asyncio.gather(*tasks)
    cpu1, t_end = resource.getrusage(resource.RUSAGE_SELF), time.monotonic()
    writes = [w for h in hosts for w in h.writes]
    return {
        "transport": spec.get("transport", "grpc-aio"),
        "hosts": len(hosts),
        "connected": window.connected,
        "reportsPerSecond": round(len(writes) / window.measure_s),
        "offeredPerSecond": round(len(hosts) / float(spec["interval_s"])),
        "writeReturn": latency.summary(np.array(writes) * 1000),
        "answered": latency.summary(np.array([a for h in hosts for a in h.answers]) * 1000),
        "errors": sum(h.errors for h in hosts),
        # the client's CPU while it booted the fleet, then over warm-up and the window
        "clientCpuSeconds": {"boot": _cpu(cpu0, cpu_warm), "steady": _cpu(cpu_warm, cpu1)},
        "clientCores": round(_cpu(cpu_warm, cpu1) / (t_end - t_warm), 3),
    }


def _cpu(a: resource.struct_rusage, b: resource.struct_rusage) -> float:
    return round(b.ru_utime + b.ru_stime - a.ru_utime - a.ru_stime, 1)


def main() -> None:
    if sys.argv[1] == "server":
        asyncio.run(serve(Path(sys.argv[2]), Path(sys.argv[3])))
        return
    spec = json.loads(Path(sys.argv[2]).read_text())
    Path(sys.argv[3]).write_text(json.dumps(asyncio.run(drive(spec))))


if __name__ == "__main__":
    main()
