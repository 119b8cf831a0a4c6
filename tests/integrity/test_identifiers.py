"""The one identifier rule (relgate.integrity.identifiers), property-tested."""

import unicodedata

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relgate.integrity.identifiers import MAX_ID_BYTES, IdentifierError, problem, validate_id

_SAFE = st.characters(
    blacklist_categories=("Cc", "Cs", "Zl", "Zp"),
    blacklist_characters="\u061c\u200e\u200f\u202a\u202b\u202c\u202d\u202e\u2066\u2067\u2068\u2069",
)


@given(st.text(_SAFE, min_size=1, max_size=120))
def test_valid_ids_round_trip(value):
    if len(value.encode()) > MAX_ID_BYTES:
        return
    assert validate_id(value) == value
    assert validate_id(value.encode("utf-8")) == value


@given(
    st.text(_SAFE, max_size=40),
    st.sampled_from(["\x00", "\n", "\r", "\t", "\x7f", "\x85", "\u2028", "\u202e"]),
    st.text(_SAFE, max_size=40),
)
def test_a_control_character_anywhere_is_refused(left, bad, right):
    with pytest.raises(IdentifierError) as err:
        validate_id(left + bad + right, where="test")
    assert err.value.check == "identifier" and err.value.exit_code == 3
    assert err.value.object == "test"
    assert "control character" in err.value.details["reason"]


@given(st.characters(whitelist_categories=("Cc",)))
def test_every_cc_character_is_refused(ch):
    assert unicodedata.category(ch) == "Cc"
    assert problem(f"a{ch}b") is not None


@given(st.integers(min_value=MAX_ID_BYTES + 1, max_value=200_000))
def test_length_limit_is_in_utf8_bytes(n):
    assert problem("x" * n) is not None
    assert problem("x" * MAX_ID_BYTES) is None
    # 2-byte characters count twice
    assert problem("é" * (MAX_ID_BYTES // 2)) is None
    assert problem("é" * (MAX_ID_BYTES // 2 + 1)) is not None


@given(st.binary(min_size=1, max_size=64))
def test_bytes_are_valid_only_as_strict_utf8(raw):
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        assert problem(raw) == "not valid UTF-8"
        return
    assert (problem(raw) is None) == (problem(text) is None)


@given(
    st.one_of(
        st.none(),
        st.integers(),
        st.floats(),
        st.lists(st.text()),
        st.dictionaries(st.text(), st.text()),
    )
)
def test_non_strings_are_refused(value):
    assert problem(value) is not None


def test_edge_cases():
    assert problem("") == "empty"
    assert problem("\udcff") == "not valid UTF-8 (lone surrogate)"  # argv surrogate escape
    assert validate_id("../../etc/passwd") == "../../etc/passwd"  # a value, never a path
    with pytest.raises(IdentifierError) as err:
        validate_id("x" * 100_000)
    assert len(err.value.details["value"]) <= 80  # never echoes the whole input
