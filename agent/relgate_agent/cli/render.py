"""Render: plain-text tables and topology listings for the operator commands' text mode
(``--json`` prints the typed models' JSON instead). No rich: relgate-agent stays light."""

from __future__ import annotations

import datetime as dt
from collections.abc import Sequence

from relgate_agent.contracts import STRIPE_DONE, JobSummary, JobTopology, StripeHop

KILO = 1000  # decimal units, as the rates the options take (100MB = 100,000,000 B)
JOB_COLUMNS = ("JOB", "MODEL", "VERSION", "STATE", "HOSTS", "CREATED", "LEADER")


def table(headers: Sequence[str], rows: Sequence[Sequence[str]]) -> list[str]:
    """Left-aligned columns two spaces apart, the last one unpadded."""
    widths = [max(len(str(r[i])) for r in (headers, *rows)) for i in range(len(headers))]
    return [
        "  ".join(str(c).ljust(w) for c, w in zip(r, widths, strict=True)).rstrip()
        for r in (headers, *rows)
    ]


def created(ts: int) -> str:
    """Unix seconds as UTC, to the second (``2026-10-12T08:00:00Z``)."""
    return dt.datetime.fromtimestamp(ts, dt.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def job_rows(jobs: Sequence[JobSummary]) -> list[str]:
    return table(
        JOB_COLUMNS,
        [
            (
                j.job_id,
                j.model,
                j.version,
                j.state,
                f"{j.hosts_ready}/{j.hosts_total}",
                created(j.created_at),
                f"{j.leader_replica}@{j.leader_epoch}" if j.leader_replica else "-",
            )
            for j in jobs
        ],
    )


def size(n: int) -> str:
    """Bytes in decimal units ("12.6 MB"); a negative count is unknown ("?")."""
    if n < 0:
        return "?"
    value = float(n)
    for unit in ("B", "kB", "MB", "GB"):
        if value < KILO or unit == "GB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= KILO
    raise AssertionError("unreachable")


def _rate(hop: StripeHop, live: bool) -> str:
    if not live:
        return "-"
    if hop.bypassed:
        return "bypassed"
    if hop.rx_bytes_per_s == STRIPE_DONE:
        return "held"
    return f"{size(hop.rx_bytes_per_s)}/s"


def topology_lines(t: JobTopology) -> list[str]:
    """Per stripe: its root and size, then one row per hop (chain order)."""
    out = [f"topology: v{t.topology_version} ({'live' if t.live else 'last stored'})"]
    for s in t.stripes:
        out.append(f"stripe {s.stripe}: root {s.root or '-'}, {size(s.stripe_bytes)}")
        rows = [
            (
                h.host_id,
                h.upstream,
                ",".join(h.downstreams) or "-",
                _rate(h, t.live),
                f"{size(h.bytes_done)}/{size(s.stripe_bytes)}",
            )
            for h in s.hops
        ]
        out.extend(
            "  " + line for line in table(("HOST", "UPSTREAM", "DOWNSTREAMS", "RX", "DONE"), rows)
        )
    return out
