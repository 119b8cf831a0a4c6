"""Hypothesis properties of the shared DSSE parser (relgate_trust.dsse).

A canonical payload round-trips through sign/verify; any other encoding of the same document
that differs in bytes is refused (payload-canonical); arbitrary bytes, arbitrary JSON shapes
and arbitrary payloads never raise anything but a DsseError naming one of dsse.CHECKS.
"""

from __future__ import annotations

import json

import pytest
import rfc8785
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from relgate_trust import dsse
from relgate_trust.dsse import DsseError
from test_dsse import BUILDER, PT, refused, signed, verify

# ------------------------------------------------------------------------------ properties

json_values = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**53 - 1), max_value=2**53 - 1)
    | st.text(max_size=20),
    lambda children: (
        st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children, max_size=5)
    ),
    max_leaves=30,
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(json_values)
def test_canonical_payload_round_trips(value) -> None:
    payload = rfc8785.dumps(value)
    env = signed(payload)
    out = verify(dsse.envelope_bytes(env))
    assert out.body == value and out.payload == payload
    assert rfc8785.dumps(out.body) == payload


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    json_values,
    st.sampled_from(["indent", "spaces", "ascii", "unsorted", "trailing"]),
)
def test_non_canonical_reencoding_is_refused(value, style) -> None:
    canonical = rfc8785.dumps(value)
    if style == "indent":
        other = json.dumps(value, indent=1).encode()
    elif style == "spaces":
        other = json.dumps(value, separators=(", ", ": ")).encode()
    elif style == "ascii":
        other = json.dumps(value, ensure_ascii=True, separators=(",", ":")).encode()
    elif style == "unsorted":
        if isinstance(value, dict):
            other = json.dumps(dict(reversed(list(value.items()))), separators=(",", ":"))
            other = other.encode("utf-8")
        else:
            other = canonical
    else:
        other = canonical + b" "
    if other == canonical:
        assert verify(signed(other)).body == value
    else:
        assert refused(signed(other)) == "payload-canonical"


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_bytes_only_typed_refusals(data: bytes) -> None:
    with pytest.raises(DsseError) as err:
        verify(data)
    assert err.value.check in dsse.CHECKS


@settings(max_examples=300, deadline=None)
@given(st.binary(max_size=300))
def test_random_signed_payloads_parse_or_typed_refusal(data: bytes) -> None:
    try:
        out = verify(signed(data))
    except DsseError as exc:
        assert exc.check.startswith("payload-")
    else:
        assert rfc8785.dumps(out.body) == data


envelope_like = st.dictionaries(
    st.sampled_from(["payloadType", "payload", "signatures", "x"]),
    st.none()
    | st.integers()
    | st.text(max_size=8)
    | st.just(PT)
    | st.lists(
        st.dictionaries(
            st.sampled_from(["keyid", "sig", "keyVersion", "y"]),
            st.none() | st.integers() | st.text(max_size=8) | st.just(BUILDER.keyid),
            max_size=4,
        ),
        max_size=3,
    ),
    max_size=4,
)


@settings(max_examples=300, deadline=None)
@given(envelope_like)
def test_random_envelope_shapes_only_typed_refusals(env) -> None:
    for form in (env, json.dumps(env).encode()):
        with pytest.raises(DsseError) as err:
            verify(form)
        assert err.value.check in dsse.CHECKS
