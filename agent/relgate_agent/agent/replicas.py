"""Watching sharded coordinators: one watch and one report stream per replica.

With ``--shard-by-job`` each replica leads its own jobs and a replica's watch lists only
those (docs/distribution-design.md, coordinators sharded by job). An agent started with
``--coordinator-sharded`` therefore watches every replica at once; its job list is the union
of what the replicas list, each job's assignments come on the watch of the replica that
leads it, and its reports go on that replica's report stream (:class:`ReportRouter`). When a
replica dies its watch breaks and its list is dropped; the replica that takes a job over
lists it on its own watch and the job's reports follow. Other calls (Register, FindPeers,
ReportSuspect, ...) go through the host's stub over every replica, which follows the
NotLeader answer to the job's leader.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterable
from typing import Any, Protocol

import grpc
from relgate_trust.retry import Backoff, retry_call

from relgate_agent.pki import TlsFiles
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg
from relgate_agent.reportstream import Duplex, ReportRouter
from relgate_agent.rpc import FailoverStub


class WatchingHost(Protocol):
    """What the replica watches use of the host agent (agent/host.py)."""

    stub: Any
    stop_event: threading.Event
    reach: Any
    config: Any
    watch_calls: set[Any]

    def _watch_request(self) -> pb.WatchRequest: ...
    def watch_cancelled_by_us(self, exc: grpc.RpcError) -> bool: ...
    def _reconcile(self, listed: dict[str, pb.JobRef]) -> set[str]: ...
    def deliver(self, assignments: Iterable[pb.Assignment]) -> None: ...
    def _unreachable(self, exc: BaseException, failures: int) -> None: ...
    def report_news(self, answer: pb.ReportProgressResponse) -> None: ...


log = logging.getLogger(__name__)

RETRY = Backoff(0.2, 2.0)  # a replica unreachable: back off to 2 s, like the single watch


class ReplicaWatches:
    def __init__(self, host: WatchingHost, addresses: list[str], tls: TlsFiles) -> None:
        self.host = host
        self.stubs = [FailoverStub(a, pbg.AgentServiceStub, tls) for a in addresses]
        self.listed: list[dict[str, pb.JobRef]] = [{} for _ in addresses]
        self.lock = threading.Lock()
        self.router = ReportRouter(
            [Duplex(s, "ReportStream", host.report_news) for s in self.stubs],
            Duplex(host.stub, "ReportStream", host.report_news),
        )
        self.threads = [
            threading.Thread(target=self._loop, args=(i,), name=f"watch-{i}", daemon=True)
            for i in range(len(addresses))
        ]

    def start(self) -> None:
        for t in self.threads:
            t.start()

    def union(self) -> dict[str, pb.JobRef]:
        with self.lock:
            return {job: ref for listed in self.listed for job, ref in listed.items()}

    def _loop(self, i: int) -> None:
        stop = self.host.stop_event
        while not stop.is_set():
            try:
                retry_call(
                    lambda: self._once(i),
                    retry_on=grpc.RpcError,
                    backoff=RETRY,
                    stop_event=stop,
                    on_retry=lambda exc, n: self._lost(i, exc, n),
                )
            except grpc.RpcError:
                return  # stopping

    def _lost(self, i: int, exc: BaseException, failures: int) -> None:
        """Replica ``i``'s watch broke: its jobs are not listed by it any more."""
        with self.lock:
            self.listed[i] = {}
        self.host._unreachable(exc, failures)

    def _request(self, i: int) -> pb.WatchRequest:
        """The host's watch request, its known versions narrowed to the jobs no other
        replica lists (the others' are not this replica's to answer)."""
        req = self.host._watch_request()
        leaders = self.router.leaders
        for job in [j for j in req.known_topology_versions if leaders.get(j, i) != i]:
            del req.known_topology_versions[job]
        return req

    def _once(self, i: int) -> None:
        events: Any = self.stubs[i].stream(
            "Watch", self._request(i), self.host.config.watch_timeout_s, self.host.watch_calls
        )
        try:
            for event in events:
                self.host.reach.ok()
                listed = {j.job_id: j for j in event.jobs}
                with self.lock:
                    self.listed[i] = listed
                    for job in listed:
                        self.router.leaders[job] = i
                started = self.host._reconcile(self.union())
                self.host.deliver(event.assignments)
                if self.host.stop_event.is_set():
                    return
                if started - {a.job_id for a in event.assignments}:
                    return  # reopen with the restarted runner's version (host._watch_once)
        except grpc.RpcError as exc:
            if not self.host.watch_cancelled_by_us(exc):
                raise
        finally:
            events.close()

    def reload(self, tls: TlsFiles) -> None:
        for stub in self.stubs:
            stub.reload(tls)
        self.router.reopen()

    def close(self) -> None:
        self.router.close()
        for stub in self.stubs:
            stub.close()


__all__ = ["ReplicaWatches"]
