"""The load side's floor for bench/coordinator.py: the same fleet of mTLS report streams from
one grpc.aio client process against a server that only echoes (no coordinator logic).

    python -m bench._echofloor server PKI_DIR PORT_FILE
    python -m bench._echofloor client SPEC.json OUT.json

The server answers each report that is not quiet with its ``seq`` (as the coordinator's
report stream does) and nothing else. The client runs ``hosts`` hosts on one event loop,
each with its own certificate and channel, booted in waves of 64 as the load generator
boots; each reports every ``interval_s`` with QUIET_REPORTS quiet reports between
answered ones and records, after ``warmup_s``, how long its write took to return and
(answered reports) how long the answer took. What a coordinator-side change cannot
improve is this: the latency and report rate the client side reaches with the
coordinator doing nothing.
"""

from __future__ import annotations

import asyncio
import json
import random
import resource
import sys
import time
from pathlib import Path
from typing import Any

import grpc
import numpy as np

from relgate_agent.pki import GRPC_TLS_OPTIONS, TlsFiles
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


class FloorHost:
    def __init__(self, spec: dict[str, Any], host: str) -> None:
        self.spec, self.host = spec, host
        self.rng = random.Random(host)
        ca, cert, key = TlsFiles.from_pki(spec["pki"], host).read()
        self.channel = grpc.aio.secure_channel(
            spec["address"],
            grpc.ssl_channel_credentials(ca, key, cert),
            options=GRPC_CLIENT_OPTIONS + GRPC_TLS_OPTIONS,
        )
        self.waiting: dict[int, asyncio.Future[None]] = {}
        self.writes: list[float] = []
        self.answers: list[float] = []
        self.errors = 0

    async def _read(self, call: Any) -> None:
        async for r in call:
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

    async def run(self, t_warm: float, t_end: float) -> None:
        interval = float(self.spec["interval_s"])
        call = pbg.AgentServiceStub(self.channel).ReportStream()
        reader = asyncio.create_task(self._read(call))
        await asyncio.sleep(self.rng.uniform(0, interval))
        seq, loop = 0, asyncio.get_running_loop()
        try:
            while time.time() < t_end:
                seq += 1
                quiet = seq % (QUIET_REPORTS + 1) != 1
                answer = None if quiet else loop.create_future()
                if answer is not None:
                    self.waiting[seq] = answer
                counted = time.time() >= t_warm
                t0 = time.monotonic()
                await call.write(self._request(seq, quiet))
                if counted:
                    self.writes.append(time.monotonic() - t0)
                if answer is not None:
                    await asyncio.wait_for(answer, 30)
                    if counted:
                        self.answers.append(time.monotonic() - t0)
                await asyncio.sleep(interval)
        except (grpc.aio.AioRpcError, TimeoutError):
            self.errors += 1
        finally:
            reader.cancel()
            call.cancel()


def _pcts(values: list[float]) -> dict[str, float | int]:
    if not values:
        return {"n": 0}
    ms = np.array(values) * 1000
    return {
        "n": int(ms.size),
        "p50Ms": round(float(np.percentile(ms, 50)), 2),
        "p99Ms": round(float(np.percentile(ms, 99)), 1),
        "maxMs": round(float(ms.max()), 1),
    }


async def drive(spec: dict[str, Any]) -> dict[str, Any]:
    hosts = [FloorHost(spec, h) for h in spec["hosts"]]
    boot_s = len(hosts) / 64 * 0.05
    t_warm = time.time() + boot_s + float(spec["warmup_s"])
    t_end = t_warm + float(spec["measure_s"])
    cpu0 = resource.getrusage(resource.RUSAGE_SELF)
    tasks = []
    for i, h in enumerate(hosts):
        tasks.append(asyncio.create_task(h.run(t_warm, t_end)))
        if i % 64 == 63:
            await asyncio.sleep(0.05)
    await asyncio.gather(*tasks)
    cpu1 = resource.getrusage(resource.RUSAGE_SELF)
    measure_s = float(spec["measure_s"])
    writes = [w for h in hosts for w in h.writes]
    cpu = cpu1.ru_utime + cpu1.ru_stime - cpu0.ru_utime - cpu0.ru_stime
    return {
        "hosts": len(hosts),
        "reportsPerSecond": round(len(writes) / measure_s),
        "offeredPerSecond": round(len(hosts) / float(spec["interval_s"])),
        "writeReturn": _pcts(writes),
        "answered": _pcts([a for h in hosts for a in h.answers]),
        "errors": sum(h.errors for h in hosts),
        # the client's CPU over its whole run (boot and warm-up included)
        "clientCpuSeconds": round(cpu, 1),
    }


def main() -> None:
    if sys.argv[1] == "server":
        asyncio.run(serve(Path(sys.argv[2]), Path(sys.argv[3])))
        return
    spec = json.loads(Path(sys.argv[2]).read_text())
    Path(sys.argv[3]).write_text(json.dumps(asyncio.run(drive(spec))))


if __name__ == "__main__":
    main()
