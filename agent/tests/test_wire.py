"""Watch events encoded straight to bytes parse as the generated message would build them."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relgate_agent.contracts import AssignmentPlan, JobRef, PeerRef, StripePlan, WatchUpdate
from relgate_agent.coordinator import wire
from relgate_agent.coordinator.wire import WatchEncoder, watch_event_to_pb
from relgate_agent.proto import distribution_pb2 as pb

names = st.text(st.characters(codec="utf-8", exclude_categories=("Cs",)), max_size=12)
peers = st.builds(PeerRef, names, names, names)
stripes = st.builds(
    StripePlan,
    st.integers(0, 64),
    peers,
    st.lists(peers, max_size=3).map(tuple),
    st.integers(0, 2**40),
    st.integers(0, 2**40),
    st.booleans(),
    st.none() | peers,
    st.lists(peers, max_size=3).map(tuple),
)
plans = st.builds(
    AssignmentPlan,
    names,
    st.integers(0, 2**62),
    st.lists(stripes, max_size=4).map(tuple),
    names,
    st.booleans(),
    st.lists(names, max_size=40).map(tuple),
    st.integers(0, 2**40),
)
updates = st.builds(
    WatchUpdate,
    st.lists(st.builds(JobRef, names, names, names, names), max_size=3).map(tuple),
    st.lists(plans, max_size=4).map(tuple),
)


@settings(max_examples=300, deadline=None)
@given(update=updates, sequence=st.integers(0, 2**62))
def test_encoded_event_parses_as_the_generated_one(update: WatchUpdate, sequence: int) -> None:
    enc = WatchEncoder()
    raw = enc.event(update, sequence)
    assert pb.WatchEvent.FromString(raw) == watch_event_to_pb(update, sequence)
    assert enc.event(update, sequence) == raw  # the cached member lists change nothing
    assert pb.WatchEvent.FromString(WatchEncoder().event(update, sequence)) == (
        pb.WatchEvent.FromString(raw)
    )


def test_an_empty_upstream_is_still_sent_and_the_peer_cache_is_bounded(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(wire, "PEERS_KEPT", 2)
    enc = WatchEncoder()
    stripe = StripePlan(0, PeerRef(""), (PeerRef("a"), PeerRef("b"), PeerRef("c")), 5)
    plan = AssignmentPlan("j", 3, (stripe,), "DISTRIBUTING", False, ("a",))
    for _ in range(2):
        got = pb.WatchEvent.FromString(enc.event(WatchUpdate((), (plan,)), 1))
        assert got == watch_event_to_pb(WatchUpdate((), (plan,)), 1)
        assert got.assignments[0].stripes[0].HasField("upstream")
        assert len(enc._peers) <= 3  # PEERS_KEPT + the one added after a clear


def test_member_lists_are_per_job_and_version_and_checked() -> None:
    enc = WatchEncoder()
    a = AssignmentPlan("j", 7, (), "DISTRIBUTING", False, ("h1", "h2"))
    b = AssignmentPlan("j", 7, (), "DISTRIBUTING", False, ("h1",))  # same key, other members
    c = AssignmentPlan("k", 7, (), "DISTRIBUTING", False, ("h9",))
    for plan in (a, b, c, a):
        got = pb.WatchEvent.FromString(enc.event(WatchUpdate((), (plan,)), 1)).assignments[0]
        assert tuple(got.members) == plan.members and got.job_id == plan.job_id


def test_a_registration_maps_every_field_to_its_response() -> None:
    from relgate_agent.contracts import PeerRef, Registration
    from relgate_agent.coordinator.wire import registration_to_pb

    r = Registration(
        manifest_envelope=b"",
        manifest_digest="sha256:" + "a" * 64,
        origin_uri="s3://bucket/ckpt",
        topology_version=7,
        stripes=8,
        manifest_sources=(
            PeerRef("h1", "10.0.0.1:7070", "r0"),
            PeerRef("h9", "10.0.9.9:7070", "r3"),
        ),
    )
    got = registration_to_pb(r)
    assert set(got.DESCRIPTOR.fields_by_name) == {f.name for f in dataclasses.fields(r)}
    assert (got.manifest_digest, got.origin_uri, got.topology_version, got.stripes) == (
        r.manifest_digest,
        r.origin_uri,
        7,
        8,
    )
    assert [(p.host_id, p.address, p.rack) for p in got.manifest_sources] == [
        ("h1", "10.0.0.1:7070", "r0"),
        ("h9", "10.0.9.9:7070", "r3"),
    ]
    assert got.manifest_envelope == b""


@pytest.mark.parametrize(
    ("actions", "shares", "sent", "is_news"),
    [
        ((), (), (), False),  # nothing to say
        ((), (), ((0, 100),), False),  # empty shares mean "keep the last ones"
        (("STOP",), (), (), True),
        (("FULL_PROGRESS",), ((0, 100),), ((0, 100),), True),
        ((), ((0, 100),), ((0, 100),), False),  # the same shares again: not news
        ((), ((0, 100),), (), True),  # the first shares on the stream
        ((), ((0, 200),), ((0, 100),), True),  # more
        ((), ((0, 50),), ((0, 100),), True),  # less
        ((), ((0, 100), (1, 5)), ((0, 100),), True),  # another stripe
    ],
)
def test_news_is_an_action_or_origin_shares_other_than_the_last_sent(
    actions: tuple[str, ...],
    shares: tuple[tuple[int, int], ...],
    sent: tuple[tuple[int, int], ...],
    is_news: bool,
) -> None:
    from relgate_agent.contracts import ProgressReply

    # equal shares built apart (not the same object): compared by value
    reply = ProgressReply(7, actions, tuple(tuple(s) for s in shares))
    assert wire.news(reply, tuple(tuple(s) for s in sent)) is is_news


def test_an_answer_echoes_the_report_it_answers() -> None:
    from relgate_agent.contracts import ProgressReply

    request = pb.ReportProgressRequest(job_id="j1", host_id="h00", seq=41, quiet=True)
    answer = wire.reply_to_pb(ProgressReply(9, ("STOP",), ((2, 300),)), request)
    assert (answer.seq, answer.job_id, answer.topology_version, list(answer.actions)) == (
        41,
        "j1",
        9,
        ["STOP"],
    )
    assert [(o.stripe, o.rate_bytes_per_s) for o in answer.origin_shares] == [(2, 300)]
