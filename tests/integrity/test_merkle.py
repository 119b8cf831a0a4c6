import hashlib

import pyarrow as pa
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from relgate.integrity import hashing
from relgate.integrity.hashing import length_prefixed, sha256_rows
from relgate.integrity.merkle import MerkleTree, root_from_packed_leaves, verify_inclusion


def reference_mth(leaves):
    """RFC 6962 section 2.1, written straight from the definition."""
    n = len(leaves)
    if n == 0:
        return hashlib.sha256(b"").digest()
    if n == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1
    while k * 2 < n:
        k *= 2
    return hashlib.sha256(b"\x01" + reference_mth(leaves[:k]) + reference_mth(leaves[k:])).digest()


leaf_lists = st.lists(st.binary(max_size=16), max_size=40)


@given(leaf_lists)
def test_tree_root_matches_rfc6962_definition(leaves):
    assert MerkleTree(leaves).root == reference_mth(leaves)


@given(leaf_lists)
def test_packed_root_matches(leaves):
    packed = b"".join(hashlib.sha256(b"\x00" + leaf).digest() for leaf in leaves)
    assert root_from_packed_leaves(packed) == reference_mth(leaves)


@settings(max_examples=50)
@given(st.lists(st.binary(max_size=8), min_size=1, max_size=40), st.data())
def test_every_inclusion_proof_verifies_and_tampering_fails(leaves, data):
    tree = MerkleTree(leaves)
    index = data.draw(st.integers(min_value=0, max_value=len(leaves) - 1))
    path = tree.audit_path(index)
    assert verify_inclusion(leaves[index], index, len(leaves), path, tree.root)
    assert not verify_inclusion(leaves[index] + b"x", index, len(leaves), path, tree.root)
    if len(leaves) > 1:
        assert (
            not verify_inclusion(
                leaves[index], (index + 1) % len(leaves), len(leaves), path, tree.root
            )
            or leaves[index] == leaves[(index + 1) % len(leaves)]
        )
    if path:
        bad = [bytes(32), *path[1:]]
        assert not verify_inclusion(leaves[index], index, len(leaves), bad, tree.root)


def test_parallel_leaf_hashing_equals_serial(monkeypatch):

    ids = pa.array([f"s{i:07d}" for i in range(5000)])
    encoded = length_prefixed(ids, ids)
    monkeypatch.setattr(hashing, "PARALLEL_THRESHOLD", 10)
    monkeypatch.setenv("RELGATE_HASH_WORKERS", "2")
    parallel = sha256_rows(encoded, b"\x00")
    monkeypatch.setenv("RELGATE_HASH_WORKERS", "1")
    serial = sha256_rows(encoded, b"\x00")
    assert parallel == serial
    assert serial[:32] == hashlib.sha256(b"\x00" + encoded[0].as_py()).digest()


def test_out_of_range_index_is_not_a_proof():
    tree = MerkleTree([b"a", b"b"])
    with pytest.raises(IndexError):
        tree.audit_path(2)
    assert not verify_inclusion(b"a", 2, 2, [], tree.root)


@settings(max_examples=25, deadline=None)
@given(st.integers(min_value=0, max_value=600), st.sampled_from([1, 2, 4, 64]))
def test_chunked_parallel_root_equals_definition(n, chunk):

    leaves = [f"leaf-{i}".encode() for i in range(n)]
    arr = pa.array(leaves, pa.binary())
    old = (hashing.MERKLE_CHUNK, hashing.PARALLEL_THRESHOLD)
    try:
        hashing.MERKLE_CHUNK, hashing.PARALLEL_THRESHOLD = chunk, 50
        assert hashing.merkle_root_rows(arr) == reference_mth(leaves)
    finally:
        hashing.MERKLE_CHUNK, hashing.PARALLEL_THRESHOLD = old
