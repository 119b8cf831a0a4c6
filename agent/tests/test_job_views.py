"""The operator's topology picture (coordinator/views.py) from real topologies and a real
manifest: each hop's upstream and downstreams are the chains', bytes done are the verified
chunks' of the stripe (chunk index mod k), rates are the last report's."""

from __future__ import annotations

from pathlib import Path

from relgate_trust.manifest import build_manifest

from relgate_agent.contracts import ORIGIN, STRIPE_DONE
from relgate_agent.coordinator.topology import build_topology, splice
from relgate_agent.coordinator.views import (
    HostSnapshot,
    JobSnapshot,
    stripe_sizes,
    topology_view,
)
from relgate_agent.staging.storage import bitmap_from_bits

HOSTS = {"a0": "r0", "a1": "r0", "b0": "r1", "b1": "r1", "c0": "r2"}


def manifest(tmp_path: Path):  # 10 chunks of 1 KiB, the last one 300 B
    (tmp_path / "ck").mkdir()
    (tmp_path / "ck" / "w.bin").write_bytes(bytes(i % 251 for i in range(9 * 1024 + 300)))
    return build_manifest(tmp_path / "ck", "m", "v1", chunk_size=1024, block_size=256)


def test_each_hop_is_the_chains_and_bytes_are_the_stripes_chunks(tmp_path: Path) -> None:
    m = manifest(tmp_path)
    assert m.num_chunks == 10 and m.total_size == 9 * 1024 + 300
    k = 3
    topo = splice(build_topology(HOSTS, k), "b0")  # a version with a splice in it
    sizes = stripe_sizes(m, k)
    # stripe s holds chunks s, s+3, ...: 4, 3 and 3 chunks, the last (300 B) in stripe 0
    assert sizes == [3 * 1024 + 300, 3 * 1024, 3 * 1024] and sum(sizes) == m.total_size
    # chunks 0, 1, 4 and 9: stripes 0, 1, 1 and 0
    have_a1 = bitmap_from_bits([int(i in (0, 1, 4, 9)) for i in range(m.num_chunks)])
    snap = JobSnapshot(
        "j",
        "DISTRIBUTING",
        topo,
        m,
        {
            "a0": HostSnapshot(b"", True, (), ()),  # READY: every byte
            "a1": HostSnapshot(have_a1, False, (5000, STRIPE_DONE, 7), (2,)),
            "b1": HostSnapshot(b"", False, (), ()),  # nothing reported yet
            "c0": HostSnapshot(b"\xff", False, (1, 2, 3), ()),  # chunks 0-7
        },
    )
    view = topology_view(snap)
    assert (view.job_id, view.state, view.topology_version, view.live) == (
        "j",
        "DISTRIBUTING",
        topo.version,
        True,
    )
    assert [s.stripe for s in view.stripes] == [0, 1, 2]
    for s, chain in zip(view.stripes, topo.stripes, strict=True):
        assert s.stripe_bytes == sizes[s.stripe]
        assert s.root == chain.root() and s.hops[0].host_id == s.root
        assert s.hops[0].upstream == ORIGIN
        assert [h.host_id for h in s.hops] == chain.order  # b0 spliced out of every chain
        for h in s.hops:
            assert h.upstream == (chain.parent[h.host_id] or ORIGIN)
            assert list(h.downstreams) == chain.children(h.host_id)
    hop = {(s.stripe, h.host_id): h for s in view.stripes for h in s.hops}
    assert all(hop[(s, "a0")].bytes_done == sizes[s] for s in range(k))
    assert [hop[(s, "a1")].bytes_done for s in range(k)] == [1024 + 300, 2048, 0]
    assert [hop[(s, "a1")].rx_bytes_per_s for s in range(k)] == [5000, STRIPE_DONE, STRIPE_DONE]
    assert [hop[(s, "a1")].bypassed for s in range(k)] == [False, False, True]
    assert [hop[(s, "b1")].bytes_done for s in range(k)] == [0, 0, 0]
    assert [hop[(s, "b1")].rx_bytes_per_s for s in range(k)] == [0, 0, 0]
    assert [hop[(s, "c0")].bytes_done for s in range(k)] == [3 * 1024, 3 * 1024, 2 * 1024]
    assert [hop[(s, "c0")].rx_bytes_per_s for s in range(k)] == [1, 2, 3]
