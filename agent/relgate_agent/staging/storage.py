"""Host storage: staging files, the resume journal, atomic placement and retention GC.

Layout under the models root (default /models):

    <root>/.staging/<model>/<version>/tree/...   files being written (pwrite at manifest offsets)
    <root>/.staging/<model>/<version>/journal    verified chunks + stripe offsets (fsynced)
    <root>/.staging/<model>/<version>/manifest.dsse.json   the signed manifest being staged
    <root>/<model>/<version>/...                 placed copy (rename of tree/, never written in place)

A chunk is journaled only after its SHA-256 matched the manifest *and* the staging files
were fsynced, so a journaled chunk survives a crash. The placed directory appears only by
rename after every chunk verified; a host never loads from staging.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import json
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import numpy.typing as npt
from relgate_trust.digests import sha256_digest, spelled
from relgate_trust.dsse import MAX_ENVELOPE_BYTES  # the one bound on a signed envelope
from relgate_trust.fstree import (
    CHECK_NOT_REGULAR,
    CHECK_SYMLINK,
    UnsafePathError,
    lstat_kind,
    mkdirs_beneath,
    open_beneath,
    open_dir,
    open_dirs_beneath,
    walk_checkpoint_tree,
)
from relgate_trust.manifest import (
    CheckpointManifest,
    ChunkEntry,
    FileEntry,
    chunk_digest,
    validate_name,
)

from relgate_agent.errors import NoSpace, StorageError, is_no_space
from relgate_agent.staging.direct import DirectIO, reopen_direct

JOURNAL_FORMAT = 1
STAGED_ENVELOPE = "manifest.dsse.json"  # beside the journal of a staged version
MAX_ATTESTATION_BYTES = 64 << 10  # a placement attestation: a certificate and a signature
# checks named in placement / scrub refusals (besides those of fstree)
CHECK_UNEXPECTED = "unexpected-entry"
CHECK_REPLACED = "replaced-file"
CHECK_MISSING = "missing-file"
CHECK_SIZE = "file-size"
CHECK_NOT_PLACED = "not-placed"
CHECK_PLACED_MANIFEST = "placed-manifest"
CHECK_PLACED_MARKER = "placed-marker"
CHECK_CHUNK_DIGEST = "chunk-digest"


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def bitmap_from_bits(bits: bytearray | list[int] | bytes) -> bytes:
    """Pack a 0/1 sequence into a bitmap, bit i = LSB-first bit (i % 8) of byte i // 8."""
    if isinstance(bits, list):
        arr = np.asarray(bits, dtype=np.uint8)
    else:
        arr = np.frombuffer(bytes(bits), dtype=np.uint8)
    return np.packbits(arr != 0, bitorder="little").tobytes()


def _bit_array(bitmap: bytes, n: int) -> npt.NDArray[np.uint8]:
    """The first ``n`` bits of ``bitmap`` (missing trailing bytes read as 0, extra ones ignored)."""
    if n <= 0:
        return np.zeros(0, dtype=np.uint8)
    raw = np.frombuffer(bitmap[: (n + 7) // 8], dtype=np.uint8)
    bits = np.unpackbits(raw, count=min(n, raw.size * 8), bitorder="little")
    if bits.size < n:
        bits = np.concatenate([bits, np.zeros(n - bits.size, dtype=np.uint8)])
    return bits


def bits_from_bitmap(bitmap: bytes, n: int) -> bytearray:
    """The first ``n`` bits of a peer's bitmap; a short or long bitmap is bounded, never trusted."""
    return bytearray(_bit_array(bitmap, n).tobytes())


def stripe_resume_blocks(
    bitmap: bytes, n: int, stripes: int, blocks_per_chunk: int, last_chunk_blocks: int
) -> list[int]:
    """Per stripe, the stream position (in blocks) of a host's first missing chunk: stripe
    ``s`` streams chunks ``s, s + k, ...``; every chunk has ``blocks_per_chunk`` blocks but
    the last one of the checkpoint (``last_chunk_blocks``). One numpy pass for all stripes
    (a push to every host of a job computes this per host)."""
    if stripes <= 0:
        return []
    if n <= 0:
        return [0] * stripes
    rows = -(-n // stripes)
    grid = np.ones(rows * stripes, dtype=np.uint8)  # padding past the last chunk: "held"
    grid[:n] = _bit_array(bitmap, n)
    grid2 = grid.reshape(rows, stripes)  # row r, column s: chunk r * k + s
    missing = grid2 == 0
    cols = np.arange(stripes)
    first = missing.argmax(axis=0)  # 0 also where nothing is missing: told apart below
    found = missing[first, cols]
    counts = np.maximum((n - cols + stripes - 1) // stripes, 0)  # len(range(s, n, k))
    whole = counts * blocks_per_chunk
    whole[(n - 1) % stripes] -= blocks_per_chunk - last_chunk_blocks
    out: list[int] = np.where(found, first * blocks_per_chunk, whole).astype(int).tolist()
    return out


DELTA_INDEX = np.dtype("<u4")  # a progress delta: packed little-endian uint32 chunk indexes


def pack_indexes(indexes: npt.ArrayLike) -> bytes:
    """Chunk indexes as a progress delta (the wire layout of ``verified_delta``)."""
    return np.asarray(indexes, dtype=DELTA_INDEX).tobytes()


SMALL_DELTA = 64  # indexes merged one by one in Python below this; numpy above


def merge_delta(bitmap: bytes, delta: bytes, n: int) -> tuple[bytes, int] | None:
    """``bitmap`` (n chunks) with the delta's chunks set, and how many of them it did not
    hold (so a cached count grows by that, without counting the whole bitmap again); None
    if the delta is malformed.

    Hostile input: a length that is not whole indexes, more than ``n`` indexes or an index
    at or past ``n`` refuses the whole delta (nothing of it is applied). Bits of ``bitmap``
    past ``n`` are not chunks: they are cleared, and the count is of the first ``n`` only.
    """
    size = DELTA_INDEX.itemsize
    if n <= 0 or len(delta) % size or len(delta) // size > n:
        return None
    idx = np.frombuffer(delta, dtype=DELTA_INDEX)
    small = idx.tolist() if idx.size < SMALL_DELTA else None  # a report's few chunks
    if (max(small, default=0) if small is not None else int(idx.max(initial=0))) >= n:
        return None
    out = bytearray((n + 7) // 8)
    head = bitmap[: len(out)]
    out[: len(head)] = head
    if n % 8:
        out[-1] &= (1 << (n % 8)) - 1
    if small is not None:  # no array round trip
        added = 0
        for i in small:
            bit = 1 << (i & 7)
            if not out[i >> 3] & bit:
                out[i >> 3] |= bit
                added += 1
        return bytes(out), added
    bits = _bit_array(bytes(out), n)
    fresh = np.unique(idx)
    added = int(fresh.size - np.count_nonzero(bits[fresh]))
    bits[fresh] = 1
    return np.packbits(bits, bitorder="little").tobytes(), added


def apply_delta(bitmap: bytes, delta: bytes, n: int) -> bytes | None:
    """``bitmap`` (n chunks) with the delta's chunks set; None if the delta is malformed
    (see :func:`merge_delta`)."""
    merged = merge_delta(bitmap, delta, n)
    return None if merged is None else merged[0]


def delta_indexes(old: bytes, new: bytes, n: int) -> bytes:
    """The progress delta from ``old`` to ``new`` (chunks set in new, not in old)."""
    fresh = np.flatnonzero(_bit_array(new, n) & ~_bit_array(old, n))
    return pack_indexes(fresh)


def count_bits(bitmap: bytes, n: int) -> int:
    """How many of the first ``n`` chunks ``bitmap`` marks verified (numpy, no per-bit Python)."""
    return int(np.count_nonzero(_bit_array(bitmap, n)))


@dataclass
class JournalState:
    manifest_digest: str
    verified: set[int] = field(default_factory=set)
    stripe_offsets: list[int] = field(default_factory=list)


class Journal:
    """A small JSON file replaced atomically (write temp, fsync, rename, fsync dir)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def load(self, manifest: CheckpointManifest) -> JournalState | None:
        try:
            doc = json.loads(self.path.read_bytes())
        except FileNotFoundError:
            return None
        except (OSError, ValueError):
            return None  # a torn journal is ignored: resume from the previous state is lost, never wrong
        if doc.get("format") != JOURNAL_FORMAT or doc.get("manifestDigest") != manifest.digest:
            return None
        bits = bits_from_bitmap(base64.b64decode(doc.get("verified", "")), manifest.num_chunks)
        return JournalState(
            manifest.digest,
            {i for i, v in enumerate(bits) if v},
            [int(x) for x in doc.get("stripeOffsets", [])],
        )

    def save(self, state: JournalState, num_chunks: int) -> None:
        bits = bytearray(num_chunks)
        for i in state.verified:
            bits[i] = 1
        doc = {
            "format": JOURNAL_FORMAT,
            "manifestDigest": state.manifest_digest,
            "verified": base64.b64encode(bitmap_from_bits(bits)).decode("ascii"),
            "stripeOffsets": list(state.stripe_offsets),
        }
        tmp = self.path.with_suffix(".tmp")
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
        with open(fd, "wb") as fh:
            fh.write(json.dumps(doc, sort_keys=True).encode())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)


class StagedMismatch(StorageError):
    """Re-verification before placement found staged chunks that no longer match."""

    def __init__(self, chunks: list[int]) -> None:
        super().__init__(f"staged chunks {chunks[:8]} do not match the manifest; not placed")
        self.chunks = chunks


READ_SIZE = 16 << 20  # re-hash in large sequential reads
# chunks are hashed by this many threads at once (hashlib and pread release the GIL): one
# core's SHA-256 (~1-2 GB/s) is far below an NVMe RAID, so a single hashing thread would make
# placement of 800 GB take minutes. Workers take chunks in manifest order, so the reads
# stay a forward sweep over the files with `workers` chunk-sized windows in flight.
SCAN_WORKERS = 8


def _chunk_ok(
    manifest: CheckpointManifest,
    fds: dict[str, int],
    c: ChunkEntry,
    read_size: int,
    direct: DirectIO | None = None,
) -> bool:
    h = hashlib.sha256()
    got = 0
    for f, foff, n, _ in manifest.segments(c.offset, c.size):
        fd = fds[f.path]
        if direct is not None:  # hashed from the aligned buffer, no copy
            got += direct.feed(fd, foff, n, h.update)
            continue
        done = 0
        while done < n:
            piece = os.pread(fd, min(read_size, n - done), foff + done)
            if not piece:
                break
            h.update(piece)
            done += len(piece)
        got += done
    return got == c.size and spelled(h.hexdigest()) == c.digest


def scan_chunks(
    manifest: CheckpointManifest,
    fds: dict[str, int],
    read_size: int = READ_SIZE,
    workers: int = 0,
    direct: DirectIO | None = None,
) -> list[int]:
    """Re-hash every chunk (in manifest order, one forward pass over the files) against the
    manifest; returns the indexes of the chunks whose SHA-256 does not match.  With
    ``direct``, ``fds`` are O_DIRECT descriptors read through its aligned buffers."""
    for fd in fds.values():
        with contextlib.suppress(OSError, AttributeError):
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_SEQUENTIAL)
    n = workers or min(SCAN_WORKERS, os.cpu_count() or 1)
    if n <= 1 or manifest.num_chunks <= 1:
        return [
            c.index for c in manifest.chunks if not _chunk_ok(manifest, fds, c, read_size, direct)
        ]
    with ThreadPoolExecutor(max_workers=n, thread_name_prefix="rehash") as pool:
        ok = list(
            pool.map(lambda c: _chunk_ok(manifest, fds, c, read_size, direct), manifest.chunks)
        )
    return [c.index for c, good in zip(manifest.chunks, ok, strict=True) if not good]


class VersionStore:
    """Staging files of one checkpoint version, read/written in the concatenated byte space.

    Every directory and file below the models root is created and opened one component at
    a time with O_NOFOLLOW (``fstree``): a symlink planted in the models root, the staging
    tree or the placed tree is refused, never followed.
    """

    def __init__(
        self, models_root: Path, manifest: CheckpointManifest, *, direct: bool = False
    ) -> None:
        validate_name("model", manifest.model)
        validate_name("version", manifest.version)
        self.models_root = models_root
        self.manifest = manifest
        self.staging_dir = models_root / ".staging" / manifest.model / manifest.version
        self.tree = self.staging_dir / "tree"
        self.final = models_root / manifest.model / manifest.version
        self.journal = Journal(self.staging_dir / "journal")
        # which manifest the placed directory was verified against (outside the model dir,
        # so the placed tree holds exactly the checkpoint's files)
        self.placed_marker = placed_marker_path(models_root, manifest.model, manifest.version)
        self.placed_envelope = placed_envelope_path(models_root, manifest.model, manifest.version)
        self.placed_attestation = placed_attestation_path(
            models_root, manifest.model, manifest.version
        )
        self.fds: dict[str, int] = {}
        #: the same files opened with O_DIRECT (``--staging-io direct``; staging/direct.py)
        self.direct = DirectIO() if direct else None
        self.direct_fds: dict[str, int] = {}
        self.placed = False
        self.lock = threading.Lock()

    # -- paths ---------------------------------------------------------------
    def check_paths(self) -> None:
        """Refuse early (before a byte moves) when a path this store will create or rename
        into is a symlink or not a directory. Checked again at every use."""
        m = self.manifest
        r = self.models_root
        for p in (
            r / m.model,
            r / ".staging",
            r / ".staging" / m.model,
            self.staging_dir,
            self.tree,
            r / ".placed",
            r / ".placed" / m.model,
            self.final,
        ):
            kind = lstat_kind(p)
            if kind == "symlink":
                raise UnsafePathError(p, CHECK_SYMLINK, "is a symlink (not followed)")
            if kind == "other":
                raise UnsafePathError(p, CHECK_NOT_REGULAR, "must be a directory")

    def _root_fd(self) -> int:
        self.models_root.mkdir(parents=True, exist_ok=True)
        return open_dir(self.models_root)

    def _write_beneath(self, parts: list[str], name: str, data: bytes) -> None:
        root = self._root_fd()
        try:
            dfd = mkdirs_beneath(root, self.models_root, parts)
        finally:
            os.close(root)
        try:
            base = self.models_root.joinpath(*parts)
            tmp = f".{name}.tmp"
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp, dir_fd=dfd)
            fd = open_beneath(dfd, base, tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
            try:
                os.write(fd, data)
                os.fsync(fd)
            finally:
                os.close(fd)
            os.rename(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            os.fsync(dfd)
        finally:
            os.close(dfd)

    def write_placed_marker(self, envelope: bytes | None = None) -> None:
        """Record the manifest digest the placed tree was verified against (and its signed
        envelope, so ``relgate-agent verify`` can scrub the copy later)."""
        parts = [".placed", self.manifest.model]
        if envelope is not None:
            self._write_beneath(parts, self.placed_envelope.name, envelope)
        self._write_beneath(parts, self.placed_marker.name, (self.manifest.digest + "\n").encode())

    def write_placed_attestation(self, attestation: bytes) -> None:
        """Keep this host's signed placement attestation beside the marker."""
        self._write_beneath(
            [".placed", self.manifest.model], self.placed_attestation.name, attestation
        )

    def read_placed_attestation(self) -> bytes | None:
        return _read_beneath(
            self.models_root,
            [".placed", self.manifest.model, self.placed_attestation.name],
            MAX_ATTESTATION_BYTES,
        )

    def write_staged_envelope(self, envelope: bytes) -> None:
        """Keep the signed manifest beside the journal: another job on this host may reuse
        this version's journaled chunks (``agent.delta``) once it verifies the envelope."""
        parts = [".staging", self.manifest.model, self.manifest.version]
        self._write_beneath(parts, STAGED_ENVELOPE, envelope)

    def placed_marker_matches(self) -> bool:
        return self.placed_marker_digest() == self.manifest.digest

    def placed_marker_digest(self) -> str | None:
        """The digest the placed tree of this model/version was verified against, if any."""
        return read_placed_marker(self.models_root, self.manifest.model, self.manifest.version)

    @staticmethod
    def is_placed(models_root: Path, model: str, version: str) -> bool:
        return lstat_kind(models_root / model / version) == "dir"

    def open(self) -> None:
        """Open placed files read-only if the version is placed, else create sparse staging files."""
        self.check_paths()
        root = self._root_fd()
        try:
            if lstat_kind(self.final) == "dir":
                self.placed = True
                base = open_dirs_beneath(
                    root, self.models_root, [self.manifest.model, self.manifest.version]
                )
                try:
                    for f in self.manifest.files:
                        self.fds[f.path] = open_beneath(base, self.final, f.path, os.O_RDONLY)
                finally:
                    os.close(base)
                self._open_direct(writable=False)
                return
            tree = mkdirs_beneath(
                root,
                self.models_root,
                [".staging", self.manifest.model, self.manifest.version, "tree"],
            )
        finally:
            os.close(root)
        try:
            for f in self.manifest.files:
                fd = open_beneath(
                    tree, self.tree, f.path, os.O_RDWR | os.O_CREAT, 0o644, create_dirs=True
                )
                self.fds[f.path] = fd
                if os.fstat(fd).st_size != f.size:
                    os.ftruncate(fd, f.size)
        finally:
            os.close(tree)
        self._open_direct(writable=True)

    def _open_direct(self, *, writable: bool) -> None:
        if self.direct is not None:
            for path, fd in self.fds.items():
                self.direct_fds[path] = reopen_direct(fd, writable=writable)

    def close(self) -> None:
        for fd in (*self.fds.values(), *self.direct_fds.values()):
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()
        self.direct_fds.clear()
        if self.direct is not None:
            self.direct.close()

    def discard(self) -> None:
        """Remove staging (cancelled job or a journal for another manifest)."""
        self.close()
        shutil.rmtree(self.staging_dir, ignore_errors=True)

    def pwrite(self, offset: int, data: bytes | memoryview) -> None:
        if self.placed:
            raise StorageError(f"{self.final} is placed; refusing to write")
        view = memoryview(data)
        seg: tuple[FileEntry, int, int, int]
        for seg in self.manifest.segments(offset, len(view)):
            f, foff, n, pos = seg
            try:
                if self.direct is not None:
                    written = self.direct.write(
                        self.direct_fds[f.path], self.fds[f.path], view[pos : pos + n], foff
                    )
                else:
                    written = os.pwrite(self.fds[f.path], view[pos : pos + n], foff)
            except OSError as exc:
                if is_no_space(exc):
                    raise NoSpace(
                        f"no space to stage {f.path} at {foff} under {self.models_root}: {exc}"
                    ) from exc
                raise
            if written != n:  # a regular file written short: the file system is full
                raise NoSpace(f"short write to {f.path} at {foff}: {written} of {n}")

    def pread(self, offset: int, length: int) -> bytes:
        parts: list[bytes] = []
        for f, foff, n, _ in self.manifest.segments(offset, length):
            if self.direct is not None:
                parts.append(self.direct.read(self.direct_fds[f.path], foff, n))
            else:
                parts.append(os.pread(self.fds[f.path], n, foff))
        data = b"".join(parts)
        if len(data) != length:
            raise StorageError(f"short read at {offset}: {len(data)} of {length}")
        return data

    def chunk_matches(self, chunk: int) -> bool:
        c = self.manifest.chunks[chunk]
        return chunk_digest(self.pread(c.offset, c.size)) == c.digest

    def fsync(self) -> None:
        for fd in self.fds.values():
            os.fsync(fd)

    def free_bytes(self) -> int:
        self.models_root.mkdir(parents=True, exist_ok=True)
        return shutil.disk_usage(self.models_root).free

    def verify_staged(self) -> list[int]:
        """Re-verify the staging tree as it will be placed: exactly the manifest's files (no
        symlinks, no extras, the very inodes this store wrote, the right sizes), then every
        chunk re-hashed in one sequential pass. Returns the chunks that do not match."""
        listed = {t.rel: t for t in walk_checkpoint_tree(self.tree)}
        want = {f.path: f for f in self.manifest.files}
        extra = sorted(set(listed) - set(want))
        if extra:
            raise UnsafePathError(
                self.tree / extra[0], CHECK_UNEXPECTED, "is not a file of the manifest"
            )
        for rel, f in want.items():
            t = listed.get(rel)
            st = os.fstat(self.fds[rel])
            if t is None or (t.dev, t.ino) != (st.st_dev, st.st_ino):
                raise UnsafePathError(
                    self.tree / rel, CHECK_REPLACED, "is not the file this agent wrote"
                )
            if t.size != f.size:
                raise StorageError(f"{self.tree / rel}: {t.size} bytes, manifest says {f.size}")
        if self.direct is not None:
            return scan_chunks(self.manifest, self.direct_fds, direct=self.direct)
        return scan_chunks(self.manifest, self.fds)

    def place(self, envelope: bytes | None = None) -> Path:
        """fsync, re-verify every staged chunk, then rename staging tree -> <root>/<model>/<version>.

        Raises StagedMismatch (nothing placed) when a chunk no longer matches the manifest.
        """
        with self.lock:
            if self.placed:
                return self.final
            self.fsync()
            for d in sorted(
                {(self.tree / f.path).parent for f in self.manifest.files}, reverse=True
            ):
                fsync_dir(d)
            self.check_paths()
            bad = self.verify_staged()
            if bad:
                raise StagedMismatch(bad)
            root = self._root_fd()
            try:
                parent = mkdirs_beneath(root, self.models_root, [self.manifest.model])
                try:
                    staging = open_dirs_beneath(
                        root,
                        self.models_root,
                        [".staging", self.manifest.model, self.manifest.version],
                    )
                    try:
                        if lstat_kind(self.final) != "missing":
                            raise UnsafePathError(self.final, CHECK_UNEXPECTED, "already exists")
                        os.rename(
                            "tree", self.manifest.version, src_dir_fd=staging, dst_dir_fd=parent
                        )
                        os.fsync(parent)
                        os.fsync(staging)
                    finally:
                        os.close(staging)
                finally:
                    os.close(parent)
            finally:
                os.close(root)
            self.write_placed_marker(envelope)
            # Open descriptors stay valid across the rename; the data plane keeps serving them.
            self.placed = True
            with contextlib.suppress(OSError):
                os.unlink(self.journal.path)
            shutil.rmtree(self.staging_dir, ignore_errors=True)
            return self.final


# -- placed copies: marker, scrub, un-place ----------------------------------------------------
def placed_marker_path(models_root: Path, model: str, version: str) -> Path:
    return models_root / ".placed" / model / f"{version}.digest"


def placed_envelope_path(models_root: Path, model: str, version: str) -> Path:
    return models_root / ".placed" / model / f"{version}.manifest.dsse.json"


def placed_attestation_path(models_root: Path, model: str, version: str) -> Path:
    """This host's signed placement attestation of the placed copy (relgate_agent.attestation)."""
    return models_root / ".placed" / model / f"{version}.attestation.json"


def _drop_markers(models_root: Path, model: str, version: str) -> None:
    """The marker, envelope and attestation of a placed version (it is being removed)."""
    for p in (
        placed_marker_path(models_root, model, version),
        placed_envelope_path(models_root, model, version),
        placed_attestation_path(models_root, model, version),
    ):
        with contextlib.suppress(FileNotFoundError):
            if lstat_kind(p.parent) == "dir":
                os.unlink(p)


def _read_beneath(models_root: Path, parts: list[str], limit: int) -> bytes | None:
    try:
        root = open_dir(models_root)
    except OSError:
        return None
    try:
        *dirs, name = parts
        fd = open_beneath(root, models_root, "/".join([*dirs, name]), os.O_RDONLY)
    except (OSError, UnsafePathError):
        return None
    finally:
        os.close(root)
    try:
        data = os.read(fd, limit + 1)
    finally:
        os.close(fd)
    return data if len(data) <= limit else None


def read_staged_envelope(models_root: Path, model: str, version: str) -> bytes | None:
    return _read_beneath(
        models_root, [".staging", model, version, STAGED_ENVELOPE], MAX_ENVELOPE_BYTES
    )


def read_placed_marker(models_root: Path, model: str, version: str) -> str | None:
    raw = _read_beneath(models_root, [".placed", model, f"{version}.digest"], 256)
    return raw.decode("ascii", "replace").strip() if raw is not None else None


def read_placed_envelope(models_root: Path, model: str, version: str) -> bytes | None:
    return _read_beneath(
        models_root, [".placed", model, f"{version}.manifest.dsse.json"], MAX_ENVELOPE_BYTES
    )


@dataclass(frozen=True)
class ScrubResult:
    """Outcome of re-hashing a placed copy against its manifest."""

    model: str
    version: str
    manifest_digest: str
    chunks: int
    bad_chunks: tuple[int, ...]
    files_of_first_bad: tuple[str, ...] = ()
    expected_digest: str = ""
    actual_digest: str = ""

    @property
    def intact(self) -> bool:
        return not self.bad_chunks


def scrub_placed(models_root: Path, manifest: CheckpointManifest) -> ScrubResult:
    """Re-hash a placed copy (exact file set, no symlinks, every chunk) against ``manifest``."""
    final = models_root / manifest.model / manifest.version
    if lstat_kind(final) != "dir":
        raise UnsafePathError(final, CHECK_NOT_PLACED, "is not a placed directory")
    listed = {t.rel: t for t in walk_checkpoint_tree(final)}
    want = {f.path: f for f in manifest.files}
    extra = sorted(set(listed) - set(want))
    if extra:
        raise UnsafePathError(final / extra[0], CHECK_UNEXPECTED, "is not a file of the manifest")
    fds: dict[str, int] = {}
    root = open_dir(models_root)
    try:
        base = open_dirs_beneath(root, models_root, [manifest.model, manifest.version])
        try:
            for rel, f in want.items():
                if rel not in listed:
                    raise UnsafePathError(final / rel, CHECK_MISSING, "is missing")
                fds[rel] = open_beneath(base, final, rel, os.O_RDONLY)
                if os.fstat(fds[rel]).st_size != f.size:
                    raise UnsafePathError(
                        final / rel, CHECK_SIZE, f"is not {f.size} bytes as the manifest says"
                    )
        finally:
            os.close(base)
        bad = scan_chunks(manifest, fds)
        if not bad:
            return ScrubResult(
                manifest.model, manifest.version, manifest.digest, manifest.num_chunks, ()
            )
        c = manifest.chunks[bad[0]]
        files = tuple(f.path for f, *_ in manifest.segments(c.offset, c.size))
        actual = sha256_digest(
            b"".join(
                os.pread(fds[f.path], n, foff)
                for f, foff, n, _ in manifest.segments(c.offset, c.size)
            )
        )
        return ScrubResult(
            manifest.model,
            manifest.version,
            manifest.digest,
            manifest.num_chunks,
            tuple(bad),
            files,
            c.digest,
            actual,
        )
    finally:
        os.close(root)
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)


def unplace(models_root: Path, model: str, version: str) -> None:
    """Take a placed copy out of service: marker first (so nothing trusts it any more), then
    rename the tree under .staging/.trash and delete it there."""
    validate_name("model", model)
    validate_name("version", version)
    _drop_markers(models_root, model, version)
    root = open_dir(models_root)
    try:
        parent = open_dirs_beneath(root, models_root, [model])
        trash = mkdirs_beneath(root, models_root, [".staging", ".trash"])
        name = f"{model}--{version}--unplaced-{os.getpid()}-{time.time_ns()}"
        try:
            os.rename(version, name, src_dir_fd=parent, dst_dir_fd=trash)
            os.fsync(parent)
        finally:
            os.close(parent)
            os.close(trash)
    finally:
        os.close(root)
    shutil.rmtree(models_root / ".staging" / ".trash" / name, ignore_errors=True)


def held_versions(models_root: Path) -> list[str]:
    """ "<model>/<version>" for every placed version under the models root."""
    out: list[str] = []
    if not models_root.is_dir():
        return out
    for m in sorted(models_root.iterdir()):
        if m.name.startswith(".") or lstat_kind(m) != "dir":
            continue
        out.extend(f"{m.name}/{v.name}" for v in sorted(m.iterdir()) if lstat_kind(v) == "dir")
    return out


def gc_versions(models_root: Path, model: str, keep: int, protect: set[str]) -> list[str]:
    """Keep the newest ``keep`` placed versions of a model (N-1 retention is keep=2).

    Versions in ``protect`` (the one just placed, any in use) are never removed. A removed
    version is first renamed under .staging/.trash so a reader never sees a half-deleted tree.
    """
    validate_name("model", model)
    base = models_root / model
    if lstat_kind(base) != "dir":
        return []  # a symlinked model dir is never walked (it would delete what it points to)
    versions = sorted(
        (v for v in base.iterdir() if lstat_kind(v) == "dir"),
        key=lambda p: p.lstat().st_mtime,
        reverse=True,
    )
    removed: list[str] = []
    trash = models_root / ".staging" / ".trash"
    for v in versions[max(keep, 1) :]:
        if v.name in protect:
            continue
        trash.mkdir(parents=True, exist_ok=True)
        target = trash / f"{model}--{v.name}--{os.getpid()}"
        _drop_markers(models_root, model, v.name)  # nothing vouches for it any more
        os.rename(v, target)
        shutil.rmtree(target, ignore_errors=True)
        removed.append(v.name)
    return removed
