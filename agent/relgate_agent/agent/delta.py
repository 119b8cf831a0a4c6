"""Delta: chunks of a new version copied from versions this host already holds.

A chunk is named by its signed SHA-256. Before a job pulls a byte, the agent indexes every
local version whose layout it can trust: placed versions (the signed envelope kept under
``.placed/``, matching the placed marker) and staged ones (the envelope kept beside the
journal; only the chunks that journal says verified). Each chunk of the new manifest that is
still missing and whose digest (and size) equals a held chunk's is read from the held copy,
re-hashed against the **new** manifest's signed digest, and only then written into staging
and counted verified. A held copy that rotted since it was placed fails that hash: it is not
used (reported as ``LOCAL_COPY_REJECTED``) and the chunk comes over the network. Placement
re-verifies every staged chunk as always.

Chunks are cut over the concatenated byte space of the files, so an edit that keeps a
file's size changes only the chunks overlapping that file; an edit that changes a size
shifts every later chunk boundary and nothing after it matches.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from relgate_trust.errors import ManifestError
from relgate_trust.fstree import UnsafePathError, lstat_kind, open_beneath, open_dir
from relgate_trust.manifest import CheckpointManifest, TrustedKeys, chunk_digest, verify_envelope

from relgate_agent.errors import StorageError
from relgate_agent.staging.storage import (
    Journal,
    read_placed_envelope,
    read_placed_marker,
    read_staged_envelope,
)

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class HeldVersion:
    """A local version whose signed manifest verified: where its files are, which chunks."""

    name: str  # "<model>/<version>" or "<model>/<version> (staged)"
    tree: tuple[str, ...]  # path parts of its file tree below the models root
    manifest: CheckpointManifest
    chunks: frozenset[int]  # the chunks it holds (every one of a placed version)


@dataclass(frozen=True)
class HeldChunk:
    version: HeldVersion
    chunk: int


@dataclass
class DeltaResult:
    """What one job took from local versions instead of the network."""

    copied: list[int] = field(default_factory=list)
    bytes: int = 0
    # (chunk, held version) whose held bytes did not hash to the signed digest
    rejected: list[tuple[int, str]] = field(default_factory=list)


def _listdir(path: Path) -> list[str]:
    if lstat_kind(path) != "dir":
        return []  # a symlinked model or staging dir is never walked
    with contextlib.suppress(OSError):
        return sorted(os.listdir(path))
    return []


class HeldChunks:
    """Index of the chunks held by the local versions other than the job's own."""

    def __init__(self, models_root: Path, trusted_keys: TrustedKeys) -> None:
        self.root = models_root
        self.keys = trusted_keys

    def _verified(self, envelope: bytes | None, model: str, version: str) -> CheckpointManifest:
        if envelope is None:
            raise ManifestError(f"{model}/{version}: no signed manifest kept")
        m = verify_envelope(envelope, self.keys)
        if (m.model, m.version) != (model, version):
            raise ManifestError(f"{model}/{version}: envelope is for {m.model}/{m.version}")
        return m

    def versions(self, skip: tuple[str, str]) -> Iterator[HeldVersion]:
        for model in _listdir(self.root):
            if model.startswith("."):
                continue
            for version in _listdir(self.root / model):
                if (model, version) == skip or lstat_kind(self.root / model / version) != "dir":
                    continue
                try:
                    m = self._verified(
                        read_placed_envelope(self.root, model, version), model, version
                    )
                except (ManifestError, ValueError) as exc:
                    log.info("delta: placed %s/%s not indexed: %s", model, version, exc)
                    continue
                if read_placed_marker(self.root, model, version) != m.digest:
                    continue  # placed for another manifest (or marker gone): not indexed
                chunks = frozenset(range(m.num_chunks))
                yield HeldVersion(f"{model}/{version}", (model, version), m, chunks)
        staging = self.root / ".staging"
        for model in _listdir(staging):
            if model.startswith("."):
                continue  # .trash
            for version in _listdir(staging / model):
                if (model, version) == skip:
                    continue
                try:
                    env = read_staged_envelope(self.root, model, version)
                    m = self._verified(env, model, version)
                except (ManifestError, ValueError) as exc:
                    log.info("delta: staged %s/%s not indexed: %s", model, version, exc)
                    continue
                state = Journal(staging / model / version / "journal").load(m)
                if state is None or not state.verified:
                    continue
                tree = (".staging", model, version, "tree")
                yield HeldVersion(f"{model}/{version} (staged)", tree, m, frozenset(state.verified))

    def index(self, skip: tuple[str, str]) -> dict[tuple[str, int], list[HeldChunk]]:
        """(digest, size) -> the held chunks with that content, placed versions first."""
        out: dict[tuple[str, int], list[HeldChunk]] = {}
        for v in self.versions(skip):
            for c in sorted(v.chunks):
                e = v.manifest.chunks[c]
                out.setdefault((e.digest, e.size), []).append(HeldChunk(v, c))
        return out

    def read(self, held: HeldChunk, fds: dict[tuple[str, str], int]) -> bytes:
        """The held chunk's bytes (files opened O_NOFOLLOW beneath the models root)."""
        v = held.version
        e = v.manifest.chunks[held.chunk]
        parts: list[bytes] = []
        base = self.root.joinpath(*v.tree)
        for f, foff, n, _ in v.manifest.segments(e.offset, e.size):
            key = (v.name, f.path)
            if key not in fds:
                root = open_dir(self.root)
                try:
                    fds[key] = open_beneath(
                        root, self.root, "/".join([*v.tree, f.path]), os.O_RDONLY
                    )
                finally:
                    os.close(root)
            parts.append(os.pread(fds[key], n, foff))
        data = b"".join(parts)
        if len(data) != e.size:
            raise StorageError(f"{base}: short read of chunk {held.chunk}")
        return data


def copy_held_chunks(
    models_root: Path,
    trusted_keys: TrustedKeys,
    manifest: CheckpointManifest,
    missing: list[int],
    write: Callable[[int, bytes], None],
    stopped: Callable[[], bool] = lambda: False,
) -> DeltaResult:
    """Copy every chunk in ``missing`` that a local version holds with the same signed
    digest, each re-verified against ``manifest`` before ``write`` is called."""
    result = DeltaResult()
    held = HeldChunks(models_root, trusted_keys)
    index = held.index((manifest.model, manifest.version))
    if not index:
        return result
    fds: dict[tuple[str, str], int] = {}
    try:
        for c in missing:
            if stopped():  # cancelled or stopping: what is copied so far stays
                break
            e = manifest.chunks[c]
            for cand in index.get((e.digest, e.size), []):
                try:
                    data = held.read(cand, fds)
                except (OSError, StorageError, UnsafePathError) as exc:
                    log.info("delta: chunk %d from %s unreadable: %s", c, cand.version.name, exc)
                    result.rejected.append((c, cand.version.name))
                    continue
                if chunk_digest(data) != e.digest:  # rotted since it was placed
                    result.rejected.append((c, cand.version.name))
                    continue
                write(c, data)
                result.copied.append(c)
                result.bytes += len(data)
                break
    finally:
        for fd in fds.values():
            with contextlib.suppress(OSError):
                os.close(fd)
    return result


__all__ = ["DeltaResult", "HeldChunk", "HeldChunks", "HeldVersion", "copy_held_chunks"]
