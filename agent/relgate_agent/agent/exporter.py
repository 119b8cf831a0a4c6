"""Exporter: the host agent's Prometheus figures, read at scrape time.

Per job this process runs (label ``job``; a job's series end when its runner is
forgotten): bytes received from peers and from the origin, bytes sent, CRC32C and SHA-256
failures, chunks resumed from the journal, chunks pulled by swarm repair, chunks verified,
whether the job is placed READY, and streams cut for the upstream's certificate (by
check). Per host: data-plane refusals by kind, open connections. Everything comes from the counters the agent already keeps
(:class:`~relgate_agent.agent.job.JobCounters`, the data server's), read under their
locks, so the figures cannot drift from ``.agent-stats`` or the reports.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING

from prometheus_client import CollectorRegistry
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from relgate_agent.metrics_http import MetricsEndpoint

if TYPE_CHECKING:
    from relgate_agent.agent.job import JobState
    from relgate_agent.dataplane.transport import DataServer

# (metric, help, JobCounters field, extra labels)
_JOB_COUNTERS: tuple[tuple[str, str, str, tuple[tuple[str, str], ...]], ...] = (
    ("relgate_agent_received_bytes", "Bytes received", "rx_bytes", (("source", "peer"),)),
    ("relgate_agent_received_bytes", "Bytes received", "origin_bytes", (("source", "origin"),)),
    ("relgate_agent_sent_bytes", "Bytes sent to downstream peers", "tx_bytes", ()),
    ("relgate_agent_crc_errors", "Blocks that failed CRC32C", "crc_errors", ()),
    ("relgate_agent_hash_mismatches", "Chunks that failed SHA-256", "hash_mismatches", ()),
    ("relgate_agent_resumed_chunks", "Chunks resumed from the journal", "resumed_chunks", ()),
    ("relgate_agent_swarm_chunks", "Chunks pulled by swarm repair", "swarm_chunks", ()),
)


class AgentExporter:
    def __init__(self, jobs: Callable[[], list[JobState]], data: DataServer) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_Collector(jobs, data))
        self.endpoint = MetricsEndpoint(self.registry)


class _Collector(Collector):
    def __init__(self, jobs: Callable[[], list[JobState]], data: DataServer) -> None:
        self.jobs, self.data = jobs, data

    def collect(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        # every family on every scrape, with or without a job (a dashboard's query finds its
        # metric before the first job; docs/agent-metrics.md lists them all)
        families: dict[str, CounterMetricFamily] = {}
        for name, text, _field, extra in _JOB_COUNTERS:
            if name not in families:
                labels = ["job", *(k for k, _ in extra)]
                families[name] = CounterMetricFamily(name, text, labels=labels)
        verified = GaugeMetricFamily(
            "relgate_agent_chunks_verified", "Chunks verified on this host", labels=["job"]
        )
        ready = GaugeMetricFamily(
            "relgate_agent_job_ready", "1 once the version is placed READY", labels=["job"]
        )
        cuts = CounterMetricFamily(
            "relgate_agent_peer_cert_cuts",
            "Streams from an upstream cut or refused for its certificate, by check",
            labels=["job", "check"],
        )
        bypasses = CounterMetricFamily(
            "relgate_agent_bypasses",
            "Stripes pulled from the upstream's upstream, by why the upstream was bypassed",
            labels=["job", "reason"],
        )
        for job in self.jobs():
            with job.lock:
                c, files, is_ready = job.counters, job.files, job.ready
                values = [(spec, int(getattr(c, spec[2]))) for spec in _JOB_COUNTERS]
                for check, n in sorted(c.peer_cert_cuts.items()):
                    cuts.add_metric([job.job_id, check], float(n))
                for reason, n in sorted(c.bypasses.items()):
                    bypasses.add_metric([job.job_id, reason], float(n))
            for (name, _text, _field, extra), value in values:
                families[name].add_metric([job.job_id, *(v for _, v in extra)], float(value))
            count = files.tracker.n_verified if files is not None else 0
            verified.add_metric([job.job_id], float(count))
            ready.add_metric([job.job_id], 1.0 if is_ready else 0.0)
        yield from families.values()
        yield verified
        yield ready
        yield cuts
        yield bypasses
        counters = self.data.counters()
        refusals = CounterMetricFamily(
            "relgate_agent_data_refusals", "Data-plane requests refused, by kind", labels=["kind"]
        )
        for kind, n in sorted(counters["refusals"].items()):
            refusals.add_metric([kind], float(n))
        yield refusals
        conns = GaugeMetricFamily("relgate_agent_data_connections", "Open data-plane connections")
        conns.add_metric([], float(counters["connections"]))
        yield conns
