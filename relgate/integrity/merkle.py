"""RFC 6962 / RFC 9162 Merkle trees over member tuples sorted by sampleId.

Leaf hash ``SHA-256(0x00 || tuple)``, node hash ``SHA-256(0x01 || left || right)``; the
empty tree hashes to ``SHA-256("")``.  Because leaves are sorted by sampleId, the absence
of an id is proven by the inclusion of its two neighbours at adjacent indices.

The verifier functions (:func:`verify_inclusion`, :func:`verify_non_inclusion`) follow
RFC 9162 section 2.1.3.2 directly and share no code with the tree builder, so a proof is
checked independently of how it was made.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from relgate.errors import IntegrityError
from relgate.integrity import kernel
from relgate.integrity.contract import JsonObject
from relgate.integrity.tuples import FIELDS, MemberTuple

_sha = hashlib.sha256
_HASH_BYTES = 32
#: A non-inclusion proof by two neighbours has exactly two leaves.
_NEIGHBOURS = 2


def leaf_hash(data: bytes) -> bytes:
    return _sha(b"\x00" + data).digest()


def node_hash(left: bytes, right: bytes) -> bytes:
    return _sha(b"\x01" + left + right).digest()


def _next_level(level: list[bytes]) -> list[bytes]:
    sha = _sha
    nxt = [sha(b"\x01" + level[i] + level[i + 1]).digest() for i in range(0, len(level) - 1, 2)]
    if len(level) % 2:
        # A lone right-most node is carried up unchanged: this is exactly RFC 6962's split
        # at the largest power of two below n.
        nxt.append(level[-1])
    return nxt


def root_from_leaf_hashes(leaves: list[bytes]) -> bytes:
    if not leaves:
        return _sha(b"").digest()
    level = leaves
    while len(level) > 1:
        level = _next_level(level)
    return level[0]


def root_from_packed_leaves(packed: bytes | bytearray | memoryview) -> bytes:
    """Root over leaf hashes packed 32 bytes each (see :func:`relgate.integrity.hashing.sha256_rows`)."""
    return kernel.merkle_root(packed)


#: Leaves per aligned subtree the accumulator reduces at once; a power of two.
ACCUMULATOR_CHUNK = 1 << 16


class MerkleAccumulator:
    """The RFC 6962 root over leaves added in order, in O(log n) memory.

    Leaves are reduced in aligned chunks of :data:`ACCUMULATOR_CHUNK`; the stack holds the
    roots of complete, aligned perfect subtrees with strictly decreasing sizes (a binary
    counter).  RFC 6962 splits ``n`` leaves at the largest power of two below ``n``, which is
    exactly the first stacked subtree, so :meth:`root` folds the stack right to left over
    the root of the partial tail.
    """

    def __init__(self) -> None:
        self._stack: list[tuple[int, bytes]] = []
        self._pending = bytearray()
        self.size = 0

    def add_packed_leaf_hashes(self, packed: bytes | bytearray | memoryview) -> None:
        if len(packed) % _HASH_BYTES:
            raise ValueError("packed leaf hashes are not a multiple of 32 bytes")
        self.size += len(packed) // _HASH_BYTES
        self._pending += packed
        chunk_bytes = ACCUMULATOR_CHUNK * _HASH_BYTES
        done = len(self._pending) - len(self._pending) % chunk_bytes
        for start in range(0, done, chunk_bytes):
            self._push(
                ACCUMULATOR_CHUNK, kernel.merkle_root(self._pending[start : start + chunk_bytes])
            )
        del self._pending[:done]

    def _push(self, size: int, node: bytes) -> None:
        while self._stack and self._stack[-1][0] == size:
            _, left = self._stack.pop()
            node, size = node_hash(left, node), 2 * size
        self._stack.append((size, node))

    def root(self) -> bytes:
        if self.size == 0:
            return _sha(b"").digest()
        nodes = [node for _, node in self._stack]
        if self._pending:
            nodes.append(kernel.merkle_root(self._pending))
        acc = nodes[-1]
        for left in reversed(nodes[:-1]):
            acc = node_hash(left, acc)
        return acc


class MerkleTree:
    """All levels in memory; used to produce proofs for a single snapshot on demand."""

    def __init__(self, encoded_leaves: Sequence[bytes]) -> None:
        self.size = len(encoded_leaves)
        level = [leaf_hash(e) for e in encoded_leaves]
        self.levels = [level]
        while len(level) > 1:
            level = _next_level(level)
            self.levels.append(level)

    @property
    def root(self) -> bytes:
        return self.levels[-1][0] if self.size else _sha(b"").digest()

    def audit_path(self, index: int) -> list[bytes]:
        if not 0 <= index < self.size:
            raise IndexError(index)
        path = []
        for level in self.levels[:-1]:
            sibling = index ^ 1
            if sibling < len(level):
                path.append(level[sibling])
            index //= 2
        return path


def verify_inclusion(
    leaf: bytes, index: int, size: int, path: Sequence[bytes], root: bytes
) -> bool:
    """RFC 9162 2.1.3.2: recompute the root from a leaf's audit path."""
    if index >= size or index < 0:
        return False
    fn, sn = index, size - 1
    r = leaf_hash(leaf)
    for p in path:
        if sn == 0:
            return False
        if fn & 1 or fn == sn:
            r = node_hash(p, r)
            if not fn & 1:
                while fn & 1 == 0 and fn != 0:
                    fn >>= 1
                    sn >>= 1
        else:
            r = node_hash(r, p)
        fn >>= 1
        sn >>= 1
    return sn == 0 and r == root


@dataclass(frozen=True)
class LeafProof:
    index: int
    tuple: MemberTuple
    path: list[bytes]

    def to_json(self) -> JsonObject:
        return {
            "index": self.index,
            "tuple": self.tuple.to_json(),
            "path": [p.hex() for p in self.path],
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> LeafProof:  # untyped proof JSON
        t = data["tuple"]
        return cls(
            index=int(data["index"]),
            tuple=MemberTuple(*(t[f] for f in FIELDS)),
            path=[bytes.fromhex(p) for p in data["path"]],
        )


def _root_bytes(root: str) -> bytes:
    if not root.startswith("sha256:"):
        raise IntegrityError(
            "root is not a sha256 digest", object="proof", check="root-syntax", digest=root
        )
    return bytes.fromhex(root[len("sha256:") :])


def check_proof(proof: Mapping[str, Any]) -> bool:  # noqa: PLR0911  # one return per proof shape
    """Verify a proof document printed by ``relgate prove`` (inclusion or non-inclusion)."""
    root = _root_bytes(proof["root"])
    size = int(proof["size"])
    sample = proof["sampleId"]
    leaves = [LeafProof.from_json(p) for p in proof.get("leaves", [])]
    for leaf in leaves:
        if not verify_inclusion(leaf.tuple.encode(), leaf.index, size, leaf.path, root):
            return False
    if proof["kind"] == "inclusion":
        return len(leaves) == 1 and leaves[0].tuple.sample_id == sample
    if proof["kind"] != "non-inclusion":
        return False
    if size == 0:
        return not leaves and root == _sha(b"").digest()
    if len(leaves) == _NEIGHBOURS:
        left, right = leaves
        return (
            right.index == left.index + 1 and left.tuple.sample_id < sample < right.tuple.sample_id
        )
    if len(leaves) == 1:
        only = leaves[0]
        if only.index == 0 and sample < only.tuple.sample_id:
            return True
        return only.index == size - 1 and sample > only.tuple.sample_id
    return False
