"""Load generator for bench/coordinator.py: simulated agents on h2 (bench/_h2grpc.py: gRPC's
wire format without grpc.aio's per-message cost), no data plane.

One process runs a slice of the fleet on one event loop. Each simulated host has its own
mTLS identity (its certificate from the bench PKI), opens its watch (its heartbeat), waits
for the job on it, registers with a have-bitmap, applies pushed assignments through the
agent's own fence (``relgate_agent.agent.job.Assignments``), and reports progress every
interval (deltas of newly verified chunks; the whole bitmap first and when the coordinator
asks, at once). A host marked to die closes its channels at its death time, as a killed
process would; deaths and the end come from the bench's PLAN.json, written once every host
registered (the registration storm is not the steady state). On UNAVAILABLE a host moves to the next coordinator address (the replica).

    python -m bench._loadgen SPEC.json OUT.json

Every RPC's latency is recorded with its send time (ReportProgress separately, Register
in "other"); the samples go to OUT.npz as (wall time, seconds) rows beside the JSON summary.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import grpc
import numpy as np
from google.protobuf.message import Message

from bench import _h2grpc as h2grpc
from relgate_agent import gcpolicy
from relgate_agent.agent.control import REPORT_RETRY
from relgate_agent.agent.job import Assignments
from relgate_agent.pki import COORDINATOR_DNS, TlsFiles
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.rpc import QUIET_REPORTS
from relgate_agent.staging.storage import bitmap_from_bits, pack_indexes

RPC_TIMEOUT_S = 10.0
WATCH_TIMEOUT_S = 300.0
_AGENT = pb.DESCRIPTOR.services_by_name["AgentService"]
WATCH, REGISTER = h2grpc.method_path(_AGENT, "Watch"), h2grpc.method_path(_AGENT, "Register")
REPORT_PROGRESS = h2grpc.method_path(_AGENT, "ReportProgress")
REPORT_STREAM = h2grpc.method_path(_AGENT, "ReportStream")
M = TypeVar("M", bound=Message)


class ReportFailed(Exception):
    """A report got no reply (stream error, timeout or end); the host resends it whole."""

    def __init__(self, code: grpc.StatusCode | None) -> None:
        super().__init__(f"report failed: {code}")
        self.code = code


@dataclass
class HostFigures:
    reports: int = 0
    report_errors: int = 0
    registers: int = 0
    watch_events: int = 0
    watch_opens: int = 0
    applied: int = 0
    stale_dropped: int = 0  # pushed assignments the fence refused (not newer than applied)
    stale_applied: int = 0  # applied although older than one applied before (must stay 0)
    full_asked: int = 0
    full_accepted_at: list[float] = field(default_factory=list)  # after a FULL_PROGRESS
    final_version: int = 0
    envelopes_shipped: int = 0  # Register replies that carried the manifest envelope
    envelope_bytes: int = 0


class SimHost:
    def __init__(self, spec: dict[str, Any], host: str, rack: str) -> None:
        self.spec, self.host, self.rack = spec, host, rack
        self.registered = False
        self.died = False
        self.n = int(spec["chunks"])
        rng = random.Random(host)
        self.rng = rng
        gen = np.random.default_rng(rng.getrandbits(32))
        # ~10% held already; a bytearray: a numpy scalar per chunk costs more than the rest
        self.bits = bytearray((gen.random(self.n) < 0.1).astype(np.uint8).tobytes())
        self.count = sum(self.bits)
        # the coordinator holds this host's bitmap up to the last report it took (as the
        # agent's acknowledged base); ``fresh``: the chunks verified since (the next delta)
        self.acked = False
        self.fresh: set[int] = set()
        self.assignments = Assignments()
        self.max_applied = 0
        self.fig = HostFigures()
        self.latency: list[tuple[float, float]] = []  # (wall time sent, seconds)
        self.other_latency: list[tuple[float, float]] = []
        # answered reports: (wall time sent, seconds until the report's write completed):
        # the part of ``latency`` before the coordinator could read it
        self.written: list[tuple[float, float]] = []
        self.written_at = 0.0  # monotonic, when the last answered report's write returned
        self.job_id = ""
        self.manifest_digest = ""  # reported once registered: the host is a manifest source
        self.job_seen = asyncio.Event()
        self.current = 0
        tls = TlsFiles.from_pki(spec["pki"], host)
        ctx = h2grpc.client_context(str(tls.ca), str(tls.cert), str(tls.key))
        self.channels = [h2grpc.Channel(a, ctx, COORDINATOR_DNS) for a in spec["addresses"]]
        self.report_call: h2grpc.Stream | None = None  # the open ReportStream, if any
        # as reportstream.Duplex: a reader task takes the answers off the stream; the one a report
        # waits for resolves ``answer``, others (news for quiet reports) queue in ``news``
        self.reader: asyncio.Task[None] | None = None
        self.seq = 0
        self.waiting = 0
        self.answer: asyncio.Future[pb.ReportProgressResponse] | None = None
        self.news: list[pb.ReportProgressResponse] = []
        self.wake = asyncio.Event()  # news to act on: the next report goes at once
        self.plan = Plan(Path(spec["plan"]))  # replaced by the shared one in run()
        self.warming: asyncio.Task[None] | None = None  # warm_replicas, once registered

    def held_chains(self) -> dict[str, list[object]]:
        """Per stripe (a string key: JSON) the upstream and downstreams it holds."""
        return {
            str(s): [a.upstream.host_id, [d.host_id for d in a.downstreams]]
            for s, a in self.assignments.by_stripe.items()
        }

    def _next_replica(self, i: int) -> None:
        if self.current == i:
            self.current = (i + 1) % len(self.channels)

    # ------------------------------------------------------------------ watch
    def _apply(self, a: pb.Assignment) -> None:
        before = self.assignments.topology_version
        self.assignments.apply(a)
        if self.assignments.topology_version == before:
            self.fig.stale_dropped += 1
            return
        if a.topology_version < self.max_applied:
            self.fig.stale_applied += 1
        self.max_applied = max(self.max_applied, a.topology_version)
        self.fig.applied += 1

    async def watch(self) -> None:
        while True:
            i = self.current
            known = {self.job_id: self.assignments.topology_version} if self.job_id else {}
            req = pb.WatchRequest(
                host_id=self.host,
                rack=self.rack,
                data_address=f"{self.host}.sim:7070",
                known_topology_versions=known,
            )
            self.fig.watch_opens += 1
            call: h2grpc.Stream | None = None
            try:
                call = await self.channels[i].stream(WATCH)
                call.write(req)
                call.done_writing()
                async with asyncio.timeout(WATCH_TIMEOUT_S):
                    while (ev := await call.read(pb.WatchEvent)) is not None:
                        self._watched(ev)
            except (h2grpc.RpcError, TimeoutError) as exc:
                if isinstance(exc, h2grpc.RpcError) and exc.code() == grpc.StatusCode.UNAVAILABLE:
                    self._next_replica(i)
                await asyncio.sleep(self.rng.uniform(0.2, 1.0))
            finally:
                if call is not None:
                    call.cancel()  # a no-op once it ended

    def _watched(self, ev: pb.WatchEvent) -> None:
        self.fig.watch_events += 1
        for j in ev.jobs:
            if not self.job_id:
                self.job_id = j.job_id
                self.job_seen.set()
        for a in ev.assignments:
            self._apply(a)

    # ------------------------------------------------------------------ register / report
    async def _timed(
        self, path: str, request: Message, cls: type[M], samples: list[tuple[float, float]]
    ) -> M:
        i = self.current
        sent = time.time()
        t0 = time.monotonic()
        try:
            resp = await self.channels[i].unary(path, request, cls, RPC_TIMEOUT_S)
        except h2grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                self._next_replica(i)
            raise
        samples.append((sent, time.monotonic() - t0))
        return resp

    async def register(self) -> None:
        while time.time() < min(self.plan.end, self.plan.death(self.host)):
            req = pb.RegisterRequest(
                job_id=self.job_id,
                host_id=self.host,
                rack=self.rack,
                have=self._bitmap(),
                free_disk_bytes=1 << 44,
                data_address=f"{self.host}.sim:7070",
                envelope_from_peers=True,  # as the agent registers
            )
            try:
                resp = await self._timed(REGISTER, req, pb.RegisterResponse, self.other_latency)
                self.fig.registers += 1
                # no data plane here: a host named sources takes the envelope as fetched
                # and verified (what the coordinator did not send is the figure)
                self.fig.envelopes_shipped += bool(resp.manifest_envelope)
                self.fig.envelope_bytes += len(resp.manifest_envelope)
                self.manifest_digest = resp.manifest_digest
                return
            except h2grpc.RpcError:
                await asyncio.sleep(self.rng.uniform(0.5, 1.5))

    def _bitmap(self) -> bytes:
        return bitmap_from_bits(self.bits)  # the agent's wire layout

    def _progress(self) -> pb.ReportProgressRequest:
        """The next report: the whole bitmap without a base, else the delta since the base
        (the same bytes as the agent's ``delta_indexes``, kept as a set: that diff of two
        12,500-bit bitmaps was most of the generator's cost of a report)."""
        for _ in range(int(self.spec["chunks_per_report"])):
            c = self.rng.randrange(self.n)
            if not self.bits[c]:
                self.bits[c] = 1
                self.count += 1
                self.fresh.add(c)
        req = pb.ReportProgressRequest(
            job_id=self.job_id,
            host_id=self.host,
            rack=self.rack,
            topology_version=self.assignments.topology_version,
            rx_bytes=self.fig.reports * 1 << 30,
            rx_bytes_per_s=10_000_000_000,
            tx_bytes_per_s=10_000_000_000,
            stripe_rx_bytes_per_s=[1_250_000_000] * 8,  # the sweeper judges slowness on these
            data_address=f"{self.host}.sim:7070",
            manifest_digest=self.manifest_digest,
        )
        if not self.acked:
            req.have = self._bitmap()
        else:
            req.verified_delta = pack_indexes(sorted(self.fresh))
            req.verified_count = self.count
        return req

    async def _report(
        self, req: pb.ReportProgressRequest, quiet: bool
    ) -> pb.ReportProgressResponse | None:
        """One report: on the host's report stream (as the agent sends them: reportstream.Duplex,
        quiet ones unanswered, an answered one to the next replica at once on UNAVAILABLE,
        each replica once), or as a call of its own when the spec says
        ``report_stream: false`` (the baseline). Latency is timed on answered reports."""
        if not self.spec.get("report_stream", True):
            return await self._timed(REPORT_PROGRESS, req, pb.ReportProgressResponse, self.latency)
        sent, t0 = time.time(), time.monotonic()
        for _ in self.channels:
            i = self.current
            try:
                resp = await self._exchange(i, req, quiet)
            except ReportFailed as exc:
                if quiet or exc.code != grpc.StatusCode.UNAVAILABLE:
                    if exc.code == grpc.StatusCode.UNAVAILABLE:
                        self._next_replica(i)
                    raise
                self._next_replica(i)
                continue
            if resp is not None:
                self.latency.append((sent, time.monotonic() - t0))
                self.written.append((sent, self.written_at - t0))
            return resp
        raise ReportFailed(grpc.StatusCode.UNAVAILABLE)

    async def _read(self, call: h2grpc.Stream) -> None:
        with contextlib.suppress(h2grpc.RpcError):
            while (resp := await call.read(pb.ReportProgressResponse)) is not None:
                if self._waited(call) and resp.seq == self.waiting:
                    self.answer.set_result(resp)  # type: ignore[union-attr]  # _waited
                else:
                    self.news.append(resp)
                    if resp.actions:  # as the agent: act on news at once
                        self.wake.set()
        if self._waited(call):
            self.answer.set_exception(EOFError("report stream ended"))  # type: ignore[union-attr]

    def _waited(self, call: h2grpc.Stream) -> bool:
        """An answer on ``call`` is awaited (the stream is still the host's own)."""
        return call is self.report_call and self.answer is not None and not self.answer.done()

    async def _exchange(
        self, i: int, req: pb.ReportProgressRequest, quiet: bool
    ) -> pb.ReportProgressResponse | None:
        call = self.report_call
        if call is not None and call.ended:  # ended between reports (a dead leader, say)
            self.report_call = None
            if quiet:  # as Duplex.send: the quiet reports before may be lost (then whole)
                raise ReportFailed(call.code())
            call = None
        try:
            if call is None:
                call = await self.channels[i].stream(REPORT_STREAM)
                self.report_call = call
                self.reader = asyncio.create_task(self._read(call))
            self.seq += 1
            req.seq, req.quiet = self.seq, quiet
            async with asyncio.timeout(RPC_TIMEOUT_S):  # a timer, not a task per read
                if quiet:
                    call.write(req)
                    await call.conn.drained()
                    return None
                self.waiting, self.answer = req.seq, asyncio.get_running_loop().create_future()
                call.write(req)
                await call.conn.drained()
                self.written_at = time.monotonic()
                return await self.answer
        except (TimeoutError, h2grpc.RpcError, EOFError) as exc:
            code = exc.code() if isinstance(exc, h2grpc.RpcError) else None
            self.report_call, self.answer = None, None
            if call is not None:
                if code is None and call.ended:
                    code = call.code()
                call.cancel()
            raise ReportFailed(code) from exc

    async def report_loop(self, plan: Plan) -> None:
        interval = float(self.spec["interval_s"])
        await asyncio.sleep(self.rng.uniform(0, interval))  # agents are not in step
        asked, failures, quiet_run, answer_next = False, 0, 0, True
        while time.time() < min(plan.end, plan.death(self.host)):
            news, self.news = self.news, []
            actions = {a for n in news for a in n.actions}
            if "FULL_PROGRESS" in actions:  # as the agent: this report carries it
                self.fig.full_asked += 1
                self.acked, asked = False, True
            if "REREGISTER" in actions:
                await self.register()
            req = self._progress()
            quiet = not (answer_next or quiet_run >= QUIET_REPORTS)
            try:
                resp = await self._report(req, quiet)
            except (h2grpc.RpcError, ReportFailed):
                self.fig.report_errors += 1
                self.acked = False  # as the agent does: the whole bitmap to a new leader
                asked = answer_next = True
                failures += 1  # and again soon, as the agent does (ControlPlane.report_loop)
                delay = min(interval, REPORT_RETRY.delay(failures))
                await asyncio.sleep(delay * self.rng.uniform(0.5, 1.0))
                continue
            failures = 0
            self.fig.reports += 1
            if resp is None:
                quiet_run += 1
            else:  # as the agent: after a start or a failure, a random place in the run
                quiet_run = self.rng.randrange(QUIET_REPORTS) if answer_next else 0
            answer_next = False
            if resp is not None and "FULL_PROGRESS" in resp.actions:
                self.fig.full_asked += 1
                self.acked = False
                asked = True
                continue  # at once, as the agent does: the new leader rebuilds now
            if asked and req.have:
                self.fig.full_accepted_at.append(time.time())
                asked = False
            self.acked = True
            self.fresh.clear()  # taken: no report since changed the bits (one loop)
            if resp is not None and "REREGISTER" in resp.actions:
                await self.register()
            # until the next report, or the end: a survivor's final topology is the one it
            # held at the end (the bench reads the coordinator's then), not a push after it
            wait = min(interval, max(0.0, min(plan.end, plan.death(self.host)) - time.time()))
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(wait):  # a timer, not a task per wait
                    await self.wake.wait()
            self.wake.clear()

    async def warm_replicas(self) -> None:
        """Connect (mutual TLS) to the replicas not in use, at a random moment of the first
        report interval, as the agent does: a takeover then finds every connection open,
        not 4,096 handshakes landing on the new leader at once."""
        await asyncio.sleep(self.rng.uniform(0, float(self.spec["interval_s"])))
        for i, channel in enumerate(self.channels):
            if i != self.current:
                channel.warm()

    async def run(self, plan: Plan) -> None:
        self.plan = plan
        watch = asyncio.create_task(self.watch())
        try:
            # every wait ends with the run: a host the overloaded coordinator never let in
            # stops at the end like the others, so the generator writes its figures
            while not self.job_seen.is_set() and time.time() < plan.end:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self.job_seen.wait(), 1.0)
            await self.register()
            self.registered = time.time() < plan.end
            if self.spec.get("warm_replicas", True):
                self.warming = asyncio.create_task(self.warm_replicas())
            await self.report_loop(plan)
        finally:
            # at its death a host vanishes like a killed process (no goodbye); at the end
            # every survivor tells the version it applied last
            self.died = time.time() < plan.end
            self.fig.final_version = self.assignments.topology_version
            watch.cancel()
            if self.report_call is not None:
                self.report_call.cancel()
            if self.reader is not None:
                self.reader.cancel()
            # the channels are left to the process's exit (main): closing 8,192 of them one
            # by one on a busy core took minutes, long after the figures were due


class Plan:
    """When the steady state ends and who dies when: unknown until the bench writes
    PLAN.json (after the registration storm); until then nobody dies or stops."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.end = float("inf")
        self.deaths: dict[str, float] = {}

    def death(self, host: str) -> float:
        return self.deaths.get(host, float("inf"))

    async def poll(self) -> None:
        while not self.path.exists():
            await asyncio.sleep(0.5)
        doc = json.loads(self.path.read_text())
        self.deaths = {h: float(t) for h, t in doc["deaths"].items()}
        self.end = float(doc["end"])


LAG_PROBE_S = 0.1  # how often the generator's own event loop is checked for lag


async def loop_lag(samples: list[float]) -> None:
    """How late the generator's event loop wakes a 100 ms sleep, every 100 ms: a report's
    latency as timed here includes this (a busy generator's loop answers late)."""
    loop = asyncio.get_running_loop()
    while True:
        due = loop.time() + LAG_PROBE_S
        await asyncio.sleep(LAG_PROBE_S)
        samples.append(loop.time() - due)


async def main_async(spec: dict[str, Any]) -> dict[str, Any]:
    plan = Plan(Path(spec["plan"]))
    poller = asyncio.create_task(plan.poll())
    lags: list[float] = []
    probe = asyncio.create_task(loop_lag(lags))
    hosts = [SimHost(spec, h, r) for h, r in spec["hosts"]]
    # the generator holds 4,096 hosts' state too: the daemons' collector policy, so its own
    # GC pauses do not show up as the coordinator's latency
    gcpolicy.apply(gcpolicy.parse_threshold(gcpolicy.DAEMON_DEFAULT))
    # boot in waves so the TLS handshakes do not all land in the same second
    tasks = []
    for i, h in enumerate(hosts):
        tasks.append(asyncio.create_task(h.run(plan)))
        if i % 64 == 63:
            await asyncio.sleep(0.05)
    results = await asyncio.gather(*tasks, return_exceptions=True)
    poller.cancel()
    probe.cancel()
    crashed = [repr(r) for r in results if isinstance(r, BaseException)]
    figs = [h.fig for h in hosts]
    return {
        "hosts": len(hosts),
        "crashed": crashed[:5],
        "died": sum(1 for h in hosts if h.died),
        "reports": sum(f.reports for f in figs),
        "reportErrors": sum(f.report_errors for f in figs),
        "registers": sum(f.registers for f in figs),
        "watchOpens": sum(f.watch_opens for f in figs),
        "watchEvents": sum(f.watch_events for f in figs),
        "applied": sum(f.applied for f in figs),
        "staleDropped": sum(f.stale_dropped for f in figs),
        "staleApplied": sum(f.stale_applied for f in figs),
        "fullAsked": sum(f.full_asked for f in figs),
        "envelopesShipped": sum(f.envelopes_shipped for f in figs),
        "envelopeBytes": sum(f.envelope_bytes for f in figs),
        "fullAcceptedAt": sorted(t for f in figs for t in f.full_accepted_at),
        "finalVersions": {h.host: h.fig.final_version for h in hosts if not h.died},
        # per survivor, what it acts on at the end: per stripe its upstream and downstreams
        "finalHeld": {h.host: h.held_chains() for h in hosts if not h.died},
        "_latency": np.array([x for h in hosts for x in h.latency], dtype=np.float64),
        "_other": np.array([x for h in hosts for x in h.other_latency], dtype=np.float64),
        "_written": np.array([x for h in hosts for x in h.written], dtype=np.float64),
        "_lag": np.array(lags, dtype=np.float64),
    }


def main() -> None:
    spec = json.loads(Path(sys.argv[1]).read_text())
    out = Path(sys.argv[2])
    loop = asyncio.new_event_loop()
    result = loop.run_until_complete(main_async(spec))
    np.savez(
        out.with_suffix(".npz"),
        report=result.pop("_latency"),
        other=result.pop("_other"),
        written=result.pop("_written"),
        lag=result.pop("_lag"),
    )
    out.write_text(json.dumps(result))
    sys.stdout.flush()
    # every figure is written: the sockets close with the process (a killed agent's do too)
    os._exit(0)


if __name__ == "__main__":
    main()
