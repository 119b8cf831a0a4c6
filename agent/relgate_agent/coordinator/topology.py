"""Striped-chain topology: pure data and pure functions (no I/O), so repairs are testable.

The checkpoint is split into k stripes (chunk index mod k). For each stripe there is a
two-level pipeline: a chain through one leader per rack, and from each leader a chain
through the other hosts of its rack. The leader of stripe s in a rack is the rack's host
s mod n, and the rack order is rotated per stripe, so stripe roots and leaders differ per
stripe and each host uploads roughly what it downloads.

With hosts in more than one data center (the enrollment label ``dc``), each DC gets its
own striped chains over its own racks: the origin's DC (the home DC) reads the origin, and
in every other DC each stripe's root hangs under the home DC's tail of that stripe (a host
with no downstream in it, so the cross-DC edge costs nobody upload). Each stripe therefore
crosses the WAN once per remote DC: that DC's stripe roots are its regional replica, filled
by a single cross-DC copy (compressed on the wire, see ``StripeAssignment.compress``).

Each stripe is stored as a parent map (host -> upstream host, None = the origin) plus an
``order`` list (chain order, root first) used to find tails. Every change returns a new
topology with ``version + 1``; versions are monotonic and agents ignore stale ones.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

ORIGIN = "ORIGIN"


@dataclass(frozen=True)
class StripeChain:
    parent: dict[str, str | None] = field(default_factory=dict)
    order: list[str] = field(default_factory=list)

    def children(self, host: str) -> list[str]:
        return [h for h in self.order if self.parent.get(h) == host]

    def root(self) -> str | None:
        for h in self.order:
            if self.parent.get(h) is None:
                return h
        return None

    def depth(self, host: str) -> int:
        d = 0
        p = self.parent.get(host)
        while p is not None:
            d += 1
            p = self.parent.get(p)
        return d


@dataclass(frozen=True)
class Topology:
    version: int
    stripes: list[StripeChain]
    racks: dict[str, str]  # host -> rack
    dcs: dict[str, str] = field(default_factory=dict)  # host -> data center ("" = the one DC)

    def dc(self, host: str) -> str:
        return self.dcs.get(host, "")

    def crosses_dc(self, upstream: str | None, host: str) -> bool:
        """Whether the edge upstream -> host crosses data centers (a WAN link)."""
        return upstream is not None and self.dc(upstream) != self.dc(host)

    @property
    def hosts(self) -> list[str]:
        return list(self.stripes[0].order) if self.stripes else []

    def to_json(self) -> dict[str, Any]:
        return {
            "version": self.version,
            "racks": dict(self.racks),
            "dcs": dict(self.dcs),
            "stripes": [{"parent": dict(s.parent), "order": list(s.order)} for s in self.stripes],
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> Topology:
        return cls(
            int(doc["version"]),
            [StripeChain(dict(s["parent"]), list(s["order"])) for s in doc["stripes"]],
            dict(doc["racks"]),
            dict(doc.get("dcs") or {}),
        )

    def copy(self, version: int) -> Topology:
        return Topology.from_json({**self.to_json(), "version": version})


@dataclass(frozen=True)
class TopologyIndex:
    """Lookups over one published topology, built once per version: each stripe's
    children (in chain order) and the sorted members. A push to every host of a 4,096-host
    job reads them 4,096 times; scanning the chains each time would be quadratic."""

    version: int
    children: tuple[dict[str, tuple[str, ...]], ...]
    members: tuple[str, ...]
    standby: tuple[dict[str, tuple[str, ...]], ...] = ()  # per stripe: standby_hosts

    def downstreams(self, stripe: int, host: str) -> tuple[str, ...]:
        return self.children[stripe].get(host, ())


def bypass_peer(topo: Topology, chain: StripeChain, host: str) -> str | None:
    """Where ``host`` may pull this stripe from without a leader when its upstream is dead
    or is the slow hop: the upstream's own upstream, if that is a peer of ``host``'s DC
    (never the origin: a second reader of a root's stripe would break the origin budget;
    never across the WAN: that would add a crossing)."""
    up = chain.parent.get(host)
    grand = chain.parent.get(up) if up is not None else None
    if grand is None or topo.dc(grand) != topo.dc(host):
        return None
    return grand


def standby_hosts(idx: TopologyIndex, stripe: int, host: str, topo: Topology) -> list[str]:
    """The hosts that may bypass one of ``host``'s downstreams of ``stripe`` and pull it
    from ``host`` (its downstreams' downstreams whose bypass peer it is)."""
    if idx.standby:
        return list(idx.standby[stripe].get(host, ()))
    return _standby(idx.children[stripe], topo, topo.stripes[stripe], host)


def _standby(
    kids: Mapping[str, tuple[str, ...]], topo: Topology, chain: StripeChain, host: str
) -> list[str]:
    return [
        g
        for child in kids.get(host, ())
        for g in kids.get(child, ())
        if bypass_peer(topo, chain, g) == host
    ]


def _standby_all(
    kids: Mapping[str, tuple[str, ...]], dcs: Mapping[str, str]
) -> dict[str, tuple[str, ...]]:
    """:func:`_standby` of every host at once. A grandchild's bypass peer is its
    grandparent when they share a DC, so that is the only test (once a version at 4,096
    hosts x 8 stripes, calling bypass_peer per grandchild was most of a watch pass)."""
    out: dict[str, tuple[str, ...]] = {}
    for h, children in kids.items():
        here = dcs.get(h, "")
        grand = tuple(
            g for c in children for g in kids.get(c, ()) if not dcs or dcs.get(g, "") == here
        )
        if grand:
            out[h] = grand
    return out


def index_topology(topo: Topology) -> TopologyIndex:
    kids: list[dict[str, tuple[str, ...]]] = []
    standby: list[dict[str, tuple[str, ...]]] = []
    for chain in topo.stripes:
        out: dict[str, list[str]] = {}
        for h in chain.order:
            up = chain.parent.get(h)
            if up is not None:
                out.setdefault(up, []).append(h)
        stripe_kids = {k: tuple(v) for k, v in out.items()}
        kids.append(stripe_kids)
        # once per version, not once per host per push: a push to every host reads them all
        standby.append(_standby_all(stripe_kids, topo.dcs))
    return TopologyIndex(topo.version, tuple(kids), tuple(sorted(topo.racks)), tuple(standby))


def members_changed(
    old: Collection[str], new: Collection[str], dead: Callable[[str], bool]
) -> bool:
    """Whether ``new`` differs from ``old`` other than by losing hosts ``dead`` says are
    DEAD: a member joined, or one left that its peers must stop serving (quarantined,
    evicted, removed)."""
    before = set(old)
    if any(h not in before for h in new):
        return True
    return any(not dead(h) for h in before.difference(new))


def build_topology(
    hosts: Mapping[str, str],
    stripes: int,
    version: int = 1,
    dcs: Mapping[str, str] | None = None,
    home_dc: str = "",
) -> Topology:
    """Build k striped chains over ``hosts`` (host -> rack), one set per data center when
    ``dcs`` (host -> DC) names more than one; ``home_dc`` is the origin's DC (default: the
    DC with the most hosts, ties by name)."""
    dc_of = {h: (dcs or {}).get(h, "") for h in hosts}
    groups: dict[str, dict[str, str]] = {}
    for h, r in sorted(hosts.items()):
        groups.setdefault(dc_of[h], {})[h] = r
    if home_dc not in groups:
        home_dc = min(groups, key=lambda d: (-len(groups[d]), d)) if groups else ""
    ordered = [home_dc, *sorted(d for d in groups if d != home_dc)]
    out: list[StripeChain] = []
    for s in range(max(stripes, 1)):
        chain = StripeChain()
        home_tail: str | None = None
        for d in ordered:
            if d not in groups:
                continue
            parent, order = _dc_chain(groups[d], s)
            parent[order[0]] = home_tail  # None (the origin) for the home DC
            chain.parent.update(parent)
            chain.order.extend(order)
            if home_tail is None:
                home_tail = order[-1]
        out.append(chain)
    return Topology(version, out, dict(hosts), {h: d for h, d in dc_of.items() if d})


def _dc_chain(hosts: Mapping[str, str], s: int) -> tuple[dict[str, str | None], list[str]]:
    """Stripe ``s`` over one DC's hosts: the rack-leader chain (racks rotated by s) with
    each rack's chain under its leader; the first host of ``order`` is the root."""
    by_rack: dict[str, list[str]] = {}
    for h, r in sorted(hosts.items()):
        by_rack.setdefault(r, []).append(h)
    racks = sorted(by_rack)
    parent: dict[str, str | None] = {}
    order: list[str] = []
    rot = racks[s % len(racks) :] + racks[: s % len(racks)]
    prev_leader: str | None = None
    for r in rot:
        members = by_rack[r]
        i = s % len(members)
        leader = members[i]
        rest = members[i + 1 :] + members[:i]
        parent[leader] = prev_leader
        order.append(leader)
        prev = leader
        for h in rest:
            parent[h] = prev
            order.append(h)
            prev = h
        prev_leader = leader
    return parent, order


def splice(topo: Topology, host: str, slow: Collection[str] = ()) -> Topology:
    """Remove a dead host from every chain: one of its downstreams takes its place under its
    upstream and feeds the others, so no host's fan-out grows. The successor is in the
    host's DC, is not in ``slow`` (hosts that would throttle everyone put behind them), and
    is in the host's rack, in that order of weight, first in chain order among equals.

    If the host was a stripe root, that successor becomes the root (and resumes the origin
    reads from its own offset).
    """
    return splice_all(topo, [host], slow)


def successor(topo: Topology, host: str, kids: Sequence[str], slow: Collection[str]) -> str:
    """Which of ``host``'s downstreams (in chain order) takes its place: see :func:`splice`.
    A cross-DC successor would add a WAN crossing; a slow one throttles its new subtree;
    a same-rack one keeps the leader chain rack-local."""

    def weight(k: str) -> tuple[bool, bool, bool]:
        return (topo.dc(k) != topo.dc(host), k in slow, topo.racks.get(k) != topo.racks[host])

    return min(kids, key=weight)  # min is stable: the first in chain order among equals


def splice_all(topo: Topology, hosts: Iterable[str], slow: Collection[str] = ()) -> Topology:
    """:func:`splice` of each of ``hosts`` in turn, as one new version: one copy of the
    topology and one children index per chain, however many hosts a sweep found dead (a
    host at a time cost a copy and a chain scan each: seconds under the coordinator lock
    when a rack of a 4,096-host fleet goes at once)."""
    gone = [h for h in dict.fromkeys(hosts) if h in topo.racks]
    if not gone:
        return topo
    new = topo.copy(topo.version + 1)
    for chain in new.stripes:
        pos = {h: i for i, h in enumerate(chain.order)}
        kids_of: dict[str, list[str]] = {}
        for h in chain.order:  # children in chain order
            up = chain.parent.get(h)
            if up is not None:
                kids_of.setdefault(up, []).append(h)
        for host in gone:
            if host not in chain.parent:
                continue
            up = chain.parent.pop(host)
            kids = kids_of.pop(host, [])
            siblings = kids_of.get(up, []) if up is not None else []
            if host in siblings:
                siblings.remove(host)
            if not kids:
                continue
            # one successor takes the host's place and feeds the others; hanging every
            # child off the upstream would split its upload k ways
            heir = successor(topo, host, kids, slow)
            chain.parent[heir] = up
            if up is not None:
                kids_of[up] = sorted([*siblings, heir], key=pos.__getitem__)
            others = [k for k in kids if k != heir]
            for k in others:
                chain.parent[k] = heir
            if others:
                merged = kids_of.get(heir, []) + others
                kids_of[heir] = sorted(merged, key=pos.__getitem__)
        dead = set(gone)
        chain.order[:] = [h for h in chain.order if h not in dead]
    for host in gone:
        del new.racks[host]
        new.dcs.pop(host, None)
    return new


def append_host(
    topo: Topology, host: str, rack: str, dc: str = "", avoid: Collection[str] = ()
) -> Topology:
    """Add a late or rejoining host at the tail of its rack's chain in every stripe (else
    after the last host of its DC, else at the end), hung from the last such host not in
    ``avoid`` (leaves by decision and hosts judged slow: a second demoted host of a rack hung
    from the first received at the first one's pace, the chaos lab's rack of a 30 %-NIC host
    and a tx-slow one finished 35 s after the rest). Only when every candidate is in
    ``avoid`` is one of them the parent.

    A tail host has no downstreams, so a rejoining (possibly slow) host never blocks anyone.
    """
    if host in topo.racks:
        return topo
    new = topo.copy(topo.version + 1)
    new.racks[host] = rack
    if dc:
        new.dcs[host] = dc
    for chain in new.stripes:
        in_rack = [h for h in chain.order if new.racks.get(h) == rack and new.dc(h) == dc]
        in_dc = [h for h in chain.order if new.dc(h) == dc]
        usable = ([h for h in hs if h not in avoid] for hs in (in_rack, in_dc, chain.order))
        behind = next((c for c in usable if c), in_rack or in_dc or chain.order)
        chain.parent[host] = behind[-1] if behind else None
        chain.order.append(host)
    return new


def roots(topo: Topology) -> Sequence[str | None]:
    return [c.root() for c in topo.stripes]
