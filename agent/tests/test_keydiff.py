"""coordinator/keydiff.py on hand-built topologies: which hosts a change may move, and when
a cursor's key is known unmoved. The coordinator-level proof (every host current after a
random walk of changes) is in test_push_keys.py."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from relgate_agent.coordinator.keydiff import KeyLog, TopologyDiff, moved_hosts
from relgate_agent.coordinator.topology import StripeChain, Topology, _standby, index_topology

CHAIN = ["a", "b", "c", "d", "e", "f", "g"]  # one stripe: a (root) -> b -> ... -> g


def _topo(version: int, order: list[str], dcs: dict[str, str] | None = None) -> Topology:
    parent: dict[str, str | None] = {h: (order[i - 1] if i else None) for i, h in enumerate(order)}
    return Topology(
        version, [StripeChain(parent, list(order))], dict.fromkeys(order, "r0"), dcs or {}
    )


def _moved(old: Topology, new: Topology, replaced: set[str] = frozenset()) -> frozenset[str]:  # type: ignore[assignment]
    return moved_hosts(old, index_topology(old), new, index_topology(new), set(replaced))


def test_a_moved_place_reaches_two_hops_either_way_and_no_further() -> None:
    t = _topo(1, CHAIN)
    # d's address changed: c names it downstream, b as standby, e upstream, f as bypass
    assert _moved(t, t, {"d"}) == {"a", "b", "c", "d", "e", "f"}  # a: the root's share


def test_a_splice_moves_the_rehung_host_its_downstreams_and_both_upstreams() -> None:
    old = _topo(1, CHAIN)
    new = _topo(2, [h for h in CHAIN if h != "d"])  # d dies: e hangs from c
    moved = _moved(old, new)
    # d gone, e rehung (upstream c), f (bypass c now), c (downstreams), b (standby e)
    assert {"c", "d", "e", "f", "b"} <= moved
    assert "g" not in moved  # g's upstream f and bypass e stay


def test_a_dc_change_moves_the_bypass_of_the_hosts_two_below() -> None:
    old = _topo(1, CHAIN, dict.fromkeys(CHAIN, "dc0"))
    new = _topo(2, CHAIN, {**dict.fromkeys(CHAIN, "dc0"), "d": "dc1"})
    places = {h: ("addr", "r0", new.dc(h)) for h in CHAIN}
    log = KeyLog()
    log.start({h: ("addr", "r0", old.dc(h)) for h in CHAIN})
    log.record(old, index_topology(old), new, index_topology(new), places, set())
    # f bypassed to d in its DC; b's standby (d) leaves its DC
    assert {"b", "d", "f"} <= log.diffs[-1].hosts


def test_an_address_that_moved_and_came_back_still_counts() -> None:
    t1, t2 = _topo(1, CHAIN), _topo(2, CHAIN)
    places = {h: ("addr", "r0", "") for h in CHAIN}
    log = KeyLog()
    log.start(places)
    log.record(t1, index_topology(t1), t2, index_topology(t2), places, {"e"})
    assert {"c", "d", "e", "f", "g"} <= log.diffs[-1].hosts


def test_unmoved_needs_every_diff_in_between_and_none_naming_the_host() -> None:
    log = KeyLog()
    for v in (3, 4, 5):
        log.diffs.append(TopologyDiff(v - 1, v, frozenset({f"h{v}"})))
    assert log.unmoved("x", 2, 5)
    assert log.unmoved("x", 5, 5)  # checked at this version already
    assert log.unmoved("h3", 3, 5)  # moved before it was checked: not since
    assert not log.unmoved("h4", 2, 5)
    assert not log.unmoved("x", 1, 5)  # older than the log: the diffs it needs are gone
    assert not log.unmoved("x", 2, 6)  # the log has not reached that version
    log.diffs.append(TopologyDiff(7, 8, frozenset()))  # 5 -> 7 never logged
    assert not log.unmoved("x", 4, 8)


def test_stripes_added_or_dropped_move_every_host() -> None:
    one = _topo(1, CHAIN)
    two = Topology(2, [*one.stripes, one.stripes[0]], one.racks)
    assert _moved(one, two) == set(CHAIN)
    assert _moved(two, _topo(3, CHAIN)) == set(CHAIN)  # dropped
    # hosts on either side only: every one of them
    grown = Topology(4, [*one.stripes, one.stripes[0]], {**one.racks, "z": "r1"})
    assert _moved(one, grown) == {*CHAIN, "z"}


def test_unmoved_reads_versions_by_value_at_any_size() -> None:
    """Versions grow without bound: past small integers they are still compared by value."""
    log = KeyLog()
    base = 10**6
    for v in (base + 1, base + 2):
        log.diffs.append(TopologyDiff(v - 1, v, frozenset()))
    assert log.unmoved("x", int(str(base)), int(str(base + 2)))  # fresh int objects


@given(st.data())
def test_the_index_standby_is_the_bypass_rule_for_every_host(data: st.DataObject) -> None:
    """index_topology's standby (grandchildren in the host's DC, computed in one pass) is
    what standby_hosts' rule says host by host (grandchildren whose bypass_peer it is)."""
    n = data.draw(st.integers(1, 30))
    hosts = [f"h{i}" for i in range(n)]
    parent: dict[str, str | None] = {}
    for i, h in enumerate(hosts):
        parent[h] = None if i == 0 else hosts[data.draw(st.integers(0, i - 1))]
    dcs = data.draw(
        st.sampled_from([{}, {h: data.draw(st.sampled_from(["", "dc1"])) for h in hosts}])
    )
    topo = Topology(1, [StripeChain(parent, hosts)], dict.fromkeys(hosts, "r0"), dcs)
    idx = index_topology(topo)
    for h in hosts:
        want = _standby(idx.children[0], topo, topo.stripes[0], h)
        assert list(idx.standby[0].get(h, ())) == want
