from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relgate_agent.coordinator.store import JobRow, JobStore, StaleTopology
from relgate_agent.coordinator.topology import (
    StripeChain,
    Topology,
    append_host,
    build_topology,
    bypass_peer,
    index_topology,
    roots,
    splice,
    splice_all,
    standby_hosts,
)


def fleet(racks: int, per_rack: int) -> dict[str, str]:
    return {f"r{r}-h{i:02d}": f"r{r}" for r in range(racks) for i in range(per_rack)}


def upload_counts(topo: Topology) -> dict[str, int]:
    """How many (stripe, downstream) edges each host feeds; for balance checks."""
    out = dict.fromkeys(topo.racks, 0)
    for chain in topo.stripes:
        for p in chain.parent.values():
            if p is not None:
                out[p] = out.get(p, 0) + 1
    return out


def reaches_everyone(topo: Topology) -> None:
    for chain in topo.stripes:
        assert sum(1 for h in chain.order if chain.parent[h] is None) == 1
        for h in chain.order:
            seen = set()
            p = chain.parent[h]
            while p is not None:
                assert p not in seen
                seen.add(p)
                p = chain.parent[p]
        assert set(chain.order) == set(topo.racks)


def test_striped_chains_shape_and_balance() -> None:
    hosts = fleet(4, 8)
    topo = build_topology(hosts, 8)
    reaches_everyone(topo)
    # distinct roots per stripe, spread over racks
    rs = roots(topo)
    assert len(set(rs)) == 8
    assert len({hosts[r] for r in rs if r}) == 4
    for s, chain in enumerate(topo.stripes):
        # leader chain crosses racks once per rack; everything else is rack-local
        cross = [h for h in chain.order if chain.parent[h] and hosts[chain.parent[h]] != hosts[h]]
        assert len(cross) == 3, s
    # upload ~ download: every host feeds at most 2 downstream edges per stripe on average 1
    up = upload_counts(topo)
    assert max(up.values()) <= 8 + 2 and sum(up.values()) == 8 * (32 - 1)


def test_splice_root_and_middle_keep_everyone_connected() -> None:
    hosts = fleet(2, 4)
    topo = build_topology(hosts, 4)
    root0 = topo.stripes[0].root()
    assert root0 is not None
    t2 = splice(topo, root0)
    assert t2.version == topo.version + 1 and root0 not in t2.racks
    reaches_everyone(t2)
    mid = next(
        h for h in t2.stripes[1].order if t2.stripes[1].parent[h] and t2.stripes[1].children(h)
    )
    kids = t2.stripes[1].children(mid)
    up = t2.stripes[1].parent[mid]
    t3 = splice(t2, mid)
    reaches_everyone(t3)
    assert all(t3.stripes[1].parent[k] == up for k in kids)
    # a rejoining host goes to a tail: it has no downstreams
    t4 = append_host(t3, mid, hosts[mid])
    reaches_everyone(t4)
    assert t4.version == t3.version + 1
    assert all(not c.children(mid) for c in t4.stripes)
    assert all(hosts[c.parent[mid]] == hosts[mid] for c in t4.stripes if c.parent[mid])


def test_an_appended_host_hangs_from_no_leaf_or_slow_host() -> None:
    """Two hosts of one rack demoted in turn: the second hung from the first received at
    the first one's pace (the chaos lab's rack of a 30 %-NIC and a tx-slow host finished
    35 s after the rest). ``avoid`` names leaves and slow hosts; a candidate outside it is
    the parent, and only when every candidate is avoided is one of them."""
    hosts = fleet(2, 4)
    topo = build_topology(hosts, 2)
    first, second = "r0-h01", "r0-h02"
    t1 = append_host(splice(topo, first), first, "r0")
    t2 = append_host(splice(t1, second), second, "r0", avoid={first})
    reaches_everyone(t2)
    assert all(c.parent[second] != first and hosts[c.parent[second]] == "r0" for c in t2.stripes)
    plain = append_host(splice(t1, second), second, "r0")  # without avoid: behind the leaf
    assert all(c.parent[second] == first for c in plain.stripes)
    rack = {h for h, r in hosts.items() if r == "r0"} - {second}
    cornered = append_host(splice(t1, second), second, "r0", avoid=rack)
    assert all(hosts[c.parent[second]] == "r1" for c in cornered.stripes)  # its DC's last
    everyone = append_host(splice(t1, second), second, "r0", avoid=set(hosts))
    assert all(c.parent[second] == first for c in everyone.stripes)  # none left: as before


def test_store_topology_versions_are_monotonic(tmp_path: Path) -> None:
    store = JobStore(str(tmp_path / "c.sqlite"))
    topo = build_topology(fleet(2, 2), 2)
    targets = dict(topo.racks)
    row = JobRow(
        "dj_1", {"model": "m"}, "DISTRIBUTING", "sha256:" + "0" * 64, targets, topo, [], False, 0
    )
    assert store.create_job(row) and not store.create_job(row)
    t2 = splice(topo, "r0-h00")
    store.save_topology("dj_1", topo.version, t2, targets)
    with pytest.raises(StaleTopology):  # a deposed writer still holding version 1 loses
        store.save_topology("dj_1", topo.version, splice(topo, "r1-h00"), targets)
    with pytest.raises(StaleTopology):
        store.save_topology("dj_1", t2.version, t2, targets)
    (loaded,) = store.load_jobs()
    assert loaded.topology.to_json() == t2.to_json()
    store.upsert_host("h1", "r0", {"cluster": "a"}, "127.0.0.1:1", ["m/v1"])
    assert store.hosts_holding("m", "v1", "sha256:a") == set()  # a claim alone never counts
    store.mark_host_version("h1", "m", "v1", "sha256:a")  # a verified READY it accepted
    assert store.hosts_holding("m", "v1", "sha256:a") == {"h1"}
    # another signed manifest for the same model/version: the host does not hold that one
    assert store.hosts_holding("m", "v1", "sha256:b") == set()
    store.upsert_host("h1", "r0", {"cluster": "a"}, "127.0.0.1:1", [])  # GC'd on the host
    assert store.hosts_holding("m", "v1", "sha256:a") == set()
    # leader lease: one holder at a time, epoch bumps on every change of holder
    assert store.acquire_lease("a", 60) == 1
    assert store.acquire_lease("a", 60) == 1  # renewal
    assert store.acquire_lease("b", 60) is None
    store.release_lease("a")
    assert store.acquire_lease("b", 60) == 2
    assert store.acquire_lease("a", 60) is None
    store.close()


@settings(max_examples=60, deadline=None)
@given(
    racks=st.integers(1, 6),
    per_rack=st.integers(1, 6),
    stripes=st.integers(1, 5),
    data=st.data(),
)
def test_index_matches_the_chains(racks: int, per_rack: int, stripes: int, data) -> None:
    topo = build_topology(fleet(racks, per_rack), stripes)
    for _ in range(data.draw(st.integers(0, 3))):
        if len(topo.racks) > 1:
            topo = splice(topo, data.draw(st.sampled_from(sorted(topo.racks))))
    idx = index_topology(topo)
    assert idx.version == topo.version and idx.members == tuple(sorted(topo.racks))
    with pytest.raises(dataclasses.FrozenInstanceError):  # shared by every push of a version
        idx.version = topo.version + 1  # type: ignore[misc]
    for s, chain in enumerate(topo.stripes):
        for h in chain.order:
            assert list(idx.downstreams(s, h)) == chain.children(h)


def _splice_one_reference(topo: Topology, host: str) -> Topology:
    """The one-host splice as first written (scan each chain for the host's children):
    the reference :func:`splice_all` must agree with, host after host."""
    if host not in topo.racks:
        return topo
    new = topo.copy(topo.version + 1)
    for chain in new.stripes:
        if host not in chain.parent:
            continue
        up = chain.parent.pop(host)
        kids = [h for h in chain.order if chain.parent.get(h) == host]
        chain.order.remove(host)
        if kids:
            same = [k for k in kids if new.racks.get(k) == topo.racks[host]]
            successor = (same or kids)[0]
            chain.parent[successor] = up
            for k in kids:
                if k != successor:
                    chain.parent[k] = successor
    del new.racks[host]
    return new


@settings(max_examples=150, deadline=None)
@given(
    racks=st.integers(1, 6),
    per_rack=st.integers(1, 7),
    stripes=st.integers(1, 5),
    data=st.data(),
)
def test_splicing_many_at_once_is_splicing_them_one_by_one(
    racks: int, per_rack: int, stripes: int, data
) -> None:
    topo = build_topology(fleet(racks, per_rack), stripes)
    if data.draw(st.booleans()):  # a late host at a rack tail, as in a running job
        topo = append_host(
            topo, "late", data.draw(st.sampled_from(sorted(set(topo.racks.values()))))
        )
    hosts = data.draw(st.lists(st.sampled_from([*sorted(topo.racks), "never-there"]), max_size=12))
    expected = topo
    for h in hosts:
        expected = _splice_one_reference(expected, h)
    got = splice_all(topo, hosts)
    assert got.racks == expected.racks
    assert [(c.parent, c.order) for c in got.stripes] == [
        (c.parent, c.order) for c in expected.stripes
    ]
    assert got.version == (topo.version + 1 if got.racks != topo.racks else topo.version)
    for chain in got.stripes:  # still one tree per stripe over every host left
        assert sorted(chain.order) == sorted(got.racks)
        assert sum(chain.parent[h] is None for h in chain.order) == (1 if got.racks else 0)


# -- data centers ------------------------------------------------------------------------------


def dc_fleet(dcs: int, racks: int, per_rack: int) -> tuple[dict[str, str], dict[str, str]]:
    hosts, dc_of = {}, {}
    for d in range(dcs):
        for r in range(racks):
            for i in range(per_rack):
                h = f"d{d}r{r}-h{i}"
                hosts[h], dc_of[h] = f"d{d}r{r}", f"dc{d}"
    return hosts, dc_of


def cross_dc_edges(topo: Topology, s: int) -> list[tuple[str, str]]:
    chain = topo.stripes[s]
    return [(p, h) for h, p in chain.parent.items() if p is not None and topo.dc(p) != topo.dc(h)]


def test_each_remote_dc_hangs_one_chain_per_stripe_under_the_home_tail() -> None:
    hosts, dc_of = dc_fleet(2, 2, 3)
    topo = build_topology(hosts, 4, dcs=dc_of, home_dc="dc1")
    reaches_everyone(topo)
    assert topo.dcs == dc_of
    for s, chain in enumerate(topo.stripes):
        root = chain.root()
        assert root is not None and topo.dc(root) == "dc1"  # the origin's DC reads the origin
        [(up, down)] = cross_dc_edges(topo, s)
        assert (topo.dc(up), topo.dc(down)) == ("dc1", "dc0")
        # the home DC's tail of this stripe: it had no downstream before the WAN edge
        home = [h for h in chain.order if topo.dc(h) == "dc1"]
        assert up == home[-1] and chain.children(up) == [down]
        assert topo.crosses_dc(up, down) and not topo.crosses_dc(None, down)
        # the remote DC is its own striped chain: its hosts feed only each other
        remote = [h for h in chain.order if topo.dc(h) == "dc0"]
        assert remote[0] == down and all(topo.dc(chain.parent[h]) == "dc0" for h in remote[1:])
    # stripe roots differ per stripe in each DC, as in one DC
    assert len({c.root() for c in topo.stripes}) == 4
    assert len({cross_dc_edges(topo, s)[0][1] for s in range(4)}) == 4
    # the DCs round-trip through the stored form
    assert Topology.from_json(topo.to_json()) == topo


def test_home_dc_defaults_to_the_biggest_and_one_dc_is_the_old_shape() -> None:
    hosts, dc_of = dc_fleet(2, 2, 2)
    hosts["d1r0-extra"], dc_of["d1r0-extra"] = "d1r0", "dc1"
    topo = build_topology(hosts, 2, dcs=dc_of)
    assert {topo.dc(c.root() or "") for c in topo.stripes} == {"dc1"}
    plain = build_topology(fleet(2, 3), 3)
    assert plain.dcs == {} and build_topology(fleet(2, 3), 3, dcs={}) == plain
    assert (
        "dcs" in plain.to_json()
        and Topology.from_json({k: v for k, v in plain.to_json().items() if k != "dcs"}) == plain
    )  # topologies stored before DCs existed still load


def test_splicing_keeps_one_wan_edge_per_stripe() -> None:
    hosts, dc_of = dc_fleet(2, 2, 2)
    topo = build_topology(hosts, 2, dcs=dc_of, home_dc="dc0")
    up, down = cross_dc_edges(topo, 0)[0]
    # the home tail dies: the remote root moves up under the home host before it
    t = splice(topo, up)
    assert cross_dc_edges(t, 0) == [(topo.stripes[0].parent[up], down)]
    # the remote root dies: a remote host takes its place under the same home host
    t2 = splice(topo, down)
    [(up2, down2)] = cross_dc_edges(t2, 0)
    assert up2 == up and t2.dc(down2) == "dc1"
    assert "d0r0-h0" not in splice(topo, "d0r0-h0").dcs


def test_a_late_host_joins_its_own_dc_never_the_other() -> None:
    hosts, dc_of = dc_fleet(2, 1, 2)
    topo = build_topology(hosts, 2, dcs=dc_of, home_dc="dc0")
    t = append_host(topo, "late", "d1r9", "dc1")  # a rack of dc1 with no hosts yet
    for s, chain in enumerate(t.stripes):
        assert t.dc(chain.parent["late"] or "") == "dc1"
        assert len(cross_dc_edges(t, s)) == 1
    assert t.dcs["late"] == "dc1"


@settings(max_examples=60, deadline=None)
@given(
    st.lists(st.integers(min_value=0, max_value=23), max_size=10),
    st.lists(st.integers(min_value=0, max_value=1), max_size=4),
)
def test_any_splices_and_joins_keep_one_wan_edge_per_remote_dc(dead, joins) -> None:
    hosts, dc_of = dc_fleet(2, 3, 4)
    names = sorted(hosts)
    topo = build_topology(hosts, 3, dcs=dc_of, home_dc="dc0")
    for i, d in enumerate(joins):
        topo = append_host(topo, f"late{i}", f"d{d}r{i % 2 * 9}", f"dc{d}")  # new racks too
    topo = splice_all(topo, [names[i] for i in dead])
    reaches_everyone(topo)
    present = set(topo.dcs.values())
    for s, chain in enumerate(topo.stripes):
        edges = cross_dc_edges(topo, s)
        root = chain.root()
        if root is not None and topo.dc(root) == "dc0" and "dc1" in present:
            assert len(edges) == 1 and topo.dc(edges[0][0]) == "dc0"
        else:
            assert len(edges) == 0


def test_a_late_home_host_in_a_new_rack_goes_behind_the_last_home_host() -> None:
    hosts, dc_of = dc_fleet(2, 2, 2)  # dc0 (home) first in every chain, then dc1
    topo = build_topology(hosts, 2, dcs=dc_of, home_dc="dc0")
    t = append_host(topo, "late", "d0r9", "dc0")
    for chain, before in zip(t.stripes, topo.stripes, strict=True):
        home = [h for h in before.order if topo.dc(h) == "dc0"]
        assert chain.parent["late"] == home[-1]  # the home tail, not the end of the chain
    # the home tail now feeds the remote root and the late host: when it dies the late
    # host (its own DC) takes its place and the WAN edge stays single
    tail = [h for h in topo.stripes[0].order if topo.dc(h) == "dc0"][-1]
    after = splice(t, tail)
    assert len(cross_dc_edges(after, 0)) == 1
    assert after.stripes[0].parent["late"] == topo.stripes[0].parent[tail]
    assert after.dc(cross_dc_edges(after, 0)[0][0]) == "dc0"
    # a late host in a rack of its own DC goes behind that rack's last host exactly
    t2 = append_host(topo, "late2", "d1r1", "dc1")
    for chain in t2.stripes:
        rack = [h for h in chain.order if t2.racks[h] == "d1r1" and h != "late2"]
        assert chain.parent["late2"] == rack[-1]


def test_rack_names_may_repeat_across_dcs_and_a_late_host_stays_in_its_own() -> None:
    hosts = {"a1": "r0", "a2": "r0", "b1": "r0", "b2": "r0"}
    dc_of = {"a1": "a", "a2": "a", "b1": "b", "b2": "b"}
    topo = build_topology(hosts, 2, dcs=dc_of, home_dc="a")
    assert all(len(cross_dc_edges(topo, s)) == 1 for s in range(2))
    t = append_host(topo, "late", "r0", "a")  # rack r0 of DC a, not r0 of DC b
    for chain in t.stripes:
        assert t.dc(chain.parent["late"] or "") == "a"
    # crosses_dc is inequality of DCs, whichever name sorts first
    assert topo.crosses_dc("a1", "b1") and topo.crosses_dc("b1", "a1")
    assert not topo.crosses_dc("a1", "a2") and not topo.crosses_dc(None, "a1")


def _chaos_fleet() -> Topology:
    """The chaos bench's fleet (16 hosts, rack = index mod 4, 8 stripes) after its
    corrupter h05 and one killed host h09 were spliced out."""
    hosts = {f"h{i:02d}": f"r{i % 4}" for i in range(16)}
    return splice_all(build_topology(hosts, 8), ["h05", "h09"])


def test_a_slow_downstream_is_not_promoted_into_a_dead_hosts_place() -> None:
    topo = _chaos_fleet()
    chain = topo.stripes[0]
    up, kids = chain.parent["h02"], chain.children("h02")
    assert sorted(kids) == ["h03", "h06"] and topo.racks["h06"] == topo.racks["h02"]
    # without evidence, the same-rack downstream takes the place (the leader chain stays
    # rack-local) and feeds the other
    plain = splice(topo, "h02").stripes[0]
    assert (plain.parent["h06"], plain.parent["h03"]) == (up, "h06")
    # h06 slow: the other rack's downstream takes the place, and h06 hangs below it
    steered = splice(topo, "h02", slow={"h06"})
    s0 = steered.stripes[0]
    assert (s0.parent["h03"], s0.parent["h06"]) == (up, "h03")
    reaches_everyone(steered)
    # every stripe: h06 succeeds h02 nowhere a faster downstream was there to take it
    for before, after in zip(topo.stripes, steered.stripes, strict=True):
        if "h02" in before.parent and len(before.children("h02")) > 1:
            assert after.parent.get("h06") != before.parent["h02"]
    # every downstream slow: the rule without evidence (nobody is left unfed)
    assert splice(topo, "h02", slow={"h03", "h06"}).to_json() == splice(topo, "h02").to_json()


def test_a_slow_home_downstream_still_beats_a_remote_one() -> None:
    """Promoting a remote-DC host into a home host's place would add a WAN crossing: DC
    first, then speed, then rack."""
    chain = StripeChain(
        parent={"a": None, "b": "a", "c": "b", "x": "b"}, order=["a", "b", "c", "x"]
    )
    topo = Topology(1, [chain], {"a": "r0", "b": "r0", "c": "r1", "x": "r0"}, {"x": "dc1"})
    s0 = splice(topo, "b", slow={"c"}).stripes[0]
    assert (s0.parent["c"], s0.parent["x"]) == ("a", "c")
    # a fast home host in another rack beats a slow one in the rack
    chain2 = StripeChain(
        parent={"a": None, "b": "a", "c": "b", "d": "b"}, order=["a", "b", "d", "c"]
    )
    topo2 = Topology(1, [chain2], {"a": "r0", "b": "r0", "c": "r1", "d": "r0"})
    assert splice(topo2, "b", slow={"d"}).stripes[0].parent["c"] == "a"
    assert splice(topo2, "b").stripes[0].parent["d"] == "a"


@settings(max_examples=80, deadline=None)
@given(
    racks=st.integers(1, 5),
    per_rack=st.integers(1, 6),
    stripes=st.integers(1, 5),
    two_dcs=st.booleans(),
    data=st.data(),
)
def test_a_bypass_peer_is_the_grandparent_of_this_dc_and_serves_its_standby(
    racks: int, per_rack: int, stripes: int, two_dcs: bool, data
) -> None:
    """Every host's bypass peer is its upstream's upstream, never the origin and never in
    another DC; the bypass peer lists it as standby, and lists nobody else."""
    hosts = fleet(racks, per_rack)
    dcs = {h: ("east" if int(r[1:]) % 2 else "west") for h, r in hosts.items()} if two_dcs else {}
    topo = build_topology(hosts, stripes, dcs=dcs)
    for _ in range(data.draw(st.integers(0, 2))):
        if len(topo.racks) > 1:
            topo = splice(topo, data.draw(st.sampled_from(sorted(topo.racks))))
    idx = index_topology(topo)
    for s, chain in enumerate(topo.stripes):
        granted: dict[str, set[str]] = {}
        for h in chain.order:
            peer = bypass_peer(topo, chain, h)
            up = chain.parent[h]
            if peer is None:
                grand = chain.parent.get(up) if up is not None else None
                assert grand is None or topo.dc(grand) != topo.dc(h)
                continue
            assert up is not None and chain.parent[up] == peer
            assert topo.dc(peer) == topo.dc(h)
            granted.setdefault(peer, set()).add(h)
        for h in chain.order:
            assert set(standby_hosts(idx, s, h, topo)) == granted.get(h, set())


def test_the_bypass_of_a_rack_chain_skips_one_host_and_never_reaches_the_origin() -> None:
    topo = build_topology({"a": "r", "b": "r", "c": "r", "d": "r"}, 2)
    idx = index_topology(topo)
    s0 = topo.stripes[0]  # a -> b -> c -> d
    assert [bypass_peer(topo, s0, h) for h in "abcd"] == [None, None, "a", "b"]
    assert standby_hosts(idx, 0, "a", topo) == ["c"]
    assert standby_hosts(idx, 0, "c", topo) == []
