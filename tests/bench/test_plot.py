"""bench/record.py and bench/plot.py: the typed bench record, each module's comparisons and
the PNG drawn from them (synthetic records, and every committed result)."""

from __future__ import annotations

import importlib
import json
import struct
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import given, settings
from hypothesis import strategies as st
from pydantic import ValidationError

from bench.__main__ import modules
from bench.plot import cli, png_path, write_png
from bench.record import BenchRecord, Comparison, Machine, compare

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
PNG_MAGIC = b"\x89PNG\r\n\x1a\n"


def _png_size(path: Path) -> tuple[int, int]:
    """(width, height) from the IHDR chunk, after checking the signature."""
    data = path.read_bytes()
    assert data[:8] == PNG_MAGIC
    assert data[12:16] == b"IHDR"
    width, height = struct.unpack(">II", data[16:24])
    return width, height


def _record(result: dict[str, object], *, quick: bool = False) -> BenchRecord:
    return BenchRecord(
        benchmark="dagster_launch",
        sizes={"records": 200, "world_size": 2},
        quick=quick,
        started=1.0,
        machine=Machine(cpu_count=2, platform="Linux", python="3.11.7"),
        result=result,
    )


def test_a_small_synthetic_result_is_drawn_as_a_png(tmp_path: Path) -> None:
    record = _record(
        {
            "launchedSeconds": 8.0,
            "baseline": {"inProcessSeconds": 4.0},
            "workload": "synthetic: one job",
        }
    )
    assert record.comparisons() == [
        compare("release_job wall time", "s", ("launched run", 8.0), ("execute_in_process", 4.0))
    ]
    written = write_png(record, tmp_path / "dagster_launch.png")
    width, height = _png_size(written)
    assert width >= 600 and height >= 200
    assert written.stat().st_size > 5_000


def test_a_result_without_its_figures_is_refused() -> None:
    with pytest.raises(KeyError):
        _record({"workload": "nothing measured"}).comparisons()


def test_the_ratio_is_measured_over_each_baseline() -> None:
    c = compare("p50", "s", ("relgate", 30.0), ("S/B", 20.0), ("zero", 0.0))
    assert [c.ratio(b) for b in c.baselines] == [1.5, None]


def test_a_comparison_needs_a_baseline_and_finite_figures() -> None:
    with pytest.raises(ValidationError):
        compare("p50", "s", ("relgate", 30.0))
    with pytest.raises(ValidationError):
        compare("p50", "s", ("relgate", float("nan")), ("S/B", 1.0))


finite = st.floats(min_value=-1e12, max_value=1e12, allow_nan=False)
names = st.text(min_size=1, max_size=20)


@settings(max_examples=50, deadline=None)
@given(
    measured=st.tuples(names, finite),
    baselines=st.lists(st.tuples(names, finite), min_size=1, max_size=4),
    higher=st.booleans(),
)
def test_a_comparison_survives_json(
    measured: tuple[str, float], baselines: list[tuple[str, float]], higher: bool
) -> None:
    c = compare("q", "u", measured, *baselines, higher_is_better=higher)
    assert Comparison.model_validate_json(c.model_dump_json()) == c


@settings(max_examples=50, deadline=None)
@given(
    sizes=st.dictionaries(
        st.text(min_size=1, max_size=10), st.one_of(st.integers(), st.text(), st.none())
    ),
    quick=st.booleans(),
    started=st.floats(min_value=0, max_value=4e9),
    workload=st.text(max_size=200),
)
def test_a_record_is_read_back_from_the_text_it_writes(
    sizes: dict[str, object], quick: bool, started: float, workload: str
) -> None:
    record = BenchRecord(
        benchmark="gc",
        sizes=sizes,
        quick=quick,
        started=started,
        machine=Machine(cpu_count=2),
        result={"workload": workload, "steps": []},
    )
    text = record.dumps()
    assert json.loads(text) == record.model_dump(mode="json")
    assert BenchRecord.model_validate_json(text) == record
    assert record.workload == workload


@pytest.mark.parametrize(
    ("field", "value"),
    [("benchmark", "../gc"), ("benchmark", ""), ("started", "soon"), ("result", [1, 2])],
)
def test_a_malformed_record_is_refused(field: str, value: object) -> None:
    good = json.loads(_record({"workload": "w"}).dumps())
    with pytest.raises(ValidationError):
        BenchRecord.model_validate({**good, field: value})


def test_the_workload_falls_back_to_the_sizes() -> None:
    assert _record({}).workload == "records=200, world_size=2"


def test_every_bench_module_names_its_comparisons() -> None:
    missing = [
        m for m in modules() if not hasattr(importlib.import_module(f"bench.{m}"), "comparisons")
    ]
    assert missing == []


@pytest.mark.parametrize("path", sorted(RESULTS.glob("*.json")), ids=lambda p: p.name)
def test_every_committed_result_has_comparisons_and_its_png(path: Path) -> None:
    """The committed JSON parses into the typed record, its module finds at least one
    comparison in it, and its picture is committed beside it and shown in the docs."""
    record = BenchRecord.load(path)
    assert record.benchmark == path.name.split(".")[0]
    assert record.quick == path.name.endswith(".quick.json")
    assert record.comparisons()
    _png_size(png_path(path))
    link = f"(../bench/results/{png_path(path).name})"
    assert link in (ROOT / "docs" / "performance.md").read_text()


def test_the_cli_writes_a_png_beside_each_json(tmp_path: Path) -> None:
    source = RESULTS / "transport.json"
    copy = tmp_path / source.name
    copy.write_bytes(source.read_bytes())
    out = CliRunner().invoke(cli, [str(copy)])
    assert out.exit_code == 0, out.output
    assert out.output.strip() == str(tmp_path / "transport.png")
    _png_size(tmp_path / "transport.png")
    assert "matplotlib.backends.backend_agg" in sys.modules
