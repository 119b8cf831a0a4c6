"""The one digest spelling: what it produces and what it accepts."""

from __future__ import annotations

import hashlib

import pytest
from hypothesis import given
from hypothesis import strategies as st
from relgate_trust.digests import LENGTH, PREFIX, is_digest, sha256_digest, spelled

EMPTY = "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"


def test_the_spelling_of_a_known_digest() -> None:
    assert sha256_digest(b"") == EMPTY == spelled(hashlib.sha256(b"").hexdigest())
    assert PREFIX == "sha256:" and len(EMPTY) == LENGTH == 71


@given(st.binary(max_size=256))
def test_every_digest_spelled_here_is_a_digest(data: bytes) -> None:
    digest = sha256_digest(data)
    assert is_digest(digest) and digest == PREFIX + hashlib.sha256(data).hexdigest()


@pytest.mark.parametrize(
    "value",
    [
        EMPTY.upper(),  # uppercase hex (and prefix)
        "sha256:" + "E3" * 32,  # uppercase hex
        EMPTY[:-1],  # 63 hex
        EMPTY + "0",  # 65 hex
        EMPTY + "\n",  # a trailing newline
        "sha512:" + "0" * 64,
        "sha256:" + "g" * 64,
        "sha256:" + "_" * 64,
        "sha256:" + "0" * 32 + "_" * 32,
        EMPTY.removeprefix("sha256:"),
        "",
        None,
        7,
        b"sha256:" + b"0" * 64,
    ],
)
def test_what_is_not_a_digest(value: object) -> None:
    assert not is_digest(value)
