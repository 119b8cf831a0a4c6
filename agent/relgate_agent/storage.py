"""Host storage: staging files, the resume journal, atomic placement and retention GC.

Layout under the models root (default /models):

    <root>/.staging/<model>/<version>/tree/...   files being written (pwrite at manifest offsets)
    <root>/.staging/<model>/<version>/journal    verified chunks + stripe offsets (fsynced)
    <root>/<model>/<version>/...                 placed copy (rename of tree/, never written in place)

A chunk is journaled only after its SHA-256 matched the manifest *and* the staging files
were fsynced, so a journaled chunk survives a crash. The placed directory appears only by
rename after every chunk verified; a host never loads from staging.
"""

from __future__ import annotations

import base64
import contextlib
import json
import os
import shutil
import threading
from dataclasses import dataclass, field
from pathlib import Path

from relgate_agent.errors import StorageError
from relgate_agent.manifest import CheckpointManifest, FileEntry, chunk_digest, validate_name

JOURNAL_FORMAT = 1


def fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def bitmap_from_bits(bits: bytearray | list[int] | bytes) -> bytes:
    """Pack a 0/1 sequence into a bitmap, bit i = LSB-first bit (i % 8) of byte i // 8."""
    out = bytearray((len(bits) + 7) // 8)
    for i, v in enumerate(bits):
        if v:
            out[i >> 3] |= 1 << (i & 7)
    return bytes(out)


def bits_from_bitmap(bitmap: bytes, n: int) -> bytearray:
    out = bytearray(n)
    for i in range(min(n, len(bitmap) * 8)):
        if bitmap[i >> 3] >> (i & 7) & 1:
            out[i] = 1
    return out


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
        with open(tmp, "wb") as fh:
            fh.write(json.dumps(doc, sort_keys=True).encode())
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.path)
        fsync_dir(self.path.parent)


class VersionStore:
    """Staging files of one checkpoint version, read/written in the concatenated byte space."""

    def __init__(self, models_root: Path, manifest: CheckpointManifest) -> None:
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
        self.placed_marker = models_root / ".placed" / manifest.model / f"{manifest.version}.digest"
        self.fds: dict[str, int] = {}
        self.placed = False
        self.lock = threading.Lock()

    def write_placed_marker(self) -> None:
        self.placed_marker.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.placed_marker.with_suffix(".tmp")
        with open(tmp, "w") as fh:
            fh.write(self.manifest.digest + "\n")
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, self.placed_marker)
        fsync_dir(self.placed_marker.parent)

    def placed_marker_matches(self) -> bool:
        try:
            return self.placed_marker.read_text().strip() == self.manifest.digest
        except OSError:
            return False

    @staticmethod
    def is_placed(models_root: Path, model: str, version: str) -> bool:
        return (models_root / model / version).is_dir()

    def open(self) -> None:
        """Open placed files read-only if the version is placed, else create sparse staging files."""
        if self.final.is_dir():
            self.placed = True
            for f in self.manifest.files:
                self.fds[f.path] = os.open(self.final / f.path, os.O_RDONLY)
            return
        self.tree.mkdir(parents=True, exist_ok=True)
        for f in self.manifest.files:
            p = self.tree / f.path
            p.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(p, os.O_RDWR | os.O_CREAT, 0o644)
            if os.fstat(fd).st_size != f.size:
                os.ftruncate(fd, f.size)
            self.fds[f.path] = fd

    def close(self) -> None:
        for fd in self.fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
        self.fds.clear()

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
            written = os.pwrite(self.fds[f.path], view[pos : pos + n], foff)
            if written != n:
                raise StorageError(f"short write to {f.path} at {foff}: {written} of {n}")

    def pread(self, offset: int, length: int) -> bytes:
        parts: list[bytes] = []
        for f, foff, n, _ in self.manifest.segments(offset, length):
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

    def place(self) -> Path:
        """fsync every file, then rename staging tree -> <root>/<model>/<version> atomically."""
        with self.lock:
            if self.placed:
                return self.final
            self.fsync()
            for d in sorted(
                {(self.tree / f.path).parent for f in self.manifest.files}, reverse=True
            ):
                fsync_dir(d)
            self.final.parent.mkdir(parents=True, exist_ok=True)
            os.rename(self.tree, self.final)
            fsync_dir(self.final.parent)
            self.write_placed_marker()
            # Open descriptors stay valid across the rename; the data plane keeps serving them.
            self.placed = True
            with contextlib.suppress(OSError):
                os.unlink(self.journal.path)
            shutil.rmtree(self.staging_dir, ignore_errors=True)
            return self.final


def held_versions(models_root: Path) -> list[str]:
    """ "<model>/<version>" for every placed version under the models root."""
    out: list[str] = []
    if not models_root.is_dir():
        return out
    for m in sorted(models_root.iterdir()):
        if m.name.startswith(".") or not m.is_dir():
            continue
        out.extend(f"{m.name}/{v.name}" for v in sorted(m.iterdir()) if v.is_dir())
    return out


def gc_versions(models_root: Path, model: str, keep: int, protect: set[str]) -> list[str]:
    """Keep the newest ``keep`` placed versions of a model (N-1 retention is keep=2).

    Versions in ``protect`` (the one just placed, any in use) are never removed. A removed
    version is first renamed under .staging/.trash so a reader never sees a half-deleted tree.
    """
    validate_name("model", model)
    base = models_root / model
    if not base.is_dir():
        return []
    versions = sorted(
        (v for v in base.iterdir() if v.is_dir()), key=lambda p: p.stat().st_mtime, reverse=True
    )
    removed: list[str] = []
    trash = models_root / ".staging" / ".trash"
    for v in versions[max(keep, 1) :]:
        if v.name in protect:
            continue
        trash.mkdir(parents=True, exist_ok=True)
        target = trash / f"{model}--{v.name}--{os.getpid()}"
        os.rename(v, target)
        shutil.rmtree(target, ignore_errors=True)
        removed.append(v.name)
    return removed
