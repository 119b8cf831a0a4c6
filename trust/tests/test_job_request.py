"""The job request round-trips through its wire form (the Pipes extras), and a document
that lacks what a job needs is refused with JobRequestError."""

from __future__ import annotations

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
