"""bench/_histograms.py against a real prometheus_client registry served over HTTP: the change
between two scrapes and its bucketed quantiles (the figures bench coordinator reports)."""

from __future__ import annotations

import math
from collections.abc import Iterator

import pytest
from hypothesis import given
from hypothesis import strategies as st
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client import Histogram as PromHistogram

from bench._histograms import Histogram, scrape
from relgate.checkpoint.local_fleet import free_port

BUCKETS = (0.001, 0.01, 0.1, 1.0)


@pytest.fixture
def served() -> Iterator[tuple[str, PromHistogram]]:
    registry = CollectorRegistry()
    h = PromHistogram("lag_seconds", "test", buckets=BUCKETS, registry=registry)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        yield f"127.0.0.1:{port}", h
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)


def test_a_window_holds_only_what_was_observed_inside_it(served) -> None:
    address, h = served
    for v in (0.5, 0.5, 0.5):  # before the window: slow
        h.observe(v)
    first = scrape(address, ("lag_seconds", "absent_seconds"))
    for v in [0.0005] * 98 + [0.05, 0.5]:
        h.observe(v)
    last = scrape(address, ("lag_seconds", "absent_seconds"))
    window = last["lag_seconds"].minus(first["lag_seconds"])
    assert window.count == 100
    assert window.figures() == {
        "n": 100,
        "meanMs": round(1000 * (98 * 0.0005 + 0.05 + 0.5) / 100, 2),
        "p50LeMs": 1.0,  # in the 1 ms bucket
        "p99LeMs": 100.0,  # the 99th of 100 is the 50 ms one: the 100 ms bucket
        "p999LeMs": 1000.0,
    }
    assert last["absent_seconds"] == Histogram()
    assert Histogram().figures() == {"n": 0}


@given(st.lists(st.sampled_from((0.0005, 0.005, 0.05, 0.5, 5.0)), min_size=1, max_size=200))
def test_the_quantile_is_the_bound_of_the_bucket_holding_it(values: list[float]) -> None:
    bounds = (*BUCKETS, float("inf"))
    cumulative = tuple((le, float(sum(v <= le for v in values))) for le in bounds)
    h = Histogram(cumulative, float(len(values)), sum(values))
    ordered = sorted(values)
    for q in (0.5, 0.99, 0.999):
        want = ordered[math.ceil(q * len(values)) - 1]  # the value at that rank
        assert h.quantile(q) == min(le for le in bounds if le >= want)


def test_a_labelled_histogram_is_summed_over_its_labels() -> None:
    registry = CollectorRegistry()
    h = PromHistogram("gc_seconds", "test", ["generation"], buckets=BUCKETS, registry=registry)
    h.labels("0").observe(0.0005)
    h.labels("2").observe(0.5)
    port = free_port()
    server, thread = start_http_server(port, addr="127.0.0.1", registry=registry)
    try:
        got = scrape(f"127.0.0.1:{port}", ("gc_seconds",))["gc_seconds"]
        where = {"gc_seconds": {"generation": "2"}}
        only2 = scrape(f"127.0.0.1:{port}", ("gc_seconds",), where)["gc_seconds"]
    finally:
        server.shutdown()
        server.server_close()
        thread.join(5)
    assert (got.count, got.total) == (2, 0.5005)
    assert got.quantile(0.5) == 0.001 and got.quantile(1.0) == 1.0
    assert (only2.count, only2.total) == (1, 0.5)  # the samples labelled generation="2"
