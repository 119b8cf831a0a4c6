"""The agent's quiet-report rule (ControlPlane.report_once) on a real report stream: a real
mutual-TLS gRPC server records every report it is sent, in order, with its ``quiet`` flag.

What must hold: in the steady state exactly QUIET_REPORTS quiet reports go between two
answered ones; the run after the first answer starts at a random place inside the run (never
longer than QUIET_REPORTS); a report that carries errors always asks for an answer, and the
errors leave the buffer only once answered.
"""

from __future__ import annotations

import itertools
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from relgate_trust.dsse import TrustedKeys
from test_duplex import Replica

from relgate_agent.agent.control import ControlPlane
from relgate_agent.agent.job import AgentConfig, JobState
from relgate_agent.pki import TlsFiles, ensure_dev_pki
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg
from relgate_agent.reportstream import Duplex
from relgate_agent.rpc import QUIET_REPORTS, FailoverStub


class Recorder:
    """The server side: every report in arrival order; answers only non-quiet ones."""

    def __init__(self) -> None:
        self.seen: list[pb.ReportProgressRequest] = []
        self.lock = threading.Lock()

    def __call__(self, requests: Any, context: Any) -> Iterator[pb.ReportProgressResponse]:
        for r in requests:
            with self.lock:
                self.seen.append(r)
            if not r.quiet:
                yield pb.ReportProgressResponse(topology_version=r.topology_version, seq=r.seq)

    def quiet_flags(self) -> list[bool]:
        with self.lock:
            return [r.quiet for r in self.seen]


@dataclass
class StreamHost:
    """A host for one job: its configuration and its report stream (HostServices)."""

    config: AgentConfig
    reports: Duplex
    stub: Any = None
    data_client: Any = None
    data_address: str = "127.0.0.1:1"
    attestor: Any = None
    limited: list[int] = field(default_factory=list)

    def rx_limit(self, n: int) -> None:
        self.limited.append(n)

    def health(self) -> str:
        return ""

    def data_refusals(self) -> int:
        return 0

    def outranked(self, job_id: str) -> bool:
        return False


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return ensure_dev_pki(tmp_path_factory.mktemp("quiet"), [("h00", "r0")])


@pytest.fixture
def plane(pki: Path, tmp_path: Path) -> Iterator[tuple[ControlPlane, Recorder]]:
    recorder = Recorder()
    replica = Replica(pki, recorder)
    stub = FailoverStub(replica.address, pbg.AgentServiceStub, TlsFiles.from_pki(pki, "h00"))
    cfg = AgentConfig(
        host_id="h00",
        rack="r0",
        coordinator=replica.address,
        models_root=tmp_path / "models",
        trusted_keys=TrustedKeys(),
    )
    planes: list[ControlPlane] = []

    def to_plane(answer: pb.ReportProgressResponse) -> None:  # news goes to the job's plane
        planes[0].news(answer)

    host = StreamHost(cfg, Duplex(stub, "ReportStream", to_plane))
    job = JobState(host, "j", "m", "v1")
    planes.append(ControlPlane(job))
    yield planes[0], recorder
    stub.close()
    replica.stop()


def test_steady_runs_hold_exactly_quiet_reports_between_answers(plane: Any) -> None:
    control, recorder = plane
    for _ in range(1 + 4 * (QUIET_REPORTS + 1)):
        control.report_once()
    control.job.errors.append(pb.ReportError(kind="T", detail="flush"))  # the last one asks
    control.report_once()
    flags = recorder.quiet_flags()
    answered = [i for i, quiet in enumerate(flags) if not quiet]
    assert answered[0] == 0  # a start asks at once
    # the first run starts at a random place in the run: 1..QUIET_REPORTS quiet reports
    assert 1 <= answered[1] - answered[0] - 1 <= QUIET_REPORTS
    # from then on: exactly QUIET_REPORTS quiet reports between two answered ones
    gaps = [b - a - 1 for a, b in itertools.pairwise(answered[1:-1])]
    assert gaps and set(gaps) == {QUIET_REPORTS}
    assert answered[-1] == len(flags) - 1


def test_a_report_with_errors_asks_for_an_answer_and_is_then_delivered(plane: Any) -> None:
    control, recorder = plane
    control.report_once()  # answered (a start)
    control.report_once()  # quiet: a start's random place leaves at least one quiet report
    control.job.errors.append(pb.ReportError(kind="CHUNK_FAILED", detail="chunk 3"))
    control.report_once()
    last = recorder.seen[-1]
    assert not last.quiet
    assert [(e.kind, e.detail) for e in last.errors] == [("CHUNK_FAILED", "chunk 3")]
    assert not control.job.errors  # answered: delivered, out of the buffer
    assert recorder.quiet_flags()[:2] == [False, True]


def test_every_start_spreads_its_first_run_over_the_whole_run(pki: Path, tmp_path: Path) -> None:
    """Fresh planes (as after a start or a failure): the first quiet run's length takes every
    value 1..QUIET_REPORTS, so the fleet's answered reports do not come in waves."""
    lengths = set()
    for i in range(40):
        recorder = Recorder()
        replica = Replica(pki, recorder)
        stub = FailoverStub(replica.address, pbg.AgentServiceStub, TlsFiles.from_pki(pki, "h00"))
        try:
            cfg = AgentConfig("h00", "r0", replica.address, tmp_path / str(i), TrustedKeys())
            control = ControlPlane(
                JobState(StreamHost(cfg, Duplex(stub, "ReportStream")), "j", "m", "v")
            )
            for _ in range(QUIET_REPORTS + 2):
                control.report_once()
            control.job.errors.append(pb.ReportError(kind="T", detail="flush"))
            control.report_once()
            answered = [k for k, quiet in enumerate(recorder.quiet_flags()) if not quiet]
            lengths.add(answered[1] - 1)
        finally:
            stub.close()
            replica.stop()
        if lengths == set(range(1, QUIET_REPORTS + 1)):
            break
    assert lengths == set(range(1, QUIET_REPORTS + 1))
