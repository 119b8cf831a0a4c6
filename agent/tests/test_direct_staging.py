"""``--staging-io direct``: staging files written and re-read with O_DIRECT through aligned
buffers, on a real ext4 directory.  Writes at any offset and length land byte for byte (whole
pages directly, partial pages through the page cache), reads cover pages and keep the asked
bytes, the store stages, verifies and places a checkpoint across file boundaries exactly as
the buffered store does, and a models root on tmpfs is refused before anything is staged."""

from __future__ import annotations

import fcntl
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from agent_harness import HOSTS, assert_placed, job_spec

from relgate_agent.cli.config import AgentFileConfig
from relgate_agent.staging import direct
from relgate_agent.staging.storage import VersionStore


def _supported(path: Path) -> None:
    try:
        direct.probe(path)
    except direct.DirectUnsupported:
        pytest.skip(f"{path} is on a file system without O_DIRECT")


@pytest.fixture
def dio_file(tmp_path: Path):
    _supported(tmp_path)
    path = tmp_path / "f.bin"
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    dfd = direct.reopen_direct(fd, writable=True)
    yield fd, dfd, path
    os.close(dfd)
    os.close(fd)


def test_the_direct_descriptor_has_o_direct(dio_file) -> None:
    fd, dfd, _ = dio_file
    assert fcntl.fcntl(dfd, fcntl.F_GETFL) & os.O_DIRECT
    assert not fcntl.fcntl(fd, fcntl.F_GETFL) & os.O_DIRECT


@pytest.mark.parametrize(
    ("offset", "length"),
    [
        (0, 4096),  # one whole page
        (0, 3 * 4096 + 17),  # whole pages and a tail
        (100, 4000),  # inside one page: no whole page
        (4095, 2),  # across a page boundary, no whole page
        (1, 5 * 4096),  # a head, whole pages, a tail
        (8192, 20_000),  # aligned start, several buffers' worth with the small buffer
    ],
)
def test_writes_at_any_offset_land_byte_for_byte(dio_file, offset: int, length: int) -> None:
    fd, dfd, path = dio_file
    size = 40_000
    os.ftruncate(fd, size)
    rng = random.Random(offset * 7 + length)
    base = rng.randbytes(size)
    os.pwrite(fd, base, 0)
    data = rng.randbytes(length)
    io = direct.DirectIO(buffer_bytes=2 * direct.ALIGN)  # several buffers per call
    try:
        assert io.write(dfd, fd, memoryview(data), offset) == length
        os.fsync(fd)
        on_disk = path.read_bytes()
        assert on_disk[offset : offset + length] == data
        assert on_disk[:offset] == base[:offset]
        assert on_disk[offset + length :] == base[offset + length :]
        # reads: any range, through the direct descriptor
        for lo, n in ((offset, length), (0, 10), (4090, 20), (size - 5, 5), (size - 5, 50)):
            assert io.read(dfd, lo, n) == on_disk[lo : lo + n]
    finally:
        io.close()


@pytest.mark.parametrize(
    ("offset", "length"), [(0, 4096), (1, 5 * 4096), (4095, 2), (8192, 20_000), (100, 9000)]
)
def test_whole_pages_go_direct_and_partial_pages_through_the_cache(
    dio_file, offset: int, length: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The routing itself (bytes alone would not show a mode that quietly went buffered):
    the direct descriptor gets exactly the whole pages, at aligned offsets in aligned
    lengths; the buffered one gets the rest."""
    fd, dfd, _ = dio_file
    os.ftruncate(fd, 64 * 1024)
    calls: list[tuple[int, int, int]] = []
    real = os.pwrite

    def spy(target: int, data: object, at: int) -> int:
        n = real(target, data, at)  # type: ignore[arg-type]
        calls.append((target, n, at))
        return n

    monkeypatch.setattr(direct.os, "pwrite", spy)
    io = direct.DirectIO(buffer_bytes=2 * direct.ALIGN)
    try:
        assert io.write(dfd, fd, memoryview(bytes(length)), offset) == length
    finally:
        io.close()
    lo = -(-offset // 4096) * 4096
    hi = (offset + length) // 4096 * 4096
    body = max(0, hi - lo)
    to_direct = [(n, at) for target, n, at in calls if target == dfd]
    assert sum(n for n, _ in to_direct) == body
    assert all(at % 4096 == 0 and n % 4096 == 0 for n, at in to_direct)
    assert sum(n for target, n, _ in calls if target == fd) == length - body


def test_a_short_direct_write_is_reported_short(dio_file, monkeypatch: pytest.MonkeyPatch) -> None:
    """A full disk writes short: the caller sees fewer bytes than it gave (and the store
    turns that into NoSpace), never a silent success."""
    fd, dfd, _ = dio_file
    real = os.pwrite

    def short(target: int, data: memoryview, at: int) -> int:
        if target == dfd:
            return real(target, data[: direct.ALIGN], at)
        return real(target, data, at)

    monkeypatch.setattr(direct.os, "pwrite", short)
    io = direct.DirectIO(buffer_bytes=4 * direct.ALIGN)
    try:
        assert io.write(dfd, fd, memoryview(bytes(8 * direct.ALIGN)), 0) == direct.ALIGN
    finally:
        io.close()


def test_a_descriptor_that_is_gone_is_an_os_error_not_a_refusal(tmp_path: Path) -> None:
    """Only EINVAL means "no O_DIRECT here"; any other failure stays what it is."""
    fd = os.open(tmp_path / "x", os.O_RDWR | os.O_CREAT, 0o600)
    os.close(fd)
    with pytest.raises(OSError) as failed:
        direct.reopen_direct(fd, writable=True)
    assert not isinstance(failed.value, direct.DirectUnsupported)


def test_concurrent_calls_share_a_bounded_set_of_buffers(dio_file) -> None:
    """However many threads serve peers, a store holds at most ``buffers`` aligned
    buffers; the calls beyond wait for one and still read the right bytes."""
    fd, dfd, _ = dio_file
    data = random.Random(5).randbytes(64 * direct.ALIGN)
    os.pwrite(fd, data, 0)
    io = direct.DirectIO(buffer_bytes=4 * direct.ALIGN, buffers=2)
    busy, peak, lock = [0], [0], threading.Lock()

    def slow_sink(piece: memoryview) -> None:
        with lock:
            busy[0] += 1
            peak[0] = max(peak[0], busy[0])
        time.sleep(0.002)
        with lock:
            busy[0] -= 1

    def reader(i: int) -> bytes:
        io.feed(dfd, i * 1000, 20_000, slow_sink)
        return io.read(dfd, i * 1000, 20_000)

    try:
        with ThreadPoolExecutor(max_workers=8) as pool:
            got = list(pool.map(reader, range(16)))
        assert got == [data[i * 1000 : i * 1000 + 20_000] for i in range(16)]
        assert len(io._made) <= 2
        assert peak[0] <= 2
    finally:
        io.close()


def test_a_buffer_that_is_not_whole_pages_is_refused() -> None:
    with pytest.raises(ValueError, match="multiple of the alignment"):
        direct.DirectIO(buffer_bytes=direct.ALIGN + 1)
    for none in (0, -1):
        with pytest.raises(ValueError, match="at least one buffer"):
            direct.DirectIO(buffers=none)
    direct.DirectIO(buffers=1).close()  # one buffer is enough: calls take turns


def test_a_models_root_without_o_direct_is_refused_with_its_check(tmp_path: Path) -> None:
    """ramfs has no O_DIRECT (tmpfs has, since Linux 6.6): mounted in a private mount
    namespace, so nothing outlives the test."""
    if shutil.which("unshare") is None or os.geteuid() != 0:
        pytest.skip("needs unshare and root for a private ramfs mount")
    mnt = tmp_path / "ramfs"
    mnt.mkdir()
    probe = (
        "import json; from pathlib import Path; from relgate_agent.staging import direct\n"
        "try:\n"
        f"    direct.probe(Path({str(mnt / 'models')!r})); print(json.dumps({{'refused': False}}))\n"
        "except direct.DirectUnsupported as exc:\n"
        "    print(json.dumps({'refused': True, 'check': exc.check, 'message': str(exc)}))\n"
    )
    out = subprocess.run(
        ["unshare", "--mount", "sh", "-c",
         f'mount -t ramfs ramfs "{mnt}" && exec "{sys.executable}" -c "$0"', probe],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    if out.returncode != 0 and "mount" in out.stderr:
        pytest.skip(f"no private ramfs mount here: {out.stderr.strip()}")
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["refused"] is True
    assert result["check"] == direct.CHECK_DIRECT
    assert "--staging-io buffered" in result["message"]
    assert list(mnt.iterdir()) == []  # the mount was private: nothing left here


def _direct_store(tmp_path: Path, checkpoint) -> tuple[VersionStore, bytes]:
    """An opened direct-staging store of the checkpoint, and the checkpoint's bytes."""
    _supported(tmp_path)
    m = checkpoint["manifest"]
    data = b"".join((checkpoint["origin"] / f.path).read_bytes() for f in m.files)
    store = VersionStore(tmp_path / "models", m, direct=True)
    store.open()
    return store, data


def test_the_store_stages_and_places_with_direct_io(tmp_path: Path, checkpoint) -> None:
    store, data = _direct_store(tmp_path, checkpoint)
    m, src = checkpoint["manifest"], checkpoint["origin"]
    assert store.direct_fds and set(store.direct_fds) == set(store.fds)
    for dfd in store.direct_fds.values():
        assert fcntl.fcntl(dfd, fcntl.F_GETFL) & os.O_DIRECT
    for b in reversed(range(m.num_blocks)):  # offsets, not arrival order, place bytes
        off, n = m.block_range(b)
        store.pwrite(off, data[off : off + n])
    assert all(store.chunk_matches(c) for c in range(m.num_chunks))
    assert store.pread(1, len(data) - 2) == data[1:-1]
    final = store.place()
    for f in m.files:
        assert (final / f.path).read_bytes() == (src / f.path).read_bytes()
    assert store.pread(0, 100) == data[:100]  # served after placement, still directly
    held = [*store.fds.values(), *store.direct_fds.values()]
    store.close()
    for fd in held:  # every descriptor, buffered and direct, is closed
        with pytest.raises(OSError):
            os.fstat(fd)


def test_the_direct_rehash_finds_a_staged_chunk_that_changed(tmp_path: Path, checkpoint) -> None:
    store, data = _direct_store(tmp_path, checkpoint)
    m = checkpoint["manifest"]
    store.pwrite(0, data)
    first = m.files[0]
    with open(store.tree / first.path, "r+b") as fh:
        fh.seek(first.size // 2)
        byte = fh.read(1)
        fh.seek(first.size // 2)
        fh.write(bytes([byte[0] ^ 0xFF]))
    pos = first.size // 2  # the first file starts at offset 0 of the checkpoint
    hit = [c.index for c in m.chunks if c.offset <= pos < c.offset + c.size]
    assert store.verify_staged() == hit
    store.close()


def test_the_config_file_and_the_flag_name_the_same_modes() -> None:
    assert AgentFileConfig().staging_io == direct.BUFFERED
    assert AgentFileConfig.model_validate({"staging_io": "direct"}).staging_io == direct.DIRECT
    with pytest.raises(ValueError, match="staging_io"):
        AgentFileConfig.model_validate({"staging_io": "mmap"})


def test_a_fleet_with_direct_staging_survives_a_kill_and_places_byte_exact(
    cluster, checkpoint
) -> None:
    """Half the hosts stage with O_DIRECT (middle hosts of chains serve their downstreams
    from direct reads); one of them is SIGKILLed mid-transfer and restarted: it resumes from
    its journal and every host places the checkpoint byte for byte."""
    _supported(cluster.base)
    m = checkpoint["manifest"]
    direct_hosts = {h for i, (h, _) in enumerate(HOSTS) if i % 2 == 0}
    cluster.start_coordinator()
    for h, r in HOSTS:
        extra = ["--staging-io", "direct"] if h in direct_hosts else None
        cluster.start_agent(h, r, extra_args=extra)
    cluster.wait_started()
    cluster.wait_registered(len(HOSTS))
    client = cluster.client()
    try:  # a 4 MiB/s origin cap stretches the job so the kill lands mid-transfer
        job = client.create_job(**job_spec(checkpoint, origin_cap_bytes_per_s=4 << 20)).job_id
    finally:
        client.close()
    victim, rack = next((h, r) for h, r in HOSTS if h in direct_hosts and h != HOSTS[0][0])
    cluster.wait_for(
        lambda: cluster.journaled(victim, m) >= 4, 60, "the direct-staging victim journaled 4"
    )
    cluster.kill(victim, signal.SIGKILL)
    journaled = cluster.journaled(victim, m)
    assert 0 < journaled < m.num_chunks
    cluster.start_agent(victim, rack, extra_args=["--staging-io", "direct"])
    cluster.wait_for(
        lambda: cluster.status(job)["hosts_ready"] == len(HOSTS), 120, "all hosts READY"
    )
    for h, _ in HOSTS:
        assert_placed(cluster, checkpoint, h)
