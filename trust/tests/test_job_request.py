"""The job request round-trips through its wire form (the Pipes extras), and a document
that lacks what a job needs is refused with JobRequestError."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st
from relgate_trust.errors import JobRequestError, TrustError
from relgate_trust.job_request import Enrollment, JobRequest, JobSpec, ServeSpec

text = st.text(st.characters(codec="utf-8", exclude_characters=",="), min_size=1, max_size=12)
threshold = st.integers(0, 1_000_000).map(lambda ppm: ppm / 1_000_000)
enrollments = st.builds(
    Enrollment, host_id=text, rack=text, labels=st.dictionaries(text, text, max_size=3)
)
serves = st.builds(
    ServeSpec,
    db=text,
    trusted_keys=st.tuples(text),
    listen=text,
    stripes=st.integers(1, 64),
    dead_after_s=st.floats(0.5, 60),
    min_hosts=st.integers(0, 4096),
    min_hosts_wait_s=st.floats(0, 600),
    enroll=st.lists(enrollments, max_size=3).map(tuple),
)


@st.composite
def requests(draw: st.DrawFn) -> JobRequest:
    ready = draw(threshold)
    job = JobSpec(
        model=draw(text),
        version=draw(text),
        manifest_uri=draw(text),
        origin_uri=draw(st.one_of(st.just(""), text)),
        target_selector=draw(st.one_of(st.just(""), text)),
        priority=draw(st.sampled_from(["low", "normal", "high"])),
        origin_cap_bytes_per_s=draw(st.integers(0, 10**12)),
        ready_threshold_ppm=round(ready * 1_000_000),
        deadline_s=draw(st.integers(0, 86_400)),
        stripes=draw(st.integers(0, 64)),
        webhook_url=draw(st.one_of(st.just(""), text)),
        origin_dc=draw(st.one_of(st.just(""), text)),
    )
    coordinator = draw(st.one_of(st.just(""), text))
    return JobRequest(
        job=job,
        pki=draw(text),
        ready_threshold=ready,
        coordinator=coordinator,
        serve=None if coordinator else draw(serves),
        poll_interval_s=draw(st.floats(0.01, 60)),
        timeout_s=draw(st.floats(1, 86_400)),
        wait_for_all=draw(st.booleans()),
    )


@given(requests())
def test_a_request_reads_back_from_its_extras(request: JobRequest) -> None:
    assert JobRequest.from_extras(request.to_extras()) == request


def test_labels_spelled_as_text_or_a_mapping_are_the_same() -> None:
    assert Enrollment.parse_labels("fleet=a,dc=dc1,odd") == {"fleet": "a", "dc": "dc1"}
    assert Enrollment.parse_labels({"fleet": "a"}) == {"fleet": "a"}


@pytest.mark.parametrize(
    ("extras", "missing"),
    [
        ({"job": {"model": "m", "version": "v"}, "pki": "p", "coordinator": "c"}, "manifest_uri"),
        ({"job": {"version": "v", "manifest_uri": "u"}, "pki": "p", "coordinator": "c"}, "model"),
        ({"job": {"model": "m", "manifest_uri": "u"}, "pki": "p", "coordinator": "c"}, "version"),
        ({"job": {"model": "m", "version": "v", "manifest_uri": "u"}, "coordinator": "c"}, "pki"),
        ({"job": {"model": "m", "version": "v", "manifest_uri": "u"}, "pki": "p"}, "serve"),
    ],
)
def test_a_request_missing_what_a_job_needs_is_refused(
    extras: dict[str, object], missing: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("RELGATE_AGENT_PKI", raising=False)
    with pytest.raises(JobRequestError, match=missing) as err:
        JobRequest.from_extras(extras)
    assert isinstance(err.value, TrustError)


def test_what_a_minimal_request_defaults_to(monkeypatch: pytest.MonkeyPatch) -> None:
    """The defaults relgate_agent.pipes documents: threshold 99.5 %, poll 1 s, one hour, no
    wait for all; a served coordinator listens on 127.0.0.1:7470 with 8 stripes, dead
    after 6 s, waiting up to 120 s for no minimum of hosts."""
    monkeypatch.delenv("RELGATE_AGENT_PKI", raising=False)
    job = {"model": "m", "version": "v", "manifest_uri": "u"}
    request = JobRequest.from_extras(
        {"job": job, "pki": "p", "serve": {"db": "d", "trusted_keys": ["k"]}}
    )
    assert (request.ready_threshold, request.job.ready_threshold_ppm) == (0.995, 995_000)
    assert (request.poll_interval_s, request.timeout_s, request.wait_for_all) == (
        1.0,
        3600.0,
        False,
    )
    assert (
        request.serve
        == ServeSpec("d", ("k",))
        == ServeSpec.from_extras({"db": "d", "trusted_keys": ["k"]})
    )
    assert (request.serve.listen, request.serve.stripes, request.serve.dead_after_s) == (
        "127.0.0.1:7470",
        8,
        6.0,
    )
    assert (request.serve.min_hosts, request.serve.min_hosts_wait_s, request.serve.enroll) == (
        0,
        120.0,
        (),
    )


def test_the_pki_comes_from_the_environment_when_the_extras_lack_it(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("RELGATE_AGENT_PKI", "/etc/relgate/pki")
    job = {"model": "m", "version": "v", "manifest_uri": "u"}
    assert JobRequest.from_extras({"job": job, "coordinator": "c:1"}).pki == "/etc/relgate/pki"
    assert JobRequest.from_extras({"job": job, "coordinator": "c:1", "pki": "mine"}).pki == "mine"


def test_a_running_coordinator_wins_over_a_serve_section() -> None:
    job = {"model": "m", "version": "v", "manifest_uri": "u"}
    serve = {"db": "d", "trusted_keys": ["k"]}
    request = JobRequest.from_extras({"job": job, "pki": "p", "coordinator": "c:1", "serve": serve})
    assert (request.coordinator, request.serve) == ("c:1", None)
    assert "serve" not in request.to_extras()


def test_a_label_value_keeps_its_own_equals_signs_and_requests_are_frozen() -> None:
    assert Enrollment.parse_labels("k=v=w") == {"k": "v=w"}
    request = JobRequest(JobSpec(model="m"), pki="p", coordinator="c")
    for frozen, field in ((request, "pki"), (request.job, "model"), (ServeSpec("d", ()), "db")):
        with pytest.raises(dataclasses.FrozenInstanceError):
            setattr(frozen, field, "x")
    with pytest.raises(dataclasses.FrozenInstanceError):
        Enrollment("h", "r", {}).rack = "x"
