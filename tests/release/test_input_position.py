"""A saved input position is read back from a checkpoint pin, a file or a caller: the
parser takes exactly what :meth:`InputPosition.to_json` writes and refuses anything else
with check ``schema``, never an internal error."""

from __future__ import annotations

import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relgate.errors import RejectedError
from relgate.runs.reader import InputPosition

DIGEST = "sha256:" + "ab" * 32
_cursor = st.integers(min_value=0, max_value=2**40)
positions = st.builds(
    InputPosition,
    root=st.just(DIGEST),
    seed=st.integers(min_value=-(2**40), max_value=2**40),
    shards=st.lists(st.text(min_size=1, max_size=12), max_size=5).map(tuple),
    data_pass=_cursor,
    shard_cursor=_cursor,
    record_cursor=_cursor,
)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner, max_size=3)
    ),
    max_leaves=10,
)


@given(positions)
def test_a_saved_position_reads_back_as_itself(position: InputPosition) -> None:
    assert InputPosition.from_json(json.loads(json.dumps(position.to_json()))) == position


@given(positions, st.sampled_from(sorted(InputPosition.__dataclass_fields__)), json_values)
def test_one_field_replaced_parses_or_is_refused_with_schema(
    position: InputPosition, field: str, value: object
) -> None:
    saved = {**position.to_json(), field: value}
    try:
        parsed = InputPosition.from_json(saved)
    except RejectedError as refused:
        assert (refused.object, refused.check) == ("input-position", "schema")
    else:
        assert parsed.to_json() == saved


@given(json_values)
def test_an_arbitrary_json_value_is_refused_with_schema(value: object) -> None:
    with pytest.raises(RejectedError) as refused:
        InputPosition.from_json(value)
    assert refused.value.check == "schema"


@pytest.mark.parametrize(
    ("field", "value"),
    [
        ("root", "sha256:" + "AB" * 32),
        ("root", DIGEST + "\n"),
        ("seed", True),
        ("seed", 1.0),
        ("shard_cursor", -1),
        ("record_cursor", "3"),
        ("shards", "s-0"),
        ("shards", [1]),
    ],
)
def test_near_misses_are_refused(field: str, value: object) -> None:
    saved = {**InputPosition(DIGEST, 1, ("s",)).to_json(), field: value}
    with pytest.raises(RejectedError) as refused:
        InputPosition.from_json(saved)
    assert refused.value.check == "schema"


def test_an_extra_or_missing_field_is_refused() -> None:
    saved = InputPosition(DIGEST, 1, ("s",)).to_json()
    for wrong in ({**saved, "extra": 1}, {k: v for k, v in saved.items() if k != "seed"}):
        with pytest.raises(RejectedError):
            InputPosition.from_json(wrong)
