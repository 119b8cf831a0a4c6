"""Placement re-verification, scrub and the shared tree walker, on real files (no processes)."""

from __future__ import annotations

import hashlib
import os
import stat
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from relgate_trust.errors import ManifestError
from relgate_trust.fstree import UnsafePathError, walk_checkpoint_tree
from relgate_trust.manifest import CheckpointManifest, build_manifest

from relgate_agent.errors import StorageError
from relgate_agent.staging.storage import (
    StagedMismatch,
    VersionStore,
    read_placed_envelope,
    read_placed_marker,
    scan_chunks,
    scrub_placed,
    unplace,
)

KiB = 1024
SIZES = {"a.json": 700, "b/w1.bin": 150 * KiB + 3, "b/w2.bin": 90 * KiB}


def _src(root: Path, sizes: dict[str, int] = SIZES, seed: int = 3) -> Path:
    import random

    rng = random.Random(seed)
    for rel, n in sizes.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(rng.randbytes(n))
    return root


def _manifest(src: Path) -> CheckpointManifest:
    return build_manifest(src, "m", "v1", chunk_size=64 * KiB, block_size=16 * KiB)


def _staged(tmp: Path) -> tuple[VersionStore, CheckpointManifest, Path]:
    src = _src(tmp / "src")
    m = _manifest(src)
    store = VersionStore(tmp / "models", m)
    store.open()
    data = b"".join((src / f.path).read_bytes() for f in m.files)
    store.pwrite(0, data)
    return store, m, src


def _flip(path: Path, offset: int) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.pwrite(fd, bytes([os.pread(fd, 1, offset)[0] ^ 1]), offset)
    finally:
        os.close(fd)


def _where(m: CheckpointManifest, pos: int) -> tuple[str, int]:
    f, foff, _, _ = m.segments(pos, 1)[0]
    return f.path, foff


def _tree_digests(root: Path) -> dict[str, str]:
    return {
        p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def test_place_verifies_fsyncs_and_renames_with_marker(tmp_path: Path) -> None:
    store, m, src = _staged(tmp_path)
    final = store.place(b'{"envelope": 1}')
    assert final == tmp_path / "models" / "m" / "v1" and store.placed
    assert _tree_digests(final) == _tree_digests(src)
    assert read_placed_marker(tmp_path / "models", "m", "v1") == m.digest
    assert read_placed_envelope(tmp_path / "models", "m", "v1") == b'{"envelope": 1}'
    assert not store.staging_dir.exists()
    assert store.place() == final  # idempotent


@pytest.mark.parametrize("positions", [[0], [64 * KiB - 1], [64 * KiB, 200 * KiB], [700]])
def test_flip_in_staging_is_never_placed(tmp_path: Path, positions: list[int]) -> None:
    store, m, _ = _staged(tmp_path)
    for pos in positions:
        rel, off = _where(m, pos)
        _flip(store.tree / rel, off)
    with pytest.raises(StagedMismatch) as info:
        store.place()
    assert info.value.chunks == sorted({p // m.chunk_size for p in positions})
    assert not store.final.exists() and not store.placed
    assert read_placed_marker(tmp_path / "models", "m", "v1") is None
    assert store.tree.is_dir()  # staging kept for the re-fetch


def test_extra_replaced_and_truncated_files_are_refused(tmp_path: Path) -> None:
    store, _m, _ = _staged(tmp_path)
    (store.tree / "b" / "extra.bin").write_bytes(b"x")
    with pytest.raises(UnsafePathError) as info:
        store.place()
    assert info.value.check == "unexpected-entry" and info.value.path.endswith("b/extra.bin")
    (store.tree / "b" / "extra.bin").unlink()
    # same bytes, another inode with a *higher* number (swapped in behind the agent's back;
    # the next test swaps in a lower one)
    p = store.tree / "a.json"
    staged_ino = os.stat(p).st_ino
    for i in range(1000):
        swap = store.tree / f".swap{i}"
        swap.write_bytes(p.read_bytes())
        if os.stat(swap).st_ino > staged_ino:
            break
    os.replace(swap, p)
    for extra in store.tree.glob(".swap*"):
        extra.unlink()
    with pytest.raises(UnsafePathError) as info:
        store.place()
    assert info.value.check == "replaced-file"
    assert not store.final.exists()


def test_file_swapped_in_from_an_older_inode_is_refused(tmp_path: Path) -> None:
    src = _src(tmp_path / "src")
    m = _manifest(src)
    # allocated before the staged file, in the same directory: inode numbers are mostly
    # handed out in order, but a file system may recycle one (tmpfs under parallel tests),
    # so several candidates, and the lowest is the one swapped in
    tree = tmp_path / "models" / ".staging" / "m" / "v1" / "tree"
    tree.mkdir(parents=True)
    for i in range(16):
        (tree / f".older{i}").write_bytes((src / "a.json").read_bytes())
    store = VersionStore(tmp_path / "models", m)
    store.open()
    store.pwrite(0, b"".join((src / f.path).read_bytes() for f in m.files))
    older = min(tree.glob(".older*"), key=lambda q: os.stat(q).st_ino)
    assert os.stat(older).st_ino < os.stat(store.tree / "a.json").st_ino
    os.replace(older, store.tree / "a.json")
    for extra in tree.glob(".older*"):
        extra.unlink()
    with pytest.raises(UnsafePathError) as info:
        store.place()
    assert info.value.check == "replaced-file" and not store.final.exists()


def test_no_follow_helpers_refuse_symlinked_components(tmp_path: Path) -> None:
    from relgate_trust.fstree import mkdirs_beneath, open_beneath, open_dir, open_dirs_beneath

    base = tmp_path / "base"
    (base / "real").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (base / "link").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    (base / "real" / "f").write_bytes(b"x")
    (base / "real" / "notdir").write_bytes(b"x")
    fd = open_dir(base)
    try:
        for call in (
            lambda: mkdirs_beneath(fd, base, ["link", "x"]),
            lambda: open_dirs_beneath(fd, base, ["link"]),
            lambda: open_beneath(fd, base, "link/f", os.O_RDONLY),
            lambda: open_beneath(fd, base, "link/new", os.O_RDWR | os.O_CREAT, create_dirs=True),
        ):
            with pytest.raises(UnsafePathError) as info:
                call()
            assert info.value.check == "symlink" and info.value.path == str(base / "link")
        with pytest.raises(UnsafePathError) as info:
            open_dirs_beneath(fd, base, ["real", "notdir"])
        assert info.value.check == "not-regular-file"
        with pytest.raises(FileNotFoundError):
            open_dirs_beneath(fd, base, ["missing"])
        ok = open_beneath(fd, base, "real/f", os.O_RDONLY)
        assert os.read(ok, 10) == b"x" and os.get_blocking(ok)
        os.close(ok)
        made = mkdirs_beneath(fd, base, ["real", "a", "b"])
        os.close(made)
        assert (base / "real" / "a" / "b").is_dir()
    finally:
        os.close(fd)
    assert list((tmp_path / "elsewhere").iterdir()) == []


def test_truncated_staged_file_is_refused(tmp_path: Path) -> None:
    store, _m, _ = _staged(tmp_path)
    os.truncate(store.tree / "b" / "w2.bin", 10)
    with pytest.raises(StorageError, match="bytes, manifest says"):
        store.place()
    assert not store.final.exists()


def test_symlinked_model_dir_planted_before_placement_is_not_followed(tmp_path: Path) -> None:
    store, _m, _ = _staged(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "models" / "m").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError) as info:
        store.place()
    assert info.value.check == "symlink" and info.value.path == str(tmp_path / "models" / "m")
    assert list(outside.iterdir()) == []


def test_symlinked_marker_dir_is_not_followed(tmp_path: Path) -> None:
    store, _m, _ = _staged(tmp_path)
    outside = tmp_path / "outside"
    outside.mkdir()
    (tmp_path / "models" / ".placed").mkdir()
    (tmp_path / "models" / ".placed" / "m").symlink_to(outside, target_is_directory=True)
    with pytest.raises(UnsafePathError):
        store.place()
    assert list(outside.iterdir()) == [] and not store.final.exists()


def test_symlink_in_staging_tree_refused_at_open(tmp_path: Path) -> None:
    src = _src(tmp_path / "src")
    m = _manifest(src)
    secret = tmp_path / "secret"
    secret.write_text("keep")
    tree = tmp_path / "models" / ".staging" / "m" / "v1" / "tree"
    (tree / "b").mkdir(parents=True)
    (tree / "b" / "w1.bin").symlink_to(secret)
    store = VersionStore(tmp_path / "models", m)
    with pytest.raises(UnsafePathError) as info:
        store.open()
    assert info.value.check == "symlink" and info.value.path.endswith("b/w1.bin")
    assert secret.read_text() == "keep"
    store.close()


def test_fifo_in_staging_tree_refused_without_blocking(tmp_path: Path) -> None:
    src = _src(tmp_path / "src")
    m = _manifest(src)
    tree = tmp_path / "models" / ".staging" / "m" / "v1" / "tree"
    tree.mkdir(parents=True)
    os.mkfifo(tree / "a.json")
    store = VersionStore(tmp_path / "models", m)
    with pytest.raises(UnsafePathError) as info:
        store.open()
    assert info.value.check == "fifo"
    store.close()


def test_scrub_placed_names_chunk_files_and_digests_then_unplace(tmp_path: Path) -> None:
    store, m, _ = _staged(tmp_path)
    final = store.place(b"{}")
    store.close()
    root = tmp_path / "models"
    ok = scrub_placed(root, m)
    assert ok.intact and ok.chunks == m.num_chunks and ok.manifest_digest == m.digest
    # chunk 0 spans a.json and b/w1.bin; flip a byte of chunk 0 and one of chunk 3
    rel, off = _where(m, 5000)
    _flip(final / rel, off)
    rel3, off3 = _where(m, 3 * 64 * KiB + 10)
    _flip(final / rel3, off3)
    bad = scrub_placed(root, m)
    assert not bad.intact and bad.bad_chunks == (0, 3)
    assert bad.files_of_first_bad == ("a.json", "b/w1.bin")
    assert bad.expected_digest == m.chunks[0].digest
    c = m.chunks[0]
    data = b"".join((final / f.path).read_bytes() for f in m.files)[c.offset : c.offset + c.size]
    assert bad.actual_digest == "sha256:" + hashlib.sha256(data).hexdigest()
    unplace(root, "m", "v1")
    assert not final.exists() and read_placed_marker(root, "m", "v1") is None
    assert read_placed_envelope(root, "m", "v1") is None
    assert not VersionStore.is_placed(root, "m", "v1")


def test_scrub_refuses_extra_missing_and_symlinked_files(tmp_path: Path) -> None:
    store, m, _ = _staged(tmp_path)
    final = store.place()
    store.close()
    root = tmp_path / "models"
    (final / "zz.bin").write_bytes(b"")
    with pytest.raises(UnsafePathError) as info:
        scrub_placed(root, m)
    assert info.value.check == "unexpected-entry"
    (final / "zz.bin").unlink()
    os.rename(final / "a.json", tmp_path / "a.json")
    (final / "a.json").symlink_to(tmp_path / "a.json")
    with pytest.raises(UnsafePathError) as info:
        scrub_placed(root, m)
    assert info.value.check == "symlink"
    (final / "a.json").unlink()
    with pytest.raises(UnsafePathError) as info:
        scrub_placed(root, m)
    assert info.value.check == "missing-file"
    os.rename(tmp_path / "a.json", final / "a.json")
    size = (final / "a.json").stat().st_size
    for wrong in (1, size + 1):  # shorter or longer than the manifest says
        os.truncate(final / "a.json", wrong)
        with pytest.raises(UnsafePathError) as info:
            scrub_placed(root, m)
        assert info.value.check == "file-size"
    unplace(root, "m", "v1")
    with pytest.raises(UnsafePathError) as info:
        scrub_placed(root, m)
    assert info.value.check == "not-placed"


def test_symlinked_version_is_not_placed(tmp_path: Path) -> None:
    root = tmp_path / "models"
    (root / "m").mkdir(parents=True)
    (tmp_path / "elsewhere").mkdir()
    (root / "m" / "v1").symlink_to(tmp_path / "elsewhere", target_is_directory=True)
    assert not VersionStore.is_placed(root, "m", "v1")
    with pytest.raises(UnsafePathError):
        scrub_placed(root, _manifest(_src(tmp_path / "src")))


# ---------------------------------------------------------------------------- the walker


def test_walker_lists_regular_files_sorted(tmp_path: Path) -> None:
    src = _src(tmp_path / "src")
    files = walk_checkpoint_tree(src)
    assert [f.rel for f in files] == sorted(SIZES)
    assert [f.size for f in files] == [SIZES[r] for r in sorted(SIZES)]


@pytest.mark.parametrize("kind", ["symlink", "dir-symlink", "fifo", "socket", "device", "hard"])
def test_walker_refuses(tmp_path: Path, kind: str) -> None:
    import socket

    src = _src(tmp_path / "src")
    target = src / "b" / "planted"
    outside = tmp_path / "outside.txt"
    outside.write_text("x")
    expected = {
        "symlink": "symlink",
        "dir-symlink": "symlink",
        "fifo": "fifo",
        "socket": "socket",
        "device": "device",
        "hard": "hard-link",
    }[kind]
    if kind == "symlink":
        target.symlink_to(outside)
    elif kind == "dir-symlink":
        target.symlink_to(tmp_path, target_is_directory=True)
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "socket":
        s = socket.socket(socket.AF_UNIX)
        s.bind(str(target))
        s.close()
    elif kind == "device":
        if os.geteuid() != 0:
            pytest.skip("needs root")
        os.mknod(target, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
    else:
        os.link(outside, target)
        assert len(walk_checkpoint_tree(src)) == len(SIZES) + 1  # allowed by default
    with pytest.raises(UnsafePathError) as info:
        walk_checkpoint_tree(src, allow_hard_links=False)
    assert info.value.check == expected and info.value.path == str(target)
    if kind != "hard":
        with pytest.raises(ManifestError):  # the manifest builder uses the same walker
            _manifest(src)


def test_walker_refuses_a_missing_root_and_a_file_root(tmp_path: Path) -> None:
    with pytest.raises(UnsafePathError) as info:
        walk_checkpoint_tree(tmp_path / "missing")
    assert info.value.check == "not-regular-file"
    (tmp_path / "f").write_bytes(b"")
    with pytest.raises(UnsafePathError, match="is not a directory"):
        walk_checkpoint_tree(tmp_path / "f")


def test_walker_refuses_a_mount_inside_the_tree(tmp_path: Path) -> None:
    import subprocess

    src = _src(tmp_path / "src")
    mnt = src / "b" / "mnt"
    mnt.mkdir()
    if os.geteuid() != 0 or subprocess.run(["mount", "-t", "tmpfs", "none", str(mnt)]).returncode:
        pytest.skip("mounting a tmpfs needs root")
    try:
        (mnt / "x.bin").write_bytes(b"from another filesystem")
        with pytest.raises(UnsafePathError) as info:
            walk_checkpoint_tree(src)
        assert info.value.check == "outside-directory" and info.value.path == str(mnt)
    finally:
        subprocess.run(["umount", str(mnt)], check=True)


def test_walker_refuses_unsafe_names(tmp_path: Path) -> None:
    src = _src(tmp_path / "src")
    (src / "bad\nname").write_bytes(b"")
    with pytest.raises(UnsafePathError) as info:
        walk_checkpoint_tree(src)
    assert info.value.check == "unsafe-name"


@settings(max_examples=40, deadline=None)
@given(
    sizes=st.lists(st.integers(min_value=0, max_value=5000), min_size=1, max_size=4),
    chunk_blocks=st.integers(min_value=1, max_value=4),
    block=st.sampled_from([16, 64, 256]),
    read_size=st.integers(min_value=1, max_value=700),
    flips=st.lists(st.integers(min_value=0), max_size=3),
    workers=st.sampled_from([1, 3]),
)
def test_scan_chunks_finds_exactly_the_flipped_chunks(
    sizes: list[int], chunk_blocks: int, block: int, read_size: int, flips: list[int], workers: int
) -> None:
    with tempfile.TemporaryDirectory() as d:
        src = _src(Path(d) / "src", {f"f{i}.bin": n for i, n in enumerate(sizes)}, seed=len(sizes))
        m = build_manifest(src, "m", "v", chunk_size=block * chunk_blocks, block_size=block)
        fds = {f.path: os.open(src / f.path, os.O_RDWR) for f in m.files}
        try:
            assert scan_chunks(m, fds, read_size, workers) == []
            if m.total_size == 0:
                return
            positions = {p % m.total_size for p in flips}
            for pos in positions:
                f, foff, _, _ = m.segments(pos, 1)[0]
                os.pwrite(fds[f.path], bytes([os.pread(fds[f.path], 1, foff)[0] ^ 0x80]), foff)
            want = sorted({p // m.chunk_size for p in positions})
            assert scan_chunks(m, fds, read_size, workers) == want
        finally:
            for fd in fds.values():
                os.close(fd)


def test_place_never_replaces_an_existing_final_directory(tmp_path: Path) -> None:
    store, _m, _ = _staged(tmp_path)
    store.final.mkdir(parents=True)  # appeared after staging began (empty: rename would eat it)
    with pytest.raises(UnsafePathError) as info:
        store.place()
    assert info.value.check == "unexpected-entry" and "already exists" in str(info.value)
    assert store.tree.is_dir() and list(store.final.iterdir()) == []


def test_a_quarantined_host_re_verifies_every_held_version(tmp_path: Path, keypair) -> None:
    """What a quarantined host runs (the ``verify`` command's procedure, over all it holds):
    an intact version stays placed, a rotten one is un-placed naming chunk and file."""
    from relgate_trust.manifest import TrustedKeys, envelope_bytes, sign_manifest

    from relgate_agent.staging.reverify import reverify_all

    key, _, trusted = keypair
    src = _src(tmp_path / "src")
    root = tmp_path / "models"
    for version in ("v1", "v2"):
        m = build_manifest(src, "m", version, chunk_size=64 * KiB, block_size=16 * KiB)
        store = VersionStore(root, m)
        store.open()
        store.pwrite(0, b"".join((src / f.path).read_bytes() for f in m.files))
        store.place(envelope_bytes(sign_manifest(m, key)))
        store.close()
    rel, off = _where(m, 3 * 64 * KiB + 5)  # chunk 3 of v2
    _flip(root / "m" / "v2" / rel, off)
    intact, rotten = reverify_all(root, TrustedKeys.load(trusted))
    assert (intact.obj, intact.intact) == ("m/v1", True)
    assert (rotten.obj, rotten.intact, rotten.check) == ("m/v2", False, "chunk-digest")
    assert rotten.details["chunk"] == 3 and rotten.details["file"] == rel
    assert rotten.details["unplaced"] is True and rotten.summary() == "m/v2 chunk-digest (unplaced)"
    assert (root / "m" / "v1").is_dir() and not (root / "m" / "v2").exists()
    assert read_placed_marker(root, "m", "v2") is None
