"""RPC: shared gRPC settings and the failover stub (never imports the coordinator); the
report stream over it is :mod:`relgate_agent.reportstream`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import grpc

from relgate_agent.errors import LEADER_METADATA_KEY
from relgate_agent.pki import GRPC_TLS_OPTIONS, TlsFiles, grpc_channel_credentials

# Manifests of 800 GB checkpoints are a few MB; leave headroom.
MAX_MESSAGE_BYTES = 256 * 1024 * 1024
GRPC_OPTIONS = [
    ("grpc.max_send_message_length", MAX_MESSAGE_BYTES),
    ("grpc.max_receive_message_length", MAX_MESSAGE_BYTES),
    ("grpc.so_reuseport", 0),
]
# A watch stream is quiet for long stretches: the agent pings, so a coordinator that vanished
# without a FIN (a partition, a power cut) is noticed in ~15 s, and the server accepts pings
# that often (its default answers frequent pings with GOAWAY).
KEEPALIVE_TIME_MS = 10_000
KEEPALIVE_TIMEOUT_MS = 5_000
# how long an agent waits for a coordinator's reply to a report, and how long it takes
# to notice a coordinator gone silent (a frozen or partitioned leader) and move on: a new
# leader's grace before it judges anyone dead is built from these (coordinator/failover.py)
REPORT_REPLY_TIMEOUT_S = 10.0
# reports in a row an agent sends quiet (answered only with news) before it asks for an
# answer again: a leader that takes reports but no longer handles them is noticed within
# QUIET_REPORTS intervals plus the reply timeout (a frozen one sooner, by the keepalive)
QUIET_REPORTS = 4
RECONNECT_S = (KEEPALIVE_TIME_MS + KEEPALIVE_TIMEOUT_MS) / 1000
GRPC_CLIENT_OPTIONS = [
    *GRPC_OPTIONS,
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.keepalive_permit_without_calls", 1),
    ("grpc.http2.max_pings_without_data", 0),
]
GRPC_SERVER_OPTIONS = [
    *GRPC_OPTIONS,
    # the coordinator pings too: a frozen agent (SIGSTOP, a hung kernel) cannot answer, its
    # watch ends and the dead-host sweep may judge it by its reports again
    ("grpc.keepalive_time_ms", KEEPALIVE_TIME_MS),
    ("grpc.keepalive_timeout_ms", KEEPALIVE_TIMEOUT_MS),
    ("grpc.http2.min_ping_interval_without_data_ms", KEEPALIVE_TIME_MS // 2),
    ("grpc.http2.max_ping_strikes", 0),
    ("grpc.keepalive_permit_without_calls", 1),
]
# jobs whose leading replica a client remembers (sharded coordinators); the oldest is
# forgotten first, and a forgotten job is found again through the next redirect
MAX_ROUTES = 4096


def leader_hint(exc: grpc.RpcError) -> str:
    """The address a sharded coordinator named as the leader of the job a refused call
    asked about ("" none): UNAVAILABLE with :data:`LEADER_METADATA_KEY`."""
    trailing = getattr(exc, "trailing_metadata", None)
    for key, value in (trailing() if callable(trailing) else None) or ():
        if key == LEADER_METADATA_KEY and isinstance(value, str):
            return value
    return ""


class FailoverStub:
    """Calls a gRPC stub method on the current coordinator replica; on UNAVAILABLE (down, or
    not the lease holder) moves to the next address and retries once per replica.

    ``addresses`` is a comma-separated list (``"coord-a:7470,coord-b:7470"``). Channels are
    mutual TLS: this side presents ``tls``'s certificate and accepts only a coordinator
    certificate from the same fleet CA (checked against ``COORDINATOR_DNS``).

    Sharded coordinators lead each job on one replica: a call naming a job (its request's
    ``job_id``) that another replica leads is refused with UNAVAILABLE and that replica's
    address (:func:`leader_hint`); the call goes there at once (a channel is opened to an
    address not in the list: it is held to the same certificate check), and later calls for
    that job go there first.
    """

    def __init__(self, addresses: str, stub_class: Any, tls: TlsFiles) -> None:
        self.addresses = [a.strip() for a in addresses.split(",") if a.strip()]
        if not self.addresses:
            raise ValueError("no coordinator address given")
        self.stub_class = stub_class
        self.tls = tls
        self.channels, self.stubs = self._connect(tls)
        self.retired: list[grpc.Channel] = []  # replaced channels: their open calls go on
        self.current = 0
        self.routes: dict[str, int] = {}  # job -> the replica (index) that leads it
        self._lock = threading.Lock()
        self._warming: list[grpc.Future] = []  # warm(): connections opening to standbys
        self._warm = False  # warm() was asked for: a reload warms its new channels too

    def _channel(self, address: str, creds: grpc.ChannelCredentials) -> grpc.Channel:
        return grpc.secure_channel(address, creds, options=GRPC_CLIENT_OPTIONS + GRPC_TLS_OPTIONS)

    def _connect(self, tls: TlsFiles) -> tuple[list[grpc.Channel], list[Any]]:
        creds = grpc_channel_credentials(tls)
        channels = [self._channel(a, creds) for a in self.addresses]
        return channels, [self.stub_class(c) for c in channels]

    def reload(self, tls: TlsFiles) -> None:
        """Present ``tls``'s (new) certificate from the next call on: new channels; calls and
        streams already open on the old ones go on until they end (closed with this stub)."""
        channels, stubs = self._connect(tls)
        with self._lock:
            self.tls = tls
            self.retired += self.channels
            self.channels, self.stubs = channels, stubs
        if self._warm:
            self.warm()

    def replica(self, address: str) -> int:
        """The index of the replica at ``address``, a channel opened to it when new."""
        with self._lock:
            if address not in self.addresses:
                channel = self._channel(address, grpc_channel_credentials(self.tls))
                self.addresses.append(address)
                self.channels.append(channel)
                self.stubs.append(self.stub_class(channel))
            return self.addresses.index(address)

    def _route(self, job_id: str, i: int | None) -> None:
        """Remember (``i``) or forget (None) the replica that leads ``job_id``."""
        with self._lock:
            self.routes.pop(job_id, None)
            if i is not None:
                self.routes[job_id] = i
                while len(self.routes) > MAX_ROUTES:
                    self.routes.pop(next(iter(self.routes)))

    def __getattr__(self, name: str) -> Callable[..., Any]:
        def call(request: Any, timeout: float | None = None) -> Any:
            job_id = str(getattr(request, "job_id", "") or "")
            i = self.routes.get(job_id, self.current) if job_id else self.current
            n, redirects = len(self.stubs), 0
            for attempt in range(2 * n + 1):
                try:
                    return getattr(self.stubs[i], name)(request, timeout=timeout)
                except grpc.RpcError as exc:
                    if exc.code() == grpc.StatusCode.DEADLINE_EXCEEDED:
                        # no answer in time: a frozen or cut-off replica holds its socket
                        # open and never says UNAVAILABLE; the next call tries the next one
                        self.moved_on(i)
                        raise
                    if exc.code() != grpc.StatusCode.UNAVAILABLE:
                        raise
                    hint = leader_hint(exc) if job_id else ""
                    if hint and redirects < n and (to := self.replica(hint)) != i:
                        self._route(job_id, to)  # the job's leader: there, and from now on
                        i, redirects = to, redirects + 1
                        continue
                    if attempt >= n - 1 + redirects:
                        raise
                    if job_id:
                        self._route(job_id, None)
                    self.moved_on(i)
                    i = self.current
            raise AssertionError("unreachable")

        return call

    def stream(
        self,
        name: str,
        request: Any,
        timeout: float | None = None,
        calls: set[Any] | None = None,
    ) -> Iterator[Any]:
        """A server-streaming call on the current replica. UNAVAILABLE (down, or not the
        leader) is raised to the caller, and the next call goes to the next replica. The
        open call sits in ``calls`` while it runs (another thread may cancel it)."""
        i = self.current
        call = getattr(self.stubs[i], name)(request, timeout=timeout)
        if calls is not None:
            calls.add(call)
        try:
            yield from call
        except grpc.RpcError as exc:
            if exc.code() == grpc.StatusCode.UNAVAILABLE:
                self.moved_on(i)
            raise
        finally:
            call.cancel()  # a stream the caller stopped reading ends here (no-op when done)
            if calls is not None:
                calls.discard(call)

    def moved_on(self, i: int) -> None:
        """Replica ``i`` is down or not the leader: the next call goes to the next one."""
        with self._lock:
            if self.current == i:
                self.current = (i + 1) % len(self.stubs)

    def warm(self) -> None:
        """Open the connections to the replicas not in use now (mutual TLS, then idle with
        keepalive pings): when the leader dies, the next call goes to the new one on an
        open connection, and a fleet's handshakes do not all land on it at the takeover."""
        with self._lock:
            standby = [c for i, c in enumerate(self.channels) if i != self.current]
            done, self._warming = self._warming, []
        for ready in done:  # a reload's retired channels: not waited on any more
            ready.cancel()
        self._warm = True
        for channel in standby:
            self._warming.append(grpc.channel_ready_future(channel))

    def close(self) -> None:
        for ready in self._warming:
            ready.cancel()
        for c in [*self.retired, *self.channels]:
            c.close()
