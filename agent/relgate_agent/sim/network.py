"""Network: the fleet's links (host NIC tx and rx, ToR uplink and downlink, spine, origin).

Links are numbered ``tx[0..N) rx[N..2N) up[2N..2N+R) down[..2N+2R) spine origin``. A flow
from a host in the same rack crosses ``tx, rx``; across racks ``tx, up, spine, down, rx``;
from the origin ``origin, spine, down, rx`` (the origin sits behind the spine).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from relgate_agent.sim.flows import Floats, Ints
from relgate_agent.sim.scenario import Scenario

ORIGIN_SRC = -1
PATH_WIDTH = 5
TIERS = ("host tx", "host rx", "ToR uplink", "spine", "origin")


@dataclass
class Fabric:
    hosts: int
    racks: int
    rack_of: Ints  # host index -> rack index
    caps: Floats

    @property
    def links(self) -> int:
        return len(self.caps)

    def tx(self, h: int) -> int:
        return h

    def rx(self, h: int) -> int:
        return self.hosts + h

    @property
    def spine(self) -> int:
        return 2 * self.hosts + 2 * self.racks

    @property
    def origin(self) -> int:
        return self.spine + 1

    def paths(self, src: Ints, dst: Ints) -> Ints:
        """Links of flows src -> dst (src = ORIGIN_SRC for the origin), padded."""
        n, r = self.hosts, self.racks
        pad = self.links
        out = np.full((len(dst), PATH_WIDTH), pad, dtype=np.int64)
        from_origin = src == ORIGIN_SRC
        s = np.where(from_origin, 0, src)
        rs, rd = self.rack_of[s], self.rack_of[dst]
        cross = ~from_origin & (rs != rd)
        out[:, 0] = np.where(from_origin, self.origin, s)
        out[:, 1] = n + dst
        out[:, 2] = np.where(from_origin | cross, 2 * n + r + rd, pad)
        out[:, 3] = np.where(from_origin | cross, self.spine, pad)
        out[:, 4] = np.where(cross, 2 * n + rs, pad)
        return out

    def tier_slices(self) -> dict[str, slice]:
        n, r = self.hosts, self.racks
        return {
            "host tx": slice(0, n),
            "host rx": slice(n, 2 * n),
            "ToR uplink": slice(2 * n, 2 * n + 2 * r),
            "spine": slice(self.spine, self.spine + 1),
            "origin": slice(self.origin, self.origin + 1),
        }


def rack_members(sc: Scenario) -> Ints:
    """Rack index of each host: racks of (nearly) equal size, host order rack by rack."""
    per, extra = divmod(sc.hosts, sc.racks)
    sizes = [per + (1 if r < extra else 0) for r in range(sc.racks)]
    return np.repeat(np.arange(sc.racks), sizes).astype(np.int64)


def build_fabric(sc: Scenario) -> Fabric:
    rack_of = rack_members(sc)
    n, r = sc.hosts, sc.racks
    per_rack = np.bincount(rack_of, minlength=r).astype(np.float64)
    nic = sc.nic * sc.efficiency
    uplink = per_rack * sc.nic / sc.oversubscription
    spine = float(uplink.sum()) / sc.spine_oversubscription
    caps = np.concatenate(
        [np.full(n, nic), np.full(n, nic), uplink, uplink, [spine, sc.origin_cap]]
    )
    return Fabric(n, r, rack_of, caps)


__all__ = ["ORIGIN_SRC", "TIERS", "Fabric", "build_fabric", "rack_members"]
