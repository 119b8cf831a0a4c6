from __future__ import annotations

import os
import time
from pathlib import Path

from relgate_trust.manifest import chunk_digest

from relgate_agent.agent.stripes import ChunkHashes
from relgate_agent.staging.storage import (
    Journal,
    JournalState,
    VersionStore,
    bitmap_from_bits,
    bits_from_bitmap,
    gc_versions,
    held_versions,
)


def test_bitmap_roundtrip() -> None:
    bits = bytearray([1, 0, 0, 1, 1, 0, 1, 0, 1, 1])
    assert bits_from_bitmap(bitmap_from_bits(bits), len(bits)) == bits
    assert bitmap_from_bits(bytearray([1] + [0] * 7 + [1])) == b"\x01\x01"


def test_journal_ignores_torn_or_foreign(tmp_path: Path, checkpoint) -> None:
    m = checkpoint["manifest"]
    j = Journal(tmp_path / "journal")
    assert j.load(m) is None
    j.save(JournalState(m.digest, {0, 3, 5}, [1, 2]), m.num_chunks)
    st = j.load(m)
    assert st is not None and st.verified == {0, 3, 5}
    (tmp_path / "journal").write_bytes(b'{"format": 1, "manifestDigest": "sha')  # torn write
    assert j.load(m) is None
    j.save(JournalState("sha256:" + "0" * 64, {1}, []), m.num_chunks)  # another manifest
    assert j.load(m) is None


def test_staging_pwrite_across_files_and_atomic_place(tmp_path: Path, checkpoint) -> None:
    m = checkpoint["manifest"]
    src = checkpoint["origin"]
    data = b"".join((src / f.path).read_bytes() for f in m.files)
    store = VersionStore(tmp_path / "models", m)
    store.open()
    # write in reverse block order: offsets, not arrival order, decide placement
    for b in reversed(range(m.num_blocks)):
        off, n = m.block_range(b)
        store.pwrite(off, data[off : off + n])
    assert all(store.chunk_matches(c) for c in range(m.num_chunks))
    assert not store.final.exists()
    assert not store.placed_marker_matches()
    final = store.place()
    assert final == tmp_path / "models" / m.model / m.version
    assert store.placed_marker_matches()
    assert not (final / ".relgate").exists() and sorted(p.name for p in final.iterdir()) == sorted(
        f.path.split("/")[0] for f in m.files
    )
    assert not store.staging_dir.exists()
    for f in m.files:
        assert (final / f.path).read_bytes() == (src / f.path).read_bytes()
    # descriptors stay valid across the rename: the data plane keeps serving the placed copy
    assert store.pread(0, 100) == data[:100]
    store.close()
    assert held_versions(tmp_path / "models") == [f"{m.model}/{m.version}"]


def test_retention_keeps_current_and_previous(tmp_path: Path) -> None:
    base = tmp_path / "models" / "claude-x"
    for i, v in enumerate(["v1", "v2", "v3", "v4"]):
        (base / v).mkdir(parents=True)
        (base / v / "w.bin").write_bytes(b"x")
        t = time.time() - 100 + i
        os.utime(base / v, (t, t))
    removed = gc_versions(tmp_path / "models", "claude-x", keep=2, protect={"v4"})
    assert sorted(removed) == ["v1", "v2"]
    assert sorted(p.name for p in base.iterdir()) == ["v3", "v4"]
    # a protected (in-use) version survives even when it is old
    os.utime(base / "v4", (0, 0))
    assert gc_versions(tmp_path / "models", "claude-x", keep=1, protect={"v4"}) == []


def _chunk_data(checkpoint) -> tuple[object, bytes]:
    m = checkpoint["manifest"]
    src = checkpoint["origin"]
    return m, b"".join((src / f.path).read_bytes() for f in m.files)


def test_incremental_chunk_hash_equals_reread_hash(tmp_path: Path, checkpoint) -> None:
    m, data = _chunk_data(checkpoint)
    hashes = ChunkHashes(m)
    store = VersionStore(tmp_path / "models", m)
    store.open()
    for c in range(m.num_chunks):
        for b in m.chunk_blocks(c):
            off, n = m.block_range(b)
            store.pwrite(off, data[off : off + n])
            hashes.feed(c, b, data[off : off + n])
        got = hashes.digest(c)
        assert got == m.chunks[c].digest
        c0 = m.chunks[c]
        assert got == chunk_digest(store.pread(c0.offset, c0.size)) and store.chunk_matches(c)
    assert hashes.rereads == 0
    store.close()


def test_resumed_or_out_of_order_chunk_falls_back_to_reread(checkpoint) -> None:
    m, data = _chunk_data(checkpoint)
    blocks = list(m.chunk_blocks(0))
    assert len(blocks) >= 3
    hashes = ChunkHashes(m)
    for b in blocks[1:]:  # resumed mid-chunk: the first block came before a restart
        off, n = m.block_range(b)
        hashes.feed(0, b, data[off : off + n])
    assert hashes.digest(0) is None
    order = [blocks[0], blocks[2], blocks[1], *blocks[3:]]  # out of order
    for b in order:
        off, n = m.block_range(b)
        hashes.feed(0, b, data[off : off + n])
    assert hashes.digest(0) is None
    assert hashes.rereads == 2
    # a restart from the chunk's first block hashes it afresh
    for b in [blocks[0], blocks[1], blocks[0], *blocks[1:]]:
        off, n = m.block_range(b)
        hashes.feed(0, b, data[off : off + n])
    assert hashes.digest(0) == m.chunks[0].digest


def test_incremental_hash_catches_a_corrupted_block(checkpoint) -> None:
    m, data = _chunk_data(checkpoint)
    hashes = ChunkHashes(m)
    blocks = list(m.chunk_blocks(1))
    for b in blocks:
        off, n = m.block_range(b)
        chunk = bytearray(data[off : off + n])
        if b == blocks[-1]:
            chunk[7] ^= 0x01
        hashes.feed(1, b, bytes(chunk))
    got = hashes.digest(1)
    assert got is not None and got != m.chunks[1].digest


def test_a_chunk_asked_for_before_its_last_block_is_reread_not_failed(checkpoint) -> None:
    """An in-order prefix is not the chunk: digest() says "re-read" (None), never a digest
    of the blocks so far (which would fail a good chunk as corrupt)."""
    m, data = _chunk_data(checkpoint)
    blocks = list(m.chunk_blocks(0))
    hashes = ChunkHashes(m)
    for b in blocks[:-1]:
        off, n = m.block_range(b)
        hashes.feed(0, b, data[off : off + n])
    assert hashes.digest(0) is None and hashes.rereads == 1
