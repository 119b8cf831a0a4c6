"""A streaming RFC 6962 Merkle root: leaves added in order, O(log n) memory.

The root over n leaves is the fold, right to left, of the perfect subtrees of n's binary
decomposition.  Leaves are gathered into aligned chunks of :data:`CHUNK` (a power of
two); each full chunk's root goes onto a stack of perfect subtrees (equal heights merged
at once), and the partial last chunk is reduced level by level at the end.  The same
shape as the kernel's ``MerkleAccumulator`` (issue 10); this private copy goes when that
one is on main.
"""

from __future__ import annotations

import hashlib

import pyarrow as pa

from relgate.integrity.hashing import sha256_rows
from relgate.integrity.merkle import root_from_packed_leaves

_HASH = 32
#: Leaves per aligned chunk whose root is computed in one call; a power of two.
CHUNK = 1 << 16


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


class MerkleAccumulator:
    """The RFC 6962 root over every leaf added, in the order added."""

    def __init__(self) -> None:
        self._stack: list[tuple[int, bytes]] = []  # (leaves covered, subtree root)
        self._pending = bytearray()
        self.size = 0

    def add_packed_leaf_hashes(self, packed: bytes) -> None:
        """Leaf hashes (``SHA-256(0x00 || leaf)``) packed 32 bytes each."""
        self._pending += packed
        self.size += len(packed) // _HASH
        full = len(self._pending) // (CHUNK * _HASH) * (CHUNK * _HASH)
        view = memoryview(self._pending)
        for start in range(0, full, CHUNK * _HASH):
            self._push(CHUNK, root_from_packed_leaves(bytes(view[start : start + CHUNK * _HASH])))
        view.release()
        del self._pending[:full]

    def add_rows(self, rows: pa.Array | pa.ChunkedArray) -> None:
        """Rows as leaves (hashed with the 0x00 leaf prefix)."""
        self.add_packed_leaf_hashes(sha256_rows(rows, prefix=b"\x00"))

    def _push(self, width: int, root: bytes) -> None:
        while self._stack and self._stack[-1][0] == width:
            left = self._stack.pop()[1]
            root, width = _node(left, root), width * 2
        self._stack.append((width, root))

    def root(self) -> bytes:
        """The root over all leaves so far (``SHA-256("")`` for none)."""
        if not self._stack and not self._pending:
            return hashlib.sha256(b"").digest()
        subtrees = [r for _, r in self._stack]
        if self._pending:
            subtrees.append(root_from_packed_leaves(bytes(self._pending)))
        root = subtrees[-1]
        for left in reversed(subtrees[:-1]):
            root = _node(left, root)
        return root
