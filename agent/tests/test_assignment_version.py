"""A stripe pull names the topology version its upstream came from (job.Assignments):
read with the assignment, not after it. Read after, a version applied in between would be
claimed with the old upstream, which that upstream (on the new version) refuses as an
outsider at its own version instead of recognising a peer a moment behind."""

from __future__ import annotations

import threading

from relgate_agent.agent.job import Assignments
from relgate_agent.proto import distribution_pb2 as pb


def _assignment(version: int, upstream: str) -> pb.Assignment:
    return pb.Assignment(
        topology_version=version,
        leader_epoch=1,
        stripes=[pb.StripeAssignment(stripe=0, upstream=pb.Peer(host_id=upstream, address="x:1"))],
        members=["h1", "h2", "h3"],
    )


def test_the_assignment_and_its_version_are_read_together() -> None:
    a, stop = Assignments(), threading.Event()
    a.apply(_assignment(3, "h2"))
    sa, version = a.wait_versioned(0, stop)
    assert sa is not None and (sa.upstream.host_id, version) == ("h2", 3)
    a.apply(_assignment(4, "h3"))  # rewired after the read: the pull keeps v3 with h2
    assert (sa.upstream.host_id, version) == ("h2", 3)
    sa, version = a.wait_versioned(0, stop)
    assert sa is not None and (sa.upstream.host_id, version) == ("h3", 4)
