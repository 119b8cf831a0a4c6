"""GetJob's report crosses the wire whole: every field survives report -> message -> report."""

from __future__ import annotations

from relgate_agent.client import job_from_pb
from relgate_agent.contracts import HostRow, JobReport
from relgate_agent.coordinator.wire import status_to_pb


def test_report_round_trips_through_the_message() -> None:
    host = HostRow("h1", "rack-a", "READY", 3, 10, 20, 30, 40, ("BAD_DATA: x",), "suspect", 2)
    report = JobReport(
        job_id="dj_1", state="RUNNING", model="m", version="v1", manifest_digest="sha256:ab",
        hosts_total=2, hosts_ready=1, ready_hosts=("h1",), bytes_moved=5, origin_bytes=3,
        checkpoint_bytes=9, stragglers=("h2",), eta_s=7, topology_version=4,
        completion_emitted=True, duration_s=1.5, control_refusals=6, hosts=(host,),
    )  # fmt: skip
    assert job_from_pb(status_to_pb(report)) == report


def test_a_failed_jobs_error_is_derived_from_its_hosts() -> None:
    failed = JobReport(
        job_id="dj_2", state="FAILED", model="m", version="v1", manifest_digest="sha256:ab",
        hosts_total=1, hosts_ready=0, ready_hosts=(), bytes_moved=0, origin_bytes=0,
        checkpoint_bytes=9, stragglers=(), eta_s=0, topology_version=1,
        completion_emitted=False, duration_s=0.5, control_refusals=0,
        hosts=(HostRow("h1", "r", "FAILED", 0, 0, 0, 0, 0, ("CHUNK_FAILED: chunk 3",), "", 0),),
    )  # fmt: skip
    assert job_from_pb(status_to_pb(failed)).error == "h1: CHUNK_FAILED: chunk 3"
