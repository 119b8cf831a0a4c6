"""One origin budget shared by the stripe roots, rebalanced by the coordinator each sweep.

The rule (``pacing.origin_shares``) and the coordinator driving it (real SQLite, a real
signed manifest): a root whose stripe falls behind gets a larger share, the others less,
and the shares never add up to more than the job's origin cap.
"""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st
from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import TrustedKeys

from relgate_agent.contracts import ProgressReport, WatchCursor
from relgate_agent.coordinator.service import Coordinator, CoordinatorConfig
from relgate_agent.dataplane.pacing import IDLE, origin_shares
from relgate_agent.staging.storage import bitmap_from_bits

HOSTS = {f"h{i}": f"r{i % 2}" for i in range(6)}
CAP = 4_000_000


@given(
    st.integers(4 * 64, 10**10),  # any real cap: >= 4 bytes/s per stripe
    st.lists(st.integers(0, 10**12), min_size=1, max_size=64),
)
def test_shares_never_exceed_the_cap_and_follow_the_bytes_left(cap: int, left: list[int]) -> None:
    shares = origin_shares(cap, left)
    assert len(shares) == len(left) and sum(shares) <= cap
    for a, b in zip(left, shares, strict=True):
        assert b >= 1  # never 0 (a zero-rate bucket would be unlimited)
        if a == 0:
            assert b == IDLE
    # more bytes left, never a smaller share
    order = sorted(range(len(left)), key=lambda s: left[s])
    assert all(shares[i] <= shares[j] + 1 for i, j in itertools.pairwise(order))


def test_equal_progress_equal_shares_and_unlimited_stays_unlimited() -> None:
    assert origin_shares(CAP, [10, 10, 10, 10]) == (CAP // 4,) * 4
    assert origin_shares(0, [10, 10]) == (0, 0)


@pytest.fixture
def coord(tmp_path: Path, checkpoint):
    c = Coordinator(
        CoordinatorConfig(
            db=str(tmp_path / "c.sqlite"), trusted_keys=TrustedKeys.load(checkpoint["trusted"])
        )
    )
    for h, r in HOSTS.items():
        c.enroll(h, r, {"cluster": "inf-a"})
        c.heartbeat(h, r, f"10.0.0.{h[1:]}:1", [])
    yield c
    c.store.close()


def _verified(n: int, stripes: int, done: dict[int, int]) -> bytes:
    """A bitmap holding the first ``done[s]`` chunks of each stripe ``s``."""
    bits = [c // stripes < done.get(c % stripes, 0) for c in range(n)]
    return bitmap_from_bits(bits)


def test_a_stripe_that_falls_behind_gets_more_of_the_cap(coord: Coordinator, checkpoint) -> None:
    spec = JobSpec(
        model="claude-x",
        version="2026-10-12.3",
        manifest_uri=str(checkpoint["envelope"]),
        target_selector="cluster=inf-a",
        stripes=4,
        origin_cap_bytes_per_s=CAP,
    )
    job = coord.create_job(spec)
    n, k = checkpoint["manifest"].num_chunks, 4
    roots = [c.root() for c in job.topology.stripes]
    assert len(set(roots)) == k  # 6 hosts, 4 stripes: a root each
    for h in job.topology.racks:
        coord.register(job.job_id, h, HOSTS[h], b"", 1 << 30, f"10.0.0.{h[1:]}:1")

    def round_(done: dict[int, int]) -> dict[int, int]:
        """Every root reports its own stripe's progress; a sweep; each root's reply."""
        got: dict[int, int] = {}
        for s, root in enumerate(roots):
            assert root is not None
            have = _verified(n, k, {s: done[s]})
            coord.report_progress(job.job_id, root, ProgressReport(job.topology.version, have))
        coord.tick()
        for s, root in enumerate(roots):
            assert root is not None
            reply = coord.report_progress(job.job_id, root, ProgressReport(job.topology.version))
            (pair,) = reply.origin_shares  # a root each: its one stripe, its share
            assert pair[0] == s
            got[s] = pair[1]
        return got

    even = round_({0: 1, 1: 1, 2: 1, 3: 1})
    # equal progress, about equal shares (stripe 0 holds the manifest's one short last chunk)
    assert max(even.values()) - min(even.values()) < CAP // k // 50
    # stripe 2's root stalls while the others move on: its share rises, theirs fall
    behind = round_({0: 4, 1: 4, 2: 1, 3: 4})
    assert behind[2] > even[2] and all(behind[s] < even[s] for s in (0, 1, 3))
    assert CAP - k <= sum(behind.values()) <= CAP  # the whole cap, never more
    # the share is also what a (re)assignment carries: a successor root starts at it
    (u,) = coord.watch_updates([WatchCursor(roots[2] or "")])
    assert u is not None
    (a,) = u.assignments
    assert a.stripes[2].origin_rate_bytes_per_s == behind[2]
    # a stripe whose root holds it whole is idle: the rest share the cap
    done = -(-n // k)
    tail = round_({0: done, 1: 4, 2: 1, 3: 4})
    assert tail[0] == IDLE and tail[2] > behind[2] and sum(tail.values()) <= CAP
