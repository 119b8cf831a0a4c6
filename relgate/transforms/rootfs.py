"""Image layers unpacked into a private root filesystem, refusing anything that escapes.

Each layer is a tar (optionally gzip).  Before extraction every member is checked here:
a relative path without ``..``; a regular file, directory, or a link whose target stays
inside the root (symlink targets resolved against the member's directory, hard links by
name); never a device, FIFO or socket.  The member sizes are summed against a bound.
Extraction then runs with :mod:`tarfile`'s ``"data"`` filter as a second line.  OCI
whiteouts (``.wh.<name>``) delete the named path of an earlier layer.
"""

from __future__ import annotations

import io
import posixpath
import shutil
import tarfile
from pathlib import Path, PurePosixPath
from typing import Final

from relgate.errors import RejectedError
from relgate.transforms import refusals
from relgate.transforms.wheel import safe_member_path

#: Largest total of unpacked bytes over all layers of one image.
MAX_ROOTFS_BYTES: Final = 1024 * 1024 * 1024
_WHITEOUT = ".wh."
_OPAQUE = ".wh..wh..opq"


def _escape(what: str, member: str, why: str) -> RejectedError:
    return RejectedError(
        f"layer member refused: {why}",
        object=what,
        check=refusals.UNPACK,
        details={"member": member[:200]},
    )


def _inside(path: str) -> bool:
    normal = posixpath.normpath(path)
    return not (normal.startswith("/") or normal == ".." or normal.startswith("../"))


def _check_member(member: tarfile.TarInfo, what: str) -> PurePosixPath:
    name = member.name.removeprefix("./") or "."
    path = PurePosixPath(".") if name == "." else safe_member_path(name, what)
    if member.issym():
        target = posixpath.join(posixpath.dirname(str(path)), member.linkname)
        if member.linkname.startswith("/") or not _inside(target):
            raise _escape(what, member.name, "symlink points outside the root")
    elif member.islnk():
        if member.linkname.startswith("/") or not _inside(member.linkname):
            raise _escape(what, member.name, "hard link points outside the root")
    elif not (member.isreg() or member.isdir()):
        raise _escape(what, member.name, "device, FIFO or other special file")
    return path


def _whiteout(root: Path, path: PurePosixPath) -> None:
    parent = root.joinpath(*path.parent.parts)
    if path.name == _OPAQUE:
        victims = list(parent.iterdir()) if parent.is_dir() and not parent.is_symlink() else []
    else:
        victims = [parent / path.name.removeprefix(_WHITEOUT)]
    for victim in victims:
        if victim.is_symlink() or victim.is_file():
            victim.unlink()
        elif victim.is_dir():
            shutil.rmtree(victim)


def unpack_layer(data: bytes, root: Path, *, gzip: bool, what: str, budget: int) -> int:
    """Unpack one layer into ``root``; the bytes it used from ``budget``."""
    try:
        archive = tarfile.open(fileobj=io.BytesIO(data), mode="r:gz" if gzip else "r:")  # noqa: SIM115 closed below
    except (tarfile.TarError, OSError, EOFError) as exc:
        raise RejectedError(
            "layer is not a tar archive",
            object=what,
            check=refusals.IMAGE,
            details={"cause": str(exc)[:200]},
        ) from None
    with archive:
        try:
            members = archive.getmembers()
        except (tarfile.TarError, OSError, EOFError) as exc:
            raise RejectedError(
                "layer is not a readable tar archive",
                object=what,
                check=refusals.IMAGE,
                details={"cause": str(exc)[:200]},
            ) from None
        used, keep = 0, []
        for member in members:
            path = _check_member(member, what)
            if path.name.startswith(_WHITEOUT):
                _whiteout(root, path)
                continue
            used += max(member.size, 0)
            keep.append(member)
        if used > budget:
            raise _escape(what, "*", "image unpacks to more than the size bound")
        try:
            archive.extractall(root, members=keep, filter="data")
        except (tarfile.TarError, OSError) as exc:
            raise _escape(
                what, getattr(exc, "tarinfo", tarfile.TarInfo("?")).name, str(exc)[:200]
            ) from None
    return used
