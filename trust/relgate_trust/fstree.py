"""Safe filesystem trees: one walker for every directory the agent (or the main package)
reads as a checkpoint, and no-follow helpers for every path component the agent creates.

``walk_checkpoint_tree`` is what ``relgate-agent manifest build``, ``relgate checkpoint
publish`` and the placement re-verification all use: it lists regular files only and
refuses, naming the path and the check,

* ``symlink``            -- any symlink (file or directory), never followed;
* ``device`` / ``fifo`` / ``socket`` / ``not-regular-file`` -- anything but a regular file;
* ``outside-directory``  -- an entry on another filesystem (a mount point inside the tree)
  or whose resolved path is not under the root;
* ``hard-link``          -- (only when asked) a file with more than one link, which may be
  a name for a file that lives outside the tree;
* ``unsafe-name``        -- a path component that is not a safe name (see manifest).

``write_file_atomic`` is how every small file the agent owns (keys, certificates) is
written: a temporary file in the same directory, fsynced, renamed over the target, and the
directory fsynced, so a crash leaves either the old file or the new one, never a torn one.

``open_beneath`` / ``mkdirs_beneath`` walk a relative path one component at a time with
``O_NOFOLLOW`` from a directory descriptor, so a symlink planted anywhere below the base
is refused instead of followed.
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
import tempfile
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

from relgate_trust.errors import ManifestError
from relgate_trust.names import validate_relative_path

# names of the checks, written once
CHECK_SYMLINK = "symlink"
CHECK_DEVICE = "device"
CHECK_FIFO = "fifo"
CHECK_SOCKET = "socket"
CHECK_NOT_REGULAR = "not-regular-file"
CHECK_OUTSIDE = "outside-directory"
CHECK_HARD_LINK = "hard-link"
CHECK_UNSAFE_NAME = "unsafe-name"


class UnsafePathError(ManifestError):
    """A path in a checkpoint tree (or below a models root) is not what it must be."""

    def __init__(self, path: str | os.PathLike[str], check: str, message: str) -> None:
        super().__init__(f"{path}: {message} (check {check})")
        self.path = str(path)
        self.check = check


@dataclass(frozen=True)
class TreeFile:
    rel: str  # '/'-separated path relative to the root
    path: Path
    size: int
    dev: int
    ino: int


def _kind_check(mode: int) -> tuple[str, str]:
    if stat.S_ISLNK(mode):
        return CHECK_SYMLINK, "is a symlink (symlinks are refused, never followed)"
    if stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        return CHECK_DEVICE, "is a device node"
    if stat.S_ISFIFO(mode):
        return CHECK_FIFO, "is a FIFO"
    if stat.S_ISSOCK(mode):
        return CHECK_SOCKET, "is a socket"
    return CHECK_NOT_REGULAR, "is not a regular file"


def walk_checkpoint_tree(
    root: str | os.PathLike[str], *, allow_hard_links: bool = True
) -> list[TreeFile]:
    """Every regular file under ``root`` sorted by relative path; refuses anything else."""
    base = Path(root)
    try:
        st_root = os.stat(base)  # the root itself may be reached through a symlink
    except OSError as exc:
        raise UnsafePathError(base, CHECK_NOT_REGULAR, f"cannot be read: {exc}") from exc
    if not stat.S_ISDIR(st_root.st_mode):
        raise UnsafePathError(base, CHECK_NOT_REGULAR, "is not a directory")
    real_root = os.path.realpath(base)
    out: list[TreeFile] = []

    def visit(d: Path, rel: str) -> None:
        with os.scandir(d) as it:
            entries = sorted(it, key=lambda e: e.name)
        for e in entries:
            p = d / e.name
            r = f"{rel}/{e.name}" if rel else e.name
            st = e.stat(follow_symlinks=False)
            try:
                validate_relative_path(r)
            except ManifestError as exc:
                raise UnsafePathError(p, CHECK_UNSAFE_NAME, str(exc)) from None
            if st.st_dev != st_root.st_dev:
                raise UnsafePathError(
                    p, CHECK_OUTSIDE, "is on another filesystem (a mount inside the tree)"
                )
            if stat.S_ISDIR(st.st_mode):
                visit(p, r)
                continue
            if not stat.S_ISREG(st.st_mode):
                check, why = _kind_check(st.st_mode)
                raise UnsafePathError(p, check, why)
            if not allow_hard_links and st.st_nlink > 1:
                raise UnsafePathError(
                    p, CHECK_HARD_LINK, f"has {st.st_nlink} links (may name a file outside)"
                )
            if os.path.commonpath([real_root, os.path.realpath(p)]) != real_root:
                raise UnsafePathError(p, CHECK_OUTSIDE, "resolves outside the directory")
            out.append(TreeFile(r, p, st.st_size, st.st_dev, st.st_ino))

    visit(base, "")
    out.sort(key=lambda f: f.rel)
    return out


# ---------------------------------------------------------------------------- no-follow opens

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | getattr(os, "O_CLOEXEC", 0)


def _open_dir_at(dir_fd: int, name: str, where: Path, create: bool) -> int:
    if create:
        with contextlib.suppress(FileExistsError):
            os.mkdir(name, 0o755, dir_fd=dir_fd)
    try:
        return os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
    except OSError as exc:
        if exc.errno in (errno.ELOOP, errno.ENOTDIR):
            st = os.lstat(name, dir_fd=dir_fd)
            check, why = (
                _kind_check(st.st_mode)
                if not stat.S_ISLNK(st.st_mode)
                else (CHECK_SYMLINK, "is a symlink where a directory must be (not followed)")
            )
            raise UnsafePathError(where, check, why) from None
        raise


def open_dir(path: Path) -> int:
    """Open a configured base directory (it may itself be a symlink: that is the admin's)."""
    return os.open(path, os.O_RDONLY | os.O_DIRECTORY | getattr(os, "O_CLOEXEC", 0))


def _dirs_beneath(base_fd: int, base: Path, parts: Iterable[str], *, create: bool) -> int:
    """Open (creating when asked) base/part1/part2/... without following any symlink."""
    fd = os.dup(base_fd)
    where = base
    try:
        for part in parts:
            where = where / part
            nfd = _open_dir_at(fd, part, where, create=create)
            os.close(fd)
            fd = nfd
    except BaseException:
        os.close(fd)
        raise
    return fd


def mkdirs_beneath(base_fd: int, base: Path, parts: Iterator[str] | list[str]) -> int:
    """Create (or open) base/part1/part2/... without following any symlink; returns a dir fd."""
    return _dirs_beneath(base_fd, base, parts, create=True)


def open_dirs_beneath(base_fd: int, base: Path, parts: list[str]) -> int:
    """Open base/part1/... (no creation, no symlinks); FileNotFoundError if missing."""
    return _dirs_beneath(base_fd, base, parts, create=False)


def open_beneath(
    base_fd: int, base: Path, rel: str, flags: int, mode: int = 0o644, create_dirs: bool = False
) -> int:
    """Open base/rel with O_NOFOLLOW on every component; the result must be a regular file."""
    *dirs, name = rel.split("/")
    parent = (
        mkdirs_beneath(base_fd, base, dirs)
        if create_dirs
        else open_dirs_beneath(base_fd, base, dirs)
    )
    where = base.joinpath(*dirs, name)
    try:
        try:
            # O_NONBLOCK: opening a planted FIFO must not block (cleared again below)
            fd = os.open(
                name,
                flags | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0),
                mode,
                dir_fd=parent,
            )
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise UnsafePathError(where, CHECK_SYMLINK, "is a symlink (not followed)") from None
            raise
    finally:
        os.close(parent)
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        check, why = _kind_check(st.st_mode)
        raise UnsafePathError(where, check, why)
    os.set_blocking(fd, True)
    return fd


def lstat_kind(path: Path) -> str:
    """'missing', 'dir', 'symlink' or 'other' (never follows the last component)."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return "missing"
    if stat.S_ISLNK(st.st_mode):
        return "symlink"
    return "dir" if stat.S_ISDIR(st.st_mode) else "other"


def write_file_atomic(path: Path, data: bytes, mode: int) -> None:
    """Replace ``path`` with ``data`` (mode ``mode``) atomically, creating its parent dirs."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        if os.path.exists(tmp):
            os.unlink(tmp)
        raise
    dfd = os.open(path.parent, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)
