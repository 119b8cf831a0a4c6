"""The fast RFC 8785 encoder is byte-identical to the reference, refusals included."""

from __future__ import annotations

import enum
from typing import Any

import pytest
import rfc8785
from hypothesis import given, settings
from hypothesis import strategies as st
from relgate_trust import jcs

any_text = st.text(st.characters(codec=None, exclude_categories=()), max_size=12)
scalars = (
    st.none()
    | st.booleans()
    | st.integers(-(2**60), 2**60)
    | st.integers(-jcs.MAX_SAFE_INTEGER, jcs.MAX_SAFE_INTEGER)
    | any_text
    | st.floats(allow_nan=False)
)
documents = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=5) | st.dictionaries(any_text, inner, max_size=5),
    max_leaves=40,
)


def _outcome(fn: Any, value: Any) -> tuple[str, bytes | str]:
    try:
        return "ok", fn(value)
    except Exception as exc:  # the reference's refusal is the expected outcome
        return "error", type(exc).__name__


@settings(max_examples=600, deadline=None)
@given(documents)
def test_same_bytes_or_same_refusal_as_the_reference(value: Any) -> None:
    assert _outcome(jcs.dumps, value) == _outcome(rfc8785.dumps, value)


@pytest.mark.parametrize(
    "value",
    [
        {"\ue000": 1, "\U0001f600": 2},  # UTF-16 order differs from code-point order
        {"a\x00\x1f\x7f\u2028": '\b\t\n\f\r"\\'},
        [2**53 - 1, -(2**53 - 1)],
        {"nested": [{"b": 1, "a": [True, False, None]}], "": ""},
    ],
)
def test_edge_documents(value: Any) -> None:
    assert jcs.dumps(value) == rfc8785.dumps(value)


def test_values_the_fast_path_leaves_to_the_reference() -> None:
    class Colour(enum.IntEnum):
        RED = 1

    assert jcs.dumps({"c": Colour.RED}) == rfc8785.dumps({"c": Colour.RED})
    assert jcs.dumps((1, "x")) == rfc8785.dumps((1, "x"))
    for bad in (2**53, 1.5, "\ud800", {"k": float("inf")}):
        assert _outcome(jcs.dumps, bad) == _outcome(rfc8785.dumps, bad)
    deep: Any = 1
    for _ in range(250):
        deep = [deep]
    assert _outcome(jcs.dumps, deep) == _outcome(rfc8785.dumps, deep)
