"""The gate's Prometheus metrics, read from the catalog at each scrape.

The gate runs in whichever process calls it (a CLI command, a Dagster step, a run
worker), so its figures cannot live in one process's memory: every outcome is a
``gate_events`` row (:mod:`relgate.catalog.events`) and this collector counts those rows,
the fence tables and the permits when Prometheus scrapes.  Every process that serves it
therefore reports the same totals, and they survive restarts.

===================================  ====================================================
metric                               value
===================================  ====================================================
relgate_gate_admissions_total        admissions by outcome (ok, refused, conflict)
relgate_gate_alias_moves_total       activations and rollbacks by operation and outcome
relgate_gate_cas_conflicts_total     lost compare-and-swaps by operation and check
relgate_gate_refusals_total          refusals (exit 3) by operation and check
relgate_gate_fence_advances_total    committed fence advances by fence
relgate_gate_fence_hits_total        fence entries that hit a version, by fence and kind
relgate_gate_fence_watermark         each fence's current watermark
relgate_gate_permits                 permits by state (OPEN, CLOSED)
===================================  ====================================================
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector

from relgate.catalog.db import Database, rows
from relgate.catalog.events import GateOperation, Outcome
from relgate.gate.fences import read_fences

_ALIAS_MOVES = (GateOperation.ACTIVATE.value, GateOperation.ROLLBACK.value)
_FENCES = (GateOperation.TOMBSTONE.value, GateOperation.BENCHMARK.value)


class GateCollector(Collector):
    """Counts the catalog's gate records on every ``collect()`` (one short read)."""

    def __init__(self, db: Database) -> None:
        self.db = db

    def collect(self) -> Iterator[Metric]:
        with self.db.tx() as conn:  # one consistent read of all four tables
            events = rows(
                conn,
                "SELECT operation, outcome, check_name, COUNT(*) AS n FROM gate_events"
                " GROUP BY operation, outcome, check_name",
            )
            hits = rows(
                conn,
                "SELECT fence_kind, subject_kind, COUNT(*) AS n FROM fence_hits"
                " GROUP BY fence_kind, subject_kind",
            )
            permits = rows(conn, "SELECT state, COUNT(*) AS n FROM permits GROUP BY state")
            fences = read_fences(conn)
        yield from _event_metrics(events)
        hit_family = CounterMetricFamily(
            "relgate_gate_fence_hits",
            "Fence entries that hit a member of a version",
            labels=["fence", "kind"],
        )
        for row in hits:
            hit_family.add_metric([row["fence_kind"], row["subject_kind"]], int(row["n"]))
        yield hit_family
        marks = GaugeMetricFamily(
            "relgate_gate_fence_watermark", "The fence's current watermark", labels=["fence"]
        )
        for fence in _FENCES:
            marks.add_metric([fence], fences.of(fence))
        yield marks
        held = GaugeMetricFamily("relgate_gate_permits", "Permits by state", labels=["state"])
        for row in permits:
            held.add_metric([row["state"]], int(row["n"]))
        yield held


def _event_metrics(events: list[dict[str, object]]) -> Iterator[Metric]:
    admissions = CounterMetricFamily(
        "relgate_gate_admissions", "Run admissions by outcome", labels=["outcome"]
    )
    moves = CounterMetricFamily(
        "relgate_gate_alias_moves",
        "Alias activations and rollbacks by outcome",
        labels=["operation", "outcome"],
    )
    conflicts = CounterMetricFamily(
        "relgate_gate_cas_conflicts",
        "Compare-and-swaps lost or naming a stale generation",
        labels=["operation", "check"],
    )
    refusals = CounterMetricFamily(
        "relgate_gate_refusals", "Gate refusals (exit 3)", labels=["operation", "check"]
    )
    advances = CounterMetricFamily(
        "relgate_gate_fence_advances", "Committed fence advances", labels=["fence"]
    )
    totals: Counter[tuple[str, tuple[str, ...]]] = Counter()
    for row in events:
        op, outcome, check = str(row["operation"]), str(row["outcome"]), str(row["check_name"])
        n = int(str(row["n"]))
        if op == GateOperation.ADMIT:
            totals["admissions", (outcome,)] += n
        elif op in _ALIAS_MOVES:
            totals["moves", (op, outcome)] += n
        elif op in _FENCES and outcome == Outcome.OK:
            totals["advances", (op,)] += n
        if outcome == Outcome.CONFLICT:
            totals["conflicts", (op, check)] += n
        elif outcome == Outcome.REFUSED:
            totals["refusals", (op, check)] += n
    families = {
        "admissions": admissions,
        "moves": moves,
        "conflicts": conflicts,
        "refusals": refusals,
        "advances": advances,
    }
    for (name, labels), value in sorted(totals.items()):
        families[name].add_metric(list(labels), value)
    yield from families.values()


def gate_registry(db: Database) -> CollectorRegistry:
    """A registry holding only the gate's collector (what ``relgate gate metrics`` serves)."""
    registry = CollectorRegistry(auto_describe=False)
    registry.register(GateCollector(db))
    return registry
