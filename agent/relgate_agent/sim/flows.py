"""Flows: max-min fair rates by progressive filling (vectorised with numpy).

A flow crosses a few links (its ``paths`` row, padded with ``len(caps)``, an unlimited
dummy link) and may carry its own cap (a pipelined chain's upstream rate, a token
bucket). Every round raises all unfrozen flows by the same amount until a link fills
or a flow reaches its cap; flows on a full link are frozen. The result never exceeds a
capacity and every flow is bottlenecked (a full link it crosses, or its own cap).
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

Floats = NDArray[np.float64]
Ints = NDArray[np.int64]
TOLERANCE = 1e-9


def max_min_rates(paths: Ints, caps: Floats, flow_caps: Floats) -> Floats:
    """Max-min fair rates of flows ``paths`` (F x W link ids) over links ``caps``."""
    nflows = paths.shape[0]
    rates = np.zeros(nflows)
    if nflows == 0:
        return rates
    links = len(caps)
    remaining = np.append(caps.astype(np.float64), np.inf)
    scale = np.append(caps.astype(np.float64), np.inf)
    active = flow_caps > 0
    while active.any():
        on = paths[active]
        count = np.bincount(on.ravel(), minlength=links + 1).astype(np.float64)
        count[links] = 0
        with np.errstate(divide="ignore", invalid="ignore"):
            share = np.where(count > 0, remaining / count, np.inf)
        headroom = flow_caps[active] - rates[active]
        inc = max(min(float(share.min()), float(headroom.min())), 0.0)
        if not np.isfinite(inc):
            raise ValueError("a flow crosses no finite link and has no cap")
        rates[active] += inc
        remaining -= inc * count
        full = (count > 0) & (remaining <= TOLERANCE * scale)
        full[links] = False
        frozen = full[on].any(axis=1) | (rates[active] >= flow_caps[active] * (1 - TOLERANCE))
        if not frozen.any():  # rounding: freeze the flows on the tightest link
            frozen = (on == int(np.argmin(share))).any(axis=1)
        idx = np.flatnonzero(active)
        active[idx[frozen]] = False
    return rates


def link_load(paths: Ints, rates: Floats, links: int) -> Floats:
    """Bytes/s carried by each link."""
    w = np.repeat(rates, paths.shape[1]) if paths.size else np.zeros(0)
    out: Floats = np.bincount(paths.ravel(), weights=w, minlength=links + 1)[:links].astype(
        np.float64
    )
    return out


__all__ = ["Floats", "Ints", "link_load", "max_min_rates"]
