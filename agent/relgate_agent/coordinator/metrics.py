"""Metrics: the coordinator's Prometheus figures (prometheus_client, its own HTTP server).

Two kinds. Events are counted where they happen (a splice and why, a suspect report and
its reason, the handler time of every RPC and of every report on a report stream). State
is read at scrape time, under the coordinator lock, from the jobs in memory (hosts ready
and total, bytes moved and read from the origin, topology version, open watch streams,
leadership), so it can never drift from what GetJob says. Each coordinator has its own
registry (several run in one test process). Labels carry job ids, RPC names and reasons,
never host ids (a fleet of 4,096 hosts must not become 4,096 series per metric).

=====================================================  ==================================
metric                                                 meaning
=====================================================  ==================================
relgate_coordinator_rpc_duration_seconds{method}       handler time (lock wait + logic)
relgate_coordinator_splices_total{reason}              hosts moved out of a chain:
                                                       dead, quarantined, demoted, serving,
                                                       removed
relgate_coordinator_suspect_reports_total{reason}      ReportSuspect calls, by reason
relgate_coordinator_leader                             1 while this replica leads
relgate_coordinator_watch_streams                      open watch streams on this replica
relgate_coordinator_job_hosts{job,state}               target hosts by state
relgate_coordinator_job_hosts_ready{job}               hosts READY
relgate_coordinator_job_received_bytes{job}            bytes the job's agents received
relgate_coordinator_job_origin_bytes{job}              bytes they read from the origin
relgate_coordinator_job_topology_version{job}          the job's current topology version
=====================================================  ==================================
"""

from __future__ import annotations

import time
from collections import Counter as Tally
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager
from typing import Any, Protocol

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from relgate_agent.coordinator.jobstate import JobState
from relgate_agent.metrics_http import MetricsEndpoint

# why a host left its place in the chains (the ``reason`` label of splices_total)
SPLICE_DEAD, SPLICE_QUARANTINED, SPLICE_DEMOTED, SPLICE_SERVING = (
    "dead",
    "quarantined",
    "demoted",
    "serving",
)
SPLICE_REMOVED = "removed"  # the suspect of its own complaints (complaints.py)
# handler times of a few hundred microseconds up to the RPC timeouts
LATENCY_BUCKETS = (0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
LOOP_PROBE_S = 0.1  # the event loop's lag is sampled this often (loop_lag)


class CoordinatorView(Protocol):
    """What a scrape reads of a coordinator (``leader.CoordinatorCore`` is one): the leader
    imports this module, never the reverse."""

    @property
    def leader(self) -> bool: ...

    @property
    def watching(self) -> Mapping[str, int]: ...

    @property
    def lock(self) -> AbstractContextManager[Any]: ...

    @property
    def jobs(self) -> Mapping[str, JobState]: ...


class CoordinatorMetrics:
    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        self.report_replies = Counter(
            "relgate_coordinator_report_replies_total",
            "Reports on report streams by answer: answered (asked for, or news) or quiet "
            "(a quiet report with nothing new: no reply written)",
            ["answer"],
            registry=self.registry,
        )
        self.rpc_seconds = Histogram(
            "relgate_coordinator_rpc_duration_seconds",
            "Coordinator handler time per RPC (per report on a report stream), lock wait included",
            ["method"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.loop_lag = Histogram(
            "relgate_coordinator_loop_lag_seconds",
            "How late the RPC event loop wakes a timer set LOOP_PROBE_S ahead: every RPC's "
            "queueing in this process (a sweep holding the GIL, a burst of reports)",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.tick_seconds = Histogram(
            "relgate_coordinator_tick_duration_seconds",
            "One sweep tick (dead hosts, slowness, handoff, tallies): the coordinator lock "
            "is held for most of it, so reports and watch passes wait for it",
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.sweep_wait = Gauge(
            "relgate_coordinator_sweep_wait_seconds",
            "The sweeper's wait before its next tick: 0.5 s, or longer when a tick's own "
            "work took more than SWEEP_SHARE of it (pace.py), at most --dead-after / 4",
            registry=self.registry,
        )
        self.gc_pause = Histogram(
            "relgate_coordinator_gc_pause_seconds",
            "Pauses of Python's cyclic garbage collector in the coordinator process, by "
            "generation: every thread, the RPC loop included, waits them out",
            ["generation"],
            buckets=LATENCY_BUCKETS,
            registry=self.registry,
        )
        self.splices = Counter(
            "relgate_coordinator_splices",
            "Hosts moved out of their place in the chains, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.splices_held = Counter(
            "relgate_coordinator_splices_held",
            "Silent hosts not spliced because a mass silence held the sweep's splices",
            registry=self.registry,
        )
        self.suspects = Counter(
            "relgate_coordinator_suspect_reports",
            "ReportSuspect calls accepted, by reason",
            ["reason"],
            registry=self.registry,
        )
        self.endpoint = MetricsEndpoint(self.registry)

    def time_gc(self) -> Callable[[str, dict[str, int]], None]:
        """A ``gc.callbacks`` entry observing each collection's pause into gc_pause (the
        caller adds it, and removes it when the coordinator stops)."""
        started = [0.0]
        pauses = [self.gc_pause.labels(str(g)) for g in range(3)]

        def timed(phase: str, info: dict[str, int]) -> None:
            if phase == "start":
                started[0] = time.perf_counter()
            elif started[0]:
                pauses[min(int(info.get("generation", 2)), 2)].observe(
                    time.perf_counter() - started[0]
                )

        return timed

    def watch(self, coord: CoordinatorView) -> None:
        """Read ``coord``'s state at every scrape."""
        self.registry.register(_StateCollector(coord))


class _StateCollector(Collector):
    def __init__(self, coord: CoordinatorView) -> None:
        self.coord = coord

    def collect(self) -> Iterator[GaugeMetricFamily]:
        c = self.coord
        leader = GaugeMetricFamily(
            "relgate_coordinator_leader", "1 while this replica holds the lease and leads"
        )
        leader.add_metric([], 1.0 if c.leader else 0.0)
        yield leader
        led = GaugeMetricFamily(
            "relgate_coordinator_jobs_led",
            "Jobs this replica leads now (sharded by job: the job leases it holds)",
        )
        led.add_metric([], float(len(c.jobs)) if c.leader else 0.0)
        yield led
        watches = GaugeMetricFamily(
            "relgate_coordinator_watch_streams", "Open agent watch streams on this replica"
        )
        watches.add_metric([], float(sum(c.watching.values())))
        yield watches
        hosts = GaugeMetricFamily(
            "relgate_coordinator_job_hosts", "Target hosts by state", labels=["job", "state"]
        )
        ready = GaugeMetricFamily(
            "relgate_coordinator_job_hosts_ready", "Hosts READY", labels=["job"]
        )
        rx = GaugeMetricFamily(
            "relgate_coordinator_job_received_bytes",
            "Bytes the job's agents report received (peers and origin)",
            labels=["job"],
        )
        origin = GaugeMetricFamily(
            "relgate_coordinator_job_origin_bytes",
            "Bytes the job's agents report read from the origin",
            labels=["job"],
        )
        version = GaugeMetricFamily(
            "relgate_coordinator_job_topology_version",
            "The job's current topology version",
            labels=["job"],
        )
        with c.lock:
            for job in c.jobs.values():
                states = Tally(hp.state for hp in job.hosts.values())
                for state, n in sorted(states.items()):
                    hosts.add_metric([job.job_id, state], float(n))
                ready.add_metric([job.job_id], float(len(job.ready)))
                rx.add_metric([job.job_id], float(sum(hp.rx for hp in job.hosts.values())))
                origin.add_metric([job.job_id], float(sum(hp.origin for hp in job.hosts.values())))
                version.add_metric([job.job_id], float(job.topology.version))
        yield from (hosts, ready, rx, origin, version)


__all__ = [
    "SPLICE_DEAD",
    "SPLICE_DEMOTED",
    "SPLICE_QUARANTINED",
    "SPLICE_REMOVED",
    "SPLICE_SERVING",
    "CoordinatorMetrics",
    "CoordinatorView",
]
