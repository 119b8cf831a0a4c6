"""The agent's report stream (reportstream.Duplex) against a real mutual-TLS gRPC server whose
ReportStream handler answers, ends the stream, stays silent or refuses, as each test needs.

What must hold: one stream carries many exchanges; a reply that never comes is waited for
at most the timeout (and the stream is dropped, so the next exchange starts clean); a stream
the server ended between exchanges is reopened once for the same request; UNAVAILABLE moves
the next exchange to the next replica.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import grpc
import pytest

from relgate_agent.pki import TlsFiles, ensure_dev_pki, grpc_server_credentials
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg
from relgate_agent.reportstream import Duplex, ReplyTimeout, StreamEnded
from relgate_agent.rpc import FailoverStub

SERVICE = pb.DESCRIPTOR.services_by_name["AgentService"].full_name
Handler = Callable[[Iterator[pb.ReportProgressRequest], Any], Iterator[pb.ReportProgressResponse]]


class Replica:
    """A gRPC server with only ReportStream, run by ``handler``; counts streams opened."""

    def __init__(self, pki: Path, handler: Handler) -> None:
        self.streams = 0

        def counted(requests: Any, context: Any) -> Iterator[pb.ReportProgressResponse]:
            self.streams += 1
            yield from handler(requests, context)

        self.server = grpc.server(ThreadPoolExecutor(max_workers=4))
        method = grpc.stream_stream_rpc_method_handler(
            counted,
            request_deserializer=pb.ReportProgressRequest.FromString,
            response_serializer=pb.ReportProgressResponse.SerializeToString,
        )
        self.server.add_generic_rpc_handlers(
            (grpc.method_handlers_generic_handler(SERVICE, {"ReportStream": method}),)
        )
        creds = grpc_server_credentials(TlsFiles.from_pki(pki, "coordinator"))
        self.address = f"127.0.0.1:{self.server.add_secure_port('127.0.0.1:0', creds)}"
        self.server.start()

    def stop(self) -> None:
        self.server.stop(0).wait(5)


def echo(requests: Any, context: Any) -> Iterator[pb.ReportProgressResponse]:
    for r in requests:
        yield pb.ReportProgressResponse(topology_version=r.topology_version, seq=r.seq)


def news_at_7(requests: Any, context: Any) -> Iterator[pb.ReportProgressResponse]:
    """As the coordinator: a quiet report is answered only with news (here: at version 7)."""
    for r in requests:
        if not r.quiet:
            yield pb.ReportProgressResponse(topology_version=r.topology_version, seq=r.seq)
        elif r.topology_version == 7:
            yield pb.ReportProgressResponse(
                topology_version=7, seq=r.seq, job_id=r.job_id, actions=["STOP"]
            )


def old_coordinator(requests: Any, context: Any) -> Iterator[pb.ReportProgressResponse]:
    """A coordinator from before quiet reports: every report answered, no seq echoed."""
    for r in requests:
        yield pb.ReportProgressResponse(topology_version=r.topology_version)


def fails_on_quiet(requests: Any, context: Any) -> Iterator[pb.ReportProgressResponse]:
    for r in requests:
        if r.quiet:
            context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader")
        yield pb.ReportProgressResponse(topology_version=r.topology_version, seq=r.seq)


def one_then_end(requests: Any, context: Any) -> Iterator[pb.ReportProgressResponse]:
    for r in requests:
        yield pb.ReportProgressResponse(topology_version=r.topology_version, seq=r.seq)
        return


RELEASE = threading.Event()  # the silent server answers nothing until the test is over


def silent(requests: Any, context: Any) -> Iterator[pb.ReportProgressResponse]:
    for _ in requests:
        RELEASE.wait(60)
    yield from ()


def ends_at_once(requests: Any, context: Any) -> Iterator[pb.ReportProgressResponse]:
    yield from ()  # a server that closes every stream without answering


def not_leader(requests: Any, context: Any) -> Iterator[pb.ReportProgressResponse]:
    for _ in requests:
        context.abort(grpc.StatusCode.UNAVAILABLE, "not the leader")
    yield from ()


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_dev_pki(tmp_path_factory.mktemp("duplex"), [("h00", "r0")])


@pytest.fixture
def replicas(pki: Path) -> Iterator[Callable[..., tuple[Duplex, list[Replica]]]]:
    made: list[Replica] = []
    stubs: list[FailoverStub] = []

    def make(
        *handlers: Handler, on_news: Callable[[Any], None] | None = None
    ) -> tuple[Duplex, list[Replica]]:
        rs = [Replica(pki, h) for h in handlers]
        made.extend(rs)
        stub = FailoverStub(
            ",".join(r.address for r in rs), pbg.AgentServiceStub, TlsFiles.from_pki(pki, "h00")
        )
        stubs.append(stub)
        return Duplex(stub, "ReportStream", on_news), rs

    yield make
    for s in stubs:
        s.close()
    for r in made:
        r.stop()


def req(n: int) -> pb.ReportProgressRequest:
    return pb.ReportProgressRequest(job_id="j", host_id="h00", topology_version=n)


def test_many_exchanges_share_one_stream(replicas: Any) -> None:
    duplex, (replica,) = replicas(echo)
    assert [duplex.exchange(req(n), timeout=5).topology_version for n in range(1, 51)] == list(
        range(1, 51)
    )
    assert duplex.opened == 1 and replica.streams == 1


def test_a_stream_ended_between_exchanges_is_reopened_for_the_same_request(
    replicas: Any,
) -> None:
    duplex, (replica,) = replicas(one_then_end)
    assert [duplex.exchange(req(n), timeout=5).topology_version for n in (1, 2, 3)] == [1, 2, 3]
    assert duplex.opened == replica.streams == 3


def test_a_reply_that_never_comes_is_waited_for_at_most_the_timeout(replicas: Any) -> None:
    duplex, _ = replicas(silent)
    try:
        with pytest.raises(grpc.RpcError) as exc:
            duplex.exchange(req(1), timeout=0.5)
        # returned while the server still holds the request: bounded by the timeout
        assert not RELEASE.is_set()
        assert isinstance(exc.value, ReplyTimeout)
        assert exc.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED
        assert duplex.stub.current == 0  # one replica: nowhere else to go
        assert duplex._call is None  # dropped: the next exchange opens a new stream
    finally:
        RELEASE.set()


def test_unavailable_sends_the_same_request_to_the_next_replica_at_once(replicas: Any) -> None:
    duplex, (follower, leader) = replicas(not_leader, echo)
    assert duplex.exchange(req(1), timeout=5).topology_version == 1
    assert duplex.exchange(req(2), timeout=5).topology_version == 2
    assert (follower.streams, leader.streams) == (1, 1)
    assert duplex.stub.current == 1


def test_every_replica_unavailable_is_raised_after_one_try_each(replicas: Any) -> None:
    duplex, rs = replicas(not_leader, not_leader, not_leader)
    with pytest.raises(grpc.RpcError) as exc:
        duplex.exchange(req(1), timeout=5)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    assert [r.streams for r in rs] == [1, 1, 1]
    assert duplex.stub.current == 0  # moved round to the first again for the next report


def test_exchanges_from_several_threads_are_never_interleaved(replicas: Any) -> None:
    duplex, (replica,) = replicas(echo)
    got: dict[int, list[int]] = {}

    def worker(base: int) -> None:
        got[base] = [duplex.exchange(req(base + i), timeout=5).topology_version for i in range(20)]

    threads = [threading.Thread(target=worker, args=(b,)) for b in (100, 200, 300)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {b: list(range(b, b + 20)) for b in (100, 200, 300)}
    assert replica.streams == 1


def test_a_server_that_never_answers_ends_in_an_rpc_error_after_one_reopen(
    replicas: Any,
) -> None:
    """Reopened once, then raised as a failed RPC (UNAVAILABLE): the report loop catches
    RpcError; a bare StopIteration would end its thread."""
    duplex, (replica,) = replicas(ends_at_once)
    with pytest.raises(grpc.RpcError) as exc:
        duplex.exchange(req(1), timeout=5)
    assert isinstance(exc.value, StreamEnded)
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    assert duplex.opened == replica.streams == 2


def test_unavailable_walks_the_replicas_in_order(replicas: Any) -> None:
    duplex, (first, leader, last) = replicas(not_leader, echo, not_leader)
    assert duplex.exchange(req(1), timeout=5).topology_version == 1
    assert (first.streams, leader.streams, last.streams) == (1, 1, 0)


def test_a_replica_another_caller_moved_past_is_not_moved_again(replicas: Any) -> None:
    duplex, _ = replicas(echo, echo, echo)
    stub = duplex.stub
    stub.current = 2  # another thread found replicas 0 and 1 down meanwhile
    stub.moved_on(0)  # a late failure on replica 0 must not undo that
    assert stub.current == 2
    stub.moved_on(2)
    assert stub.current == 0
    stub.moved_on(1)  # nor a failure on a replica it has not reached
    assert stub.current == 0


def test_closing_the_stub_closes_every_channel(replicas: Any) -> None:
    duplex, _ = replicas(echo, echo)
    duplex.stub.close()
    for stub in duplex.stub.stubs:
        with pytest.raises(ValueError, match="closed channel"):
            stub.ReportProgress(req(1), timeout=1)


def test_quiet_reports_go_unanswered_and_the_next_exchange_gets_its_own_answer(
    replicas: Any,
) -> None:
    news: list[pb.ReportProgressResponse] = []
    duplex, (replica,) = replicas(news_at_7, on_news=news.append)
    for n in (5, 6, 7, 8):
        r = req(n)
        duplex.send(r)
        assert r.quiet and r.seq == n - 4  # numbered on the stream
    answer = duplex.exchange(req(9), timeout=5)
    assert (answer.topology_version, answer.seq) == (9, 5)
    # the news for the quiet report at version 7 went to on_news, naming its job and seq
    assert [(n.topology_version, n.seq, n.job_id, list(n.actions)) for n in news] == [
        (7, 3, "j", ["STOP"])
    ]
    assert duplex.opened == replica.streams == 1


def test_an_exchange_still_works_with_a_coordinator_that_echoes_no_seq(replicas: Any) -> None:
    news: list[pb.ReportProgressResponse] = []
    duplex, _ = replicas(old_coordinator, on_news=news.append)
    assert duplex.exchange(req(3), timeout=5).topology_version == 3
    assert duplex.exchange(req(4), timeout=5).topology_version == 4
    # it answers quiet reports too: with no exchange waiting, that answer is news
    duplex.send(req(5))
    deadline = time.monotonic() + 5
    while not news and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [n.topology_version for n in news] == [5]


def test_news_for_the_first_report_on_a_stream_is_delivered(replicas: Any) -> None:
    news: list[pb.ReportProgressResponse] = []
    duplex, _ = replicas(news_at_7, on_news=news.append)
    duplex.send(req(7))  # seq 1: no exchange has waited on this stream yet
    deadline = time.monotonic() + 5
    while not news and time.monotonic() < deadline:
        time.sleep(0.01)
    assert [(n.seq, list(n.actions)) for n in news] == [(1, ["STOP"])]


def test_a_failed_stream_fails_the_next_send_and_moves_on(replicas: Any) -> None:
    """A quiet report the server refused is not known lost until the stream's reader sees
    the error: the next send raises it (the agent then sends its whole bitmap, answered),
    and UNAVAILABLE moves that next call to the next replica."""
    duplex, (first, second) = replicas(fails_on_quiet, echo)
    duplex.send(req(1))
    deadline = time.monotonic() + 5
    while duplex._call is not None and duplex._ended is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(grpc.RpcError) as exc:
        duplex.send(req(2))
    assert exc.value.code() == grpc.StatusCode.UNAVAILABLE
    assert duplex.stub.current == 1
    assert duplex.exchange(req(3), timeout=5).topology_version == 3
    assert (first.streams, second.streams) == (1, 1)


def test_a_stream_the_server_ended_fails_the_next_send(replicas: Any) -> None:
    duplex, _ = replicas(ends_at_once)
    duplex.send(req(1))
    deadline = time.monotonic() + 5
    while duplex._ended is None and time.monotonic() < deadline:
        time.sleep(0.01)
    with pytest.raises(StreamEnded):
        duplex.send(req(2))
    assert duplex._call is None  # the next call opens a new stream


def _states(channel: grpc.Channel) -> list[grpc.ChannelConnectivity]:
    """The channel's connectivity as it changes (watched without asking it to connect)."""
    seen: list[grpc.ChannelConnectivity] = []
    channel.subscribe(seen.append, try_to_connect=False)
    return seen


def _until(pred: Callable[[], bool], timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while not pred() and time.monotonic() < deadline:
        time.sleep(0.02)
    return pred()


def test_warm_connects_the_standby_replica_before_any_call(replicas: Any, pki: Path) -> None:
    """warm() opens the mutual-TLS connection to the replica not in use, with no call on it,
    and again on the channels a reload (a renewed certificate) put in place."""
    duplex, _ = replicas(echo, echo)
    stub = duplex.stub
    standby = _states(stub.channels[1])
    time.sleep(0.3)
    assert grpc.ChannelConnectivity.READY not in standby  # lazy until asked
    stub.warm()
    assert _until(lambda: grpc.ChannelConnectivity.READY in standby)
    current = _states(stub.channels[0])
    time.sleep(0.3)
    assert grpc.ChannelConnectivity.READY not in current  # only the standby is warmed
    stub.reload(TlsFiles.from_pki(pki, "h00"))
    renewed = _states(stub.channels[1])
    assert _until(lambda: grpc.ChannelConnectivity.READY in renewed)
    assert duplex.exchange(req(1), timeout=5).topology_version == 1
