"""The daemons' garbage-collector policy (relgate_agent/gcpolicy.py): the option's parser
(hypothesis) and what applying it does to this process's collector (restored after)."""

from __future__ import annotations

import gc
from collections.abc import Iterator

import click
import pytest
from hypothesis import given
from hypothesis import strategies as st

from relgate_agent.gcpolicy import DAEMON_DEFAULT, PYTHON_DEFAULT, apply, parse_threshold


@given(st.tuples(*(st.integers(1, 10**9),) * 3))
def test_three_positive_integers_are_taken_as_written(t: tuple[int, int, int]) -> None:
    assert parse_threshold(",".join(map(str, t))) == t


@given(st.text(max_size=30))
def test_anything_else_is_a_usage_error_never_a_crash(text: str) -> None:
    try:
        got = parse_threshold(text)
    except click.BadParameter as exc:
        assert "GEN0,GEN1,GEN2" in str(exc)
        return
    assert got == PYTHON_DEFAULT or (len(got) == 3 and min(got) >= 1)


def test_the_named_values() -> None:
    assert parse_threshold("python") == PYTHON_DEFAULT
    assert parse_threshold(DAEMON_DEFAULT) == (10_000, 10, 100)
    for bad in ("1,2", "0,10,10", "-1,10,10", "a,b,c", "", "1,2,3,4"):
        with pytest.raises(click.BadParameter):
            parse_threshold(bad)


@pytest.fixture
def restored() -> Iterator[None]:
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_apply_sets_the_thresholds_and_freezes_the_heap(restored: None) -> None:
    alive = [object() for _ in range(10)]  # noqa: F841 - part of the heap that is frozen
    apply((12_345, 20, 30))
    assert gc.get_threshold() == (12_345, 20, 30)
    assert gc.get_freeze_count() > 1000  # the interpreter's own objects, at least
