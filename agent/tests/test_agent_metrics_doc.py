"""docs/agent-metrics.md names exactly the metric families the coordinator and a host agent
export (real processes, scraped over HTTP): a metric added, renamed or retyped in the code
without the reference table fails here."""

from __future__ import annotations

import re
import urllib.request
from pathlib import Path

from agent_harness import Cluster
from prometheus_client.parser import text_string_to_metric_families

DOC = Path(__file__).resolve().parents[2] / "docs" / "agent-metrics.md"
ROW = re.compile(r"^\|\s*`(relgate_[a-z0-9_]+)`\s*\|\s*([a-z]+)\s*\|\s*([^|]*)\|")


def documented() -> dict[str, tuple[str, frozenset[str]]]:
    """name -> (type, labels) of every table row of the reference."""
    out: dict[str, tuple[str, frozenset[str]]] = {}
    for line in DOC.read_text().splitlines():
        m = ROW.match(line)
        if m:
            assert m.group(1) not in out, f"{m.group(1)} documented twice"
            labels = frozenset(re.findall(r"`([a-z_]+)`", m.group(3)))
            out[m.group(1)] = (m.group(2), labels)
    return out


def exported(address: str) -> dict[str, tuple[str, frozenset[str] | None]]:
    """name as scraped (a counter's with ``_total``) -> (type, the label names its samples
    carry; None without samples), for every family served but the ``<name>_created``
    gauges the text format splits off a counter's or a histogram's series (the reference
    says so once)."""
    with urllib.request.urlopen(f"http://{address}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    families = list(text_string_to_metric_families(text))
    timed = {f.name for f in families if f.type in ("counter", "histogram")}
    return {
        f.name + ("_total" if f.type == "counter" else ""): (
            f.type,
            frozenset(k for s in f.samples for k in s.labels if k != "le") if f.samples else None,
        )
        for f in families
        if not (f.name.endswith("_created") and f.name.removesuffix("_created") in timed)
    }


def test_the_metrics_reference_is_what_the_processes_export(tmp_path: Path, checkpoint) -> None:
    cluster = Cluster(tmp_path / "c", checkpoint["trusted"], ["--report-interval", "0.5"])
    try:
        cluster.start_coordinator(extra=["--metrics-listen", "127.0.0.1:0"])
        cluster.start_agent("h00", "r0", extra_args=["--metrics-listen", "127.0.0.1:0"])
        coordinator = cluster.coordinator_info["metrics"]
        agent = cluster.agents["h00"]["metrics"]
        served = exported(coordinator) | exported(agent)
    finally:
        cluster.stop_all()
    doc = documented()
    # every family, ours alone (no process or GC collectors in these registries)
    assert {n: t for n, (t, _) in served.items()} == {n: t for n, (t, _) in doc.items()}
    # where a family already has samples (before any job: leader, watch streams, RPC times,
    # data connections), they carry the labels the table names
    sampled = {n: labels for n, (_, labels) in served.items() if labels is not None}
    assert sampled, "no family had samples"
    assert sampled == {n: doc[n][1] for n in sampled}
