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


def root_hex(encoded_leaves: Sequence[bytes]) -> str:
    sha = _sha
    return (
        "sha256:" + root_from_leaf_hashes([sha(b"\x00" + e).digest() for e in encoded_leaves]).hex()
    )


def _pair_level(level: bytes) -> bytes:
    """One level up, on a packed buffer of 32-byte hashes (odd last node carried up)."""
    sha = _sha
    view = memoryview(level)
    n = len(level) // 32
    out = bytearray()
    for i in range(0, (n - 1) * 32, 64):
        h = sha(b"\x01")
        h.update(view[i : i + 64])
        out += h.digest()
    if n % 2:
        out += view[(n - 1) * 32 :]
    return bytes(out)


def root_from_packed_leaves(packed: bytes) -> bytes:
    """Root over leaf hashes packed 32 bytes each (see :func:`relgate.integrity.hashing.sha256_rows`)."""
    if not packed:
        return _sha(b"").digest()
    level = packed
    while len(level) > _HASH_BYTES:
        level = _pair_level(level)
    return level


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
