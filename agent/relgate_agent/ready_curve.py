"""Hosts READY over time, as the Pipes process saw the job: a sample whenever the count
changed, drawn as a text plot for the distribution asset's metadata (Dagster's metadata
shows markdown, not images) and kept as JSON samples for anything that plots better."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

from relgate_agent.contracts import JobReport

#: Columns of the widest bar (all hosts ready).
BAR_WIDTH = 40


@dataclass
class ReadyCurve:
    """Feed it every polled status (``watch``); it keeps (seconds since start, hosts)."""

    started: float = field(default_factory=time.monotonic)
    total: int = 0
    samples: list[tuple[float, int]] = field(default_factory=list)

    def watch(self, status: JobReport) -> None:
        self.total = status.hosts_total
        if not self.samples or self.samples[-1][1] != status.hosts_ready:
            self.samples.append((round(time.monotonic() - self.started, 3), status.hosts_ready))

    def to_json(self) -> list[dict[str, float | int]]:
        return [{"seconds": s, "hostsReady": n} for s, n in self.samples]

    def text_plot(self) -> str:
        """One line per sample: elapsed seconds, a bar scaled to the fleet, the count."""
        total = max(self.total, 1)
        lines = [
            f"{seconds:9.1f} s |{'#' * round(BAR_WIDTH * hosts / total):<{BAR_WIDTH}}|"
            f" {hosts}/{self.total}"
            for seconds, hosts in self.samples
        ]
        return "\n".join(lines)
