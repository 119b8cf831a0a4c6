"""Publication: copy a checkpoint directory to its immutable origin and sign its manifest.

The manifest format and its signature belong to the ``relgate-agent`` package; this module
wires them to the workspace's signing key and origin directory.  A version is written complete
in a staging directory and renamed into place, so it is never visible half-copied, and an
existing version is never replaced.
"""

from __future__ import annotations

import json
import os
import shutil
import stat
import tempfile
from pathlib import Path

from relgate_trust.errors import ManifestError
from relgate_trust.fstree import CHECK_NOT_REGULAR, UnsafePathError, walk_checkpoint_tree
from relgate_trust.manifest import CheckpointManifest, build_manifest, sign_manifest

from relgate.checkpoint.location import (
    ENVELOPE_NAME,
    ORIGIN_NAME,
    validate_names,
    version_dir,
)
from relgate.errors import ObjectExistsError, RejectedError, UsageError
from relgate.integrity.contract import Contract
from relgate.workspace import Workspace

_COPY_BUFFER = 16 << 20


class PublishedCheckpoint(Contract):
    """A published checkpoint version: its signed manifest's digest and where it lives."""

    model: str
    version: str
    manifest_digest: str
    origin_uri: str
    manifest_uri: str
    files: int
    bytes: int


class PublishOptions(Contract):
    """How to cut a directory into the manifest's chunks and blocks (bytes)."""

    chunk_size: int
    block_size: int


def _refuse(path: object, check: str, message: str) -> RejectedError:
    return RejectedError(message, object=str(path), check=f"checkpoint-{check}")


def _copy_file(path: Path, dev: int, ino: int, out: Path) -> None:
    """Copy one walked file, refusing it unless it is still the regular inode the walk saw."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK)
    except OSError as exc:
        raise _refuse(
            path, "symlink", f"{path} cannot be opened without following: {exc}"
        ) from None
    with open(fd, "rb") as src:
        st = os.fstat(fd)
        if (st.st_dev, st.st_ino) != (dev, ino) or not stat.S_ISREG(st.st_mode):
            raise _refuse(path, CHECK_NOT_REGULAR, f"{path} changed while it was being published")
        os.set_blocking(fd, True)
        out.parent.mkdir(parents=True, exist_ok=True)
        with open(out, "xb") as dst:
            shutil.copyfileobj(src, dst, _COPY_BUFFER)
            dst.flush()
            os.fsync(dst.fileno())


def _copy_tree_safely(source: Path, dest: Path) -> list[str]:
    """Copy the regular files of ``source`` to ``dest`` through the agent's shared walker.

    Refuses (exit 3, naming the path and the check) symlinks, devices, FIFOs, sockets,
    mounts and hard links inside the directory; every file is opened with O_NOFOLLOW and
    must still be the inode the walk saw, so a swap between walk and copy is refused too.
    """
    try:
        listed = walk_checkpoint_tree(source, allow_hard_links=False)
    except UnsafePathError as exc:
        raise _refuse(exc.path, exc.check, str(exc)) from None
    for f in listed:
        _copy_file(Path(f.path), f.dev, f.ino, dest / f.rel)
    return [f.rel for f in listed]


def _already_published(model: str, version: str) -> ObjectExistsError:
    return ObjectExistsError(
        "checkpoint version already published",
        object=f"{model}/{version}",
        check="conditional-create",
    )


def _stage(
    ws: Workspace, source: Path, staging: Path, model: str, version: str, options: PublishOptions
) -> CheckpointManifest:
    """Fill ``staging`` with ``origin/`` and the signed envelope; everything read-only."""
    origin = staging / ORIGIN_NAME
    origin.mkdir()
    copied = _copy_tree_safely(source, origin)
    try:
        manifest = build_manifest(
            origin, model, version, chunk_size=options.chunk_size, block_size=options.block_size
        )
    except ManifestError as exc:
        raise RejectedError(str(exc), object=str(source), check="checkpoint-manifest") from None
    if [f.path for f in manifest.files] != copied:
        raise RejectedError(
            "published copy does not hold exactly the walked files",
            object=str(source),
            check="checkpoint-copy",
        )
    envelope = sign_manifest(manifest, ws.signing_key)
    (staging / ENVELOPE_NAME).write_text(json.dumps(envelope, sort_keys=True))
    for path in staging.rglob("*"):
        if path.is_file():
            path.chmod(0o444)
    return manifest


def publish_checkpoint(
    ws: Workspace,
    directory: str | os.PathLike[str],
    *,
    model: str,
    version: str,
    chunk_size: int,
    block_size: int,
) -> PublishedCheckpoint:
    """Copy DIR to the immutable origin ``checkpoints/<model>/<version>/`` and sign a manifest."""
    validate_names(model, version)
    source = Path(directory)
    if not source.is_dir():
        raise UsageError(
            "checkpoint directory does not exist", object=str(source), check="checkpoint-dir"
        )
    target = version_dir(ws, model, version)
    if target.exists():
        raise _already_published(model, version)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{version}.", dir=target.parent))
    try:
        options = PublishOptions(chunk_size=chunk_size, block_size=block_size)
        manifest = _stage(ws, source, staging, model, version, options)
        try:
            os.rename(staging, target)
        except OSError:
            raise _already_published(model, version) from None
    finally:
        if staging.exists():
            shutil.rmtree(staging, ignore_errors=True)
    return published_from_manifest(ws, manifest)


def published_from_manifest(ws: Workspace, manifest: CheckpointManifest) -> PublishedCheckpoint:
    """The published-version record of a verified manifest (paths from the workspace)."""
    target = version_dir(ws, manifest.model, manifest.version)
    return PublishedCheckpoint(
        model=manifest.model,
        version=manifest.version,
        manifest_digest=manifest.digest,
        origin_uri=str(target / ORIGIN_NAME),
        manifest_uri=str(target / ENVELOPE_NAME),
        files=len(manifest.files),
        bytes=manifest.total_size,
    )
