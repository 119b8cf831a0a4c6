"""The report stream: an agent's progress reports over one long-lived bidirectional
gRPC stream per coordinator replica (:class:`Duplex`), and the router that sends each job's
reports on the stream of the replica that leads it (:class:`ReportRouter`)."""

from __future__ import annotations

import queue
import threading
import time
from collections.abc import Callable
from typing import Any

import grpc

from relgate_agent.errors import AgentError
from relgate_agent.rpc import FailoverStub

_END = object()  # closes a duplex stream's request iterator


class StreamFailure(grpc.RpcError, AgentError):  # type: ignore[misc]  # grpc ships RpcError untyped
    """A report stream's failure seen on the agent's side (callers handle it as any failed
    RPC: every handler on its path catches grpc.RpcError, and the command line catches that
    before AgentError)."""

    def __init__(self, details: str, code: grpc.StatusCode) -> None:
        super().__init__(details)
        self._details, self._code = details, code

    def code(self) -> grpc.StatusCode:
        return self._code

    def details(self) -> str:
        return self._details


class StreamEnded(StreamFailure):
    """The server ended a duplex stream without answering, twice in a row (UNAVAILABLE)."""

    def __init__(self, method: str) -> None:
        super().__init__(f"{method}: stream ended without a reply", grpc.StatusCode.UNAVAILABLE)


class ReplyTimeout(StreamFailure):
    """No answer to an exchange within its timeout: a frozen (SIGSTOP) or cut-off leader
    keeps its socket open and never says UNAVAILABLE."""

    def __init__(self, method: str, timeout: float) -> None:
        super().__init__(
            f"{method}: no reply within {timeout:g}s", grpc.StatusCode.DEADLINE_EXCEEDED
        )


_CLEAN_END = object()  # a duplex stream the server ended without an error


class Duplex:
    """Reports over one long-lived bidirectional stream (a report per call costs the
    coordinator ~3x the CPU of a message on an open stream, and writing an answer about as
    much as reading the report: most reports go quiet and are never answered).

    ``exchange`` writes one request and waits at most ``timeout`` for its answer (matched by
    ``seq``); ``send`` writes a quiet request and returns at once. A reader thread takes every
    answer off the stream: the one an exchange waits for goes to it, any other (news the
    server sent for a quiet request) to ``on_news``. Any failure closes the stream (the next
    call opens a new one). In an exchange, UNAVAILABLE (down, not the leader) sends the same
    request to the next replica at once, each replica once, then raises; a stream the server
    ended cleanly is reopened once for the same request. ``send`` raises the failure of the
    stream it would write on (its earlier quiet requests may be lost: the caller's next
    request must not build on them).
    """

    def __init__(
        self, stub: FailoverStub, method: str, on_news: Callable[[Any], None] | None = None
    ) -> None:
        self.stub = stub
        self.method = method
        self.on_news = on_news or (lambda _answer: None)
        self._lock = threading.Lock()  # one writer at a time; an exchange holds it waiting
        self._cv = threading.Condition()  # the reader's hand-over (the fields below)
        self._call: Any = None
        self._ended: object = None  # why the open stream ended (an RpcError or _CLEAN_END)
        self._waiting = 0  # the seq an exchange waits for (0: none)
        self._answer: Any = None
        self._requests: queue.SimpleQueue[object] = queue.SimpleQueue()
        self._replica = 0
        self._seq = 0
        self.opened = 0  # streams opened (a figure for tests and benches)

    def _open(self) -> Any:
        self._requests = requests = queue.SimpleQueue[object]()
        self._replica = self.stub.current
        method = getattr(self.stub.stubs[self._replica], self.method)
        call = method(iter(requests.get, _END))
        with self._cv:
            self._call, self._ended = call, None
        self.opened += 1
        threading.Thread(
            target=self._read, args=(call,), name=f"{self.method}-reader", daemon=True
        ).start()
        return call

    def _read(self, call: Any) -> None:
        ended: object = _CLEAN_END
        try:
            for answer in call:
                with self._cv:
                    # seq 0: a coordinator that does not echo it answers every report, in
                    # order (as before quiet reports); it answers the waiting exchange
                    if call is self._call and self._waiting and answer.seq in (0, self._waiting):
                        self._answer = answer
                        self._cv.notify_all()
                        continue
                self.on_news(answer)  # outside the lock: it may take the caller's locks
        except grpc.RpcError as exc:
            ended = exc
        with self._cv:
            if call is self._call:
                self._ended = ended
                self._cv.notify_all()

    def _close(self) -> None:
        if self._call is not None:
            self._requests.put(_END)
            self._call.cancel()
            with self._cv:
                self._call = None

    def _take_ended(self) -> object:
        """Why the open stream ended (then closed), or None while it is open or none is."""
        with self._cv:
            ended = self._ended if self._call is not None else None
        if ended is not None:
            self._close()
        return ended

    def _write(self, request: Any, quiet: bool) -> None:
        if self._call is None:
            self._open()
        self._seq += 1
        request.seq, request.quiet = self._seq, quiet
        self._requests.put(request)

    def send(self, request: Any) -> None:
        with self._lock:
            ended = self._take_ended()
            if isinstance(ended, grpc.RpcError):
                if ended.code() == grpc.StatusCode.UNAVAILABLE:
                    self.stub.moved_on(self._replica)
                raise ended
            if ended is _CLEAN_END:
                raise StreamEnded(self.method)
            self._write(request, quiet=True)

    def exchange(self, request: Any, timeout: float) -> Any:
        with self._lock:
            reopened, moved = False, 0
            while True:
                ended = self._take_ended()  # a stream that ended before this request
                if ended is None:
                    ended = self._exchange_once(request, timeout)
                    if ended is None:
                        return self._answer_taken()
                if ended is _CLEAN_END:  # ended by the server before answering: resend once
                    if reopened:
                        raise StreamEnded(self.method)
                    reopened = True
                    continue
                assert isinstance(ended, grpc.RpcError)  # noqa: S101 - the reader stores no other
                if ended.code() != grpc.StatusCode.UNAVAILABLE:
                    raise ended
                # down or not the leader: the next replica at once (each one once), so a
                # report reaches a replica that just took over on this very try
                self.stub.moved_on(self._replica)
                moved += 1
                if moved >= len(self.stub.stubs):
                    raise ended

    def _exchange_once(self, request: Any, timeout: float) -> object:
        """Write ``request`` and wait for its answer: None when it came (then
        :meth:`_answer_taken`), else why the stream ended (closed)."""
        with self._cv:  # waited for before it is written: its answer may come at once
            self._answer, self._waiting = None, self._seq + 1
        self._write(request, quiet=False)
        deadline = time.monotonic() + timeout
        with self._cv:
            while self._answer is None and self._ended is None:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._cv.wait(left)
            self._waiting = 0
            answered, ended = self._answer is not None, self._ended
        if answered:
            return None
        self._close()
        if ended is None:
            # no answer within the timeout: a frozen (SIGSTOP) or cut-off leader keeps its
            # socket open and never says UNAVAILABLE; the next call goes to the next replica
            # (the new leader's grace is this timeout plus the keepalive's:
            # coordinator/failover.py)
            self.stub.moved_on(self._replica)
            raise ReplyTimeout(self.method, timeout)
        return ended

    def _answer_taken(self) -> Any:
        with self._cv:
            answer, self._answer = self._answer, None
        return answer

    def reopen(self) -> None:
        """The next call opens a new stream (on the stub's channels then: after a renewal
        or a new CA bundle, the stream presents the new certificate)."""
        with self._lock:
            self._close()

    def close(self) -> None:
        with self._lock:
            self._close()


class ReportRouter:
    """Reports of each job on the stream of the replica that leads it (sharded
    coordinators: the replica whose watch lists the job); a job not listed yet goes on
    ``fallback`` (a stream over every replica, following NotLeader)."""

    def __init__(self, streams: list[Duplex], fallback: Duplex) -> None:
        self.streams, self.fallback = streams, fallback
        self.leaders: dict[str, int] = {}  # job id -> index of the replica listing it

    def _stream(self, job_id: str) -> Duplex:
        i = self.leaders.get(job_id)
        return self.fallback if i is None else self.streams[i]

    def exchange(self, request: Any, timeout: float) -> Any:
        return self._stream(request.job_id).exchange(request, timeout)

    def send(self, request: Any) -> None:
        self._stream(request.job_id).send(request)

    def reopen(self) -> None:
        for d in (*self.streams, self.fallback):
            d.reopen()

    def close(self) -> None:
        for d in (*self.streams, self.fallback):
            d.close()
