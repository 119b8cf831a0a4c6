"""Latency figures as the coordinator bench writes them: count, p50, p99 and max of samples
in milliseconds (one rule for the report latencies, the echo floor and the loop lag)."""

from __future__ import annotations

import numpy as np


def summary(ms: np.ndarray, suffix: str = "Ms") -> dict[str, float | int]:
    """``{"n", "p50<suffix>", "p99<suffix>", "max<suffix>"}`` of ``ms`` ({"n": 0} if empty)."""
    if ms.size == 0:
        return {"n": 0}
    return {
        "n": int(ms.size),
        f"p50{suffix}": round(float(np.percentile(ms, 50)), 2),
        f"p99{suffix}": round(float(np.percentile(ms, 99)), 2),
        f"max{suffix}": round(float(ms.max()), 2),
    }
