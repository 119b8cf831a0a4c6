import json

import pytest
from hypothesis import given
from hypothesis import strategies as st

from relgate.errors import UsageError
from relgate.integrity.canonical import canonical_bytes, manifest_digest

keys = st.text(max_size=8)
scalars = (
    st.none() | st.booleans() | st.integers(min_value=-(2**53) + 1, max_value=2**53 - 1) | st.text()
)
json_values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(keys, inner, max_size=4),
    max_leaves=20,
)


@given(json_values)
def test_same_object_same_bytes(value):
    assert canonical_bytes(value) == canonical_bytes(json.loads(json.dumps(value)))


@given(st.dictionaries(keys, scalars, min_size=1, max_size=8))
def test_key_order_is_irrelevant(value):
    reordered = dict(reversed(list(value.items())))
    assert canonical_bytes(value) == canonical_bytes(reordered)


@given(st.text())
def test_unicode_escapes_are_irrelevant(text):
    escaped = json.dumps({"t": text}, ensure_ascii=True)
    raw = json.dumps({"t": text}, ensure_ascii=False)
    assert canonical_bytes(json.loads(escaped)) == canonical_bytes(json.loads(raw))


@given(json_values)
def test_canonical_bytes_round_trip(value):
    assert json.loads(canonical_bytes(value)) == value


def test_floats_are_refused_with_their_path():
    with pytest.raises(UsageError) as err:
        canonical_bytes({"members": {"ratio": 0.5}})
    assert err.value.check == "no-float"
    assert err.value.object == "$.members.ratio"


def test_digest_excludes_identity_signatures_and_transport():
    body = {"schema": "x", "count": 3}
    digest = manifest_digest(body)
    assert (
        manifest_digest(
            {**body, "snapshotId": digest, "signatures": [{"k": 1}], "transport": {"etag": "e"}}
        )
        == digest
    )
    assert manifest_digest({**body, "count": 4}) != digest
    assert digest.startswith("sha256:") and len(digest) == 71
