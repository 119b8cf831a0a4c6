"""The hosts-ready curve the Pipes process records: a sample per change of the count,
and a text plot whose bars scale to the fleet."""

from relgate_agent.contracts import JobReport
from relgate_agent.ready_curve import BAR_WIDTH, ReadyCurve


def _status(ready: int, total: int = 4) -> JobReport:
    """A real GetJob report, as the Pipes process polls it."""
    return JobReport(
        job_id="j",
        state="DISTRIBUTING",
        model="m",
        version="v1",
        manifest_digest="sha256:00",
        hosts_total=total,
        hosts_ready=ready,
        ready_hosts=tuple(f"h{i}" for i in range(ready)),
        bytes_moved=0,
        origin_bytes=0,
        checkpoint_bytes=0,
        stragglers=(),
        eta_s=-1,
        topology_version=1,
        completion_emitted=False,
        duration_s=0.0,
        control_refusals=0,
        hosts=(),
    )


def test_a_sample_per_change_and_bars_scaled_to_the_fleet():
    curve = ReadyCurve(started=0.0)
    for ready in (0, 0, 1, 1, 2, 4, 4):
        curve.watch(_status(ready))
    assert [n for _, n in curve.samples] == [0, 1, 2, 4]
    lines = curve.text_plot().splitlines()
    assert [line.count("#") for line in lines] == [0, BAR_WIDTH // 4, BAR_WIDTH // 2, BAR_WIDTH]
    assert lines[-1].endswith("| 4/4") and len({len(line) for line in lines}) == 1
    assert curve.to_json()[-1]["hostsReady"] == 4


def test_an_empty_fleet_draws_without_dividing_by_zero():
    curve = ReadyCurve(started=0.0)
    curve.watch(_status(0, total=0))
    assert curve.text_plot().endswith("| 0/0")


def test_samples_count_seconds_from_the_start_and_round_bars_to_the_nearest_column():
    curve = ReadyCurve()  # started now
    curve.watch(_status(2, total=3))
    ((seconds, hosts),) = curve.samples
    assert 0 <= seconds < 60 and hosts == 2  # seconds since start, not since boot
    # 40 columns x 2/3 = 26.7: 27, not the floor
    assert curve.text_plot().count("#") == round(BAR_WIDTH * 2 / 3) == 27
