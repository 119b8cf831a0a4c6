"""Which hosts' push keys a topology change can move: the structural diff of two versions.

A host's push key (``ProgressService.push_key``) names, per stripe, its upstream, its
downstreams (in chain order), its bypass peer (its upstream's upstream in its DC) and its
standby hosts (downstreams' downstreams that bypass to it), each as a peer reference (host,
address, rack), and a stripe root's origin share; its head (job state, member generation,
the host's Registers, the leader's epoch) is compared on its own. Between two versions the
rest can differ only for:

- a host whose upstream changed, and that host's downstreams (their bypass peer);
- a host whose downstreams or standby hosts changed (compared whole, order included);
- a host whose place (address, rack, DC) changed, and every host within two hops of it
  either way (they name it, or decide their bypass by its DC);
- a stripe root (its origin share follows the origin budget, not the topology).

Every other host's key is the same, so a watch pass need not compute it: at 4,096 hosts
that was ~0.25 s of the leader's interpreter for each splice, which moves ~6 hosts.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Mapping
from dataclasses import dataclass

from relgate_agent.coordinator.topology import Topology, TopologyIndex

MAX_DIFFS = 64  # versions a watch cursor may lag and still skip the unmoved hosts' keys

Place = tuple[str, str, str]  # a member's (address, rack, DC) as its peers name it


@dataclass(frozen=True)
class TopologyDiff:
    """The hosts whose push keys may differ between version ``since`` and ``version``."""

    since: int
    version: int
    hosts: frozenset[str]


def _changed(old: Mapping[str, object], new: Mapping[str, object]) -> set[str]:
    """Keys whose values differ between two mappings (absent on one side counts)."""
    return {h for h in old.keys() | new.keys() if old.get(h) != new.get(h)}


def moved_hosts(
    old: Topology,
    old_idx: TopologyIndex,
    new: Topology,
    new_idx: TopologyIndex,
    replaced: set[str],
) -> frozenset[str]:
    """The hosts whose push keys may differ from ``old`` to ``new`` (see the module's rule);
    ``replaced``: the members whose place (address, rack, DC) changed in between."""
    if len(old.stripes) != len(new.stripes):
        return frozenset(old.racks.keys() | new.racks.keys())
    out = set(replaced)
    for s, (was, now) in enumerate(zip(old.stripes, new.stripes, strict=True)):
        kids_was, kids_now = old_idx.children[s], new_idx.children[s]
        rehung = _changed(was.parent, now.parent)
        out |= rehung
        for h in rehung:  # their downstreams' bypass peer is their upstream
            out.update(kids_was.get(h, ()))
            out.update(kids_now.get(h, ()))
        out |= _changed(kids_was, kids_now)
        out |= _changed(old_idx.standby[s], new_idx.standby[s])
        out.update(h for h, up in now.parent.items() if up is None)  # roots: origin shares
        for m in replaced:  # who names it, or bypasses by its DC: two hops either way
            up = now.parent.get(m)
            if up is not None:
                out.add(up)
                grand = now.parent.get(up)
                if grand is not None:
                    out.add(grand)
            for kid in kids_now.get(m, ()):
                out.add(kid)
                out.update(kids_now.get(kid, ()))
    return frozenset(out)


class KeyLog:
    """One job's topology diffs, newest last (MAX_DIFFS of them), and its members' places
    at the last index: what a watch pass reads to skip the hosts a change did not move."""

    def __init__(self) -> None:
        self.diffs: deque[TopologyDiff] = deque(maxlen=MAX_DIFFS)
        self.places: dict[str, Place] = {}
        self.moves_seen = 0  # the coordinator's address-change count at the last index

    def record(
        self,
        old: Topology,
        old_idx: TopologyIndex,
        new: Topology,
        new_idx: TopologyIndex,
        places: dict[str, Place],
        readdressed: set[str],
    ) -> None:
        """A new index of the job (``new`` replaces ``old``); ``places``: every member's
        place now; ``readdressed``: hosts whose address changed since the last index, even
        if it is back where it was (a key computed in between named the other one)."""
        replaced = readdressed | (_changed(self.places, places) if self.places else set(places))
        hosts = moved_hosts(old, old_idx, new, new_idx, replaced)
        self.diffs.append(TopologyDiff(old.version, new.version, hosts))
        self.places = places

    def start(self, places: dict[str, Place]) -> None:
        """The job's first index: where its members are (no diff: every key is new)."""
        self.places = places

    def unmoved(self, host: str, since: int, version: int) -> bool:
        """Whether ``host``'s push key (but its head) is known to be the same at
        ``version`` as at ``since``: every diff in between is logged and none names it."""
        covered = since
        for d in self.diffs:
            if d.version <= since:
                continue
            if d.since != covered or host in d.hosts:  # a gap in the log, or moved
                return False
            covered = d.version
        return covered == version


__all__ = ["MAX_DIFFS", "KeyLog", "Place", "TopologyDiff", "moved_hosts"]
