import pyarrow as pa
from hypothesis import given
from hypothesis import strategies as st

from relgate.integrity.hashing import length_prefixed
from relgate.integrity.tuples import MemberTuple, decode_tuple, encode_fields

tuples = st.tuples(*(st.text(max_size=12) for _ in range(6))).map(lambda v: MemberTuple(*v))


@given(tuples, tuples)
def test_encoding_is_injective(a, b):
    assert (a.encode() == b.encode()) == (a == b)


@given(tuples)
def test_decode_inverts_encode(t):
    assert decode_tuple(t.encode()) == t


def test_delimiter_collisions_cannot_happen():
    # Joined with "|" these two would both be "a|b|c|d|e|f|g"; length prefixes keep them apart.
    a = MemberTuple("a|b", "c", "d", "e", "f", "g")
    b = MemberTuple("a", "b|c", "d", "e", "f", "g")
    assert a.encode() != b.encode()


@given(st.lists(st.tuples(st.text(max_size=10), st.text(max_size=10)), max_size=20))
def test_columnar_encoding_matches_row_encoding(rows):
    left = pa.array([r[0] for r in rows], pa.string())
    right = pa.array([r[1] for r in rows], pa.string())
    encoded = length_prefixed(left, right).to_pylist() if rows else []
    assert encoded == [encode_fields(list(r)) for r in rows]


@given(tuples)
def test_contract_round_trip(t):
    assert MemberTuple.parse(t.to_json()) == t
    assert list(t.to_json()) == [
        "sampleId",
        "sourceId",
        "sourceVersion",
        "logicalContentDigest",
        "split",
        "schemaDigest",
    ]


@given(tuples, tuples)
def test_order_is_the_order_of_the_fields(a, b):
    assert (a < b) == (a.values() < b.values())
