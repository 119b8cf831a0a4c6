"""Fair judgement in the network-namespace lab (issue 29): false demotions and a tx-slow host.

Workload: the distribution bench's fleet (16 hosts / 4 racks, 100 Mbit NICs shared per peer, origin at
2B, 256 MiB, k = 8). ``runs`` fault-free distributions, then one with a tx-only slow host
(``h10``: its upload alone capped at 30 % of its NIC, its receive side at full rate).

Reported: each fault-free run's p50/max and the hosts the coordinator judged (demoted,
quarantined, removed, spliced) with their reasons: every one of them is a false judgement,
the target is 0 in every run. The tx-slow run: the other 15 hosts' max time to READY over
the median fault-free max measured in the same run (target <= 1.2), and the judged hosts
(the tx-slow host should be among them, its victims never). Needs root (network namespaces).
"""

from __future__ import annotations

import resource
import shutil
import statistics
import tempfile
from pathlib import Path
from typing import Any

from bench.chaos import TX_SLOW
from bench.distribution import (
    CHUNK,
    HOSTS,
    NIC,
    RACKS,
    SIZE,
    STRIPES,
    TX_SLOW_SHARE,
    _busy_fraction,
    _machine_busy,
    _make_checkpoint,
    run_relgate,
)
from bench.record import Comparison, compare

TARGET = 1.2


def main(runs: int = 5) -> dict[str, Any]:
    from relgate_lab.netns import netns_available

    if not netns_available():
        return {"skipped": "needs root, ip netns and tc (network-namespace lab)"}
    base = Path(tempfile.mkdtemp(prefix="relgate-bench-fair-"))
    busy0 = _machine_busy()
    try:
        src, pem, env, _ = _make_checkpoint(base)
        clean = [run_relgate(base, src, pem, env, run=i + 1) for i in range(runs)]
        slow = run_relgate(base, src, pem, env, tx_slow=TX_SLOW)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    baseline = statistics.median(r["max_s"] for r in clean)
    ratio = round(slow["max_s"] / baseline, 3)
    false = [sorted(r["judged"]) for r in clean]
    victims = sorted(h for h in slow["judged"] if h != TX_SLOW)
    return {
        "workload": (
            f"{HOSTS} hosts / {RACKS} racks, NIC {NIC * 8 // 1_000_000} Mbit/s (htb per peer), origin 2B, "
            f"S={SIZE >> 20} MiB, chunk {CHUNK >> 20} MiB, k={STRIPES}; {runs} fault-free runs, "
            f"then {TX_SLOW} with its upload at {int(TX_SLOW_SHARE * 100)} % of its NIC"
        ),
        "faultFree": [
            {"p50_s": r["p50_s"], "max_s": r["max_s"], "judged": r["judged"]} for r in clean
        ],
        "falseJudgementsPerRun": [len(f) for f in false],
        "txSlow": {
            "host": TX_SLOW,
            "othersP50_s": slow["p50_s"],
            "othersMax_s": slow["max_s"],
            "judged": slow["judged"],
            "victimsJudged": victims,
            "readyAt_s": slow["ready_at_s"],
        },
        "baseline": f"median fault-free max over the {runs} runs: {baseline} s",
        "ratio": ratio,
        "target": f"0 judged hosts in every fault-free run; others' max <= {TARGET} x baseline",
        "machine_busy_fraction": _busy_fraction(busy0, _machine_busy()),
        "peakRssMiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def comparisons(result: dict[str, Any]) -> list[Comparison]:
    """The other hosts' max READY time beside a slow uploader against the median
    fault-free max."""
    free = statistics.median(run["max_s"] for run in result["faultFree"])
    return [
        compare(
            "other hosts' max READY time",
            "s",
            (f"{result['txSlow']['host']} uploading slowly", result["txSlow"]["othersMax_s"]),
            ("median fault-free", free),
        )
    ]
