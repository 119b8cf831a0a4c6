"""The hosts-ready curve the Pipes process records: a sample per change of the count,
and a text plot whose bars scale to the fleet."""

from types import SimpleNamespace

from relgate_agent.ready_curve import BAR_WIDTH, ReadyCurve


def _status(ready: int, total: int = 4) -> SimpleNamespace:
    return SimpleNamespace(hosts_ready=ready, hosts_total=total)


def test_a_sample_per_change_and_bars_scaled_to_the_fleet():
    curve = ReadyCurve(started=0.0)
    for ready in (0, 0, 1, 1, 2, 4, 4):
        curve.watch(_status(ready))  # type: ignore[arg-type]
    assert [n for _, n in curve.samples] == [0, 1, 2, 4]
    lines = curve.text_plot().splitlines()
    assert [line.count("#") for line in lines] == [0, BAR_WIDTH // 4, BAR_WIDTH // 2, BAR_WIDTH]
    assert lines[-1].endswith("| 4/4") and len({len(line) for line in lines}) == 1
    assert curve.to_json()[-1]["hostsReady"] == 4


def test_an_empty_fleet_draws_without_dividing_by_zero():
    curve = ReadyCurve(started=0.0)
    curve.watch(_status(0, total=0))  # type: ignore[arg-type]
    assert curve.text_plot().endswith("| 0/0")
