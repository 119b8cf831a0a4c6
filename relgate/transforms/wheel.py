"""Wheels, read as hostile input: bounded reads, no path escapes, name and version agreed.

A wheel is a zip (PEP 427).  Before anything is trusted: the archive and every member
are size-bounded (the declared sizes are not believed, the bytes read are counted),
member names must be relative POSIX paths without ``..``, symlinks are refused, the one
``*.dist-info/METADATA`` must name exactly one ``Name`` and ``Version`` and those must be
the ones the file name spells.
"""

from __future__ import annotations

import io
import os
import re
import stat
import zipfile
from dataclasses import dataclass
from email.parser import HeaderParser
from pathlib import Path, PurePosixPath
from typing import Final

from relgate.errors import RejectedError
from relgate.transforms import refusals

#: Largest wheel accepted (bytes of the zip).
MAX_WHEEL_BYTES: Final = 64 * 1024 * 1024
#: Largest total of unpacked member bytes, and of any one member.
MAX_UNPACKED_BYTES: Final = 256 * 1024 * 1024
#: Most members a wheel may have.
MAX_MEMBERS: Final = 10_000
#: Largest METADATA / entry_points.txt read.
MAX_METADATA_BYTES: Final = 1024 * 1024
#: The entry-point group a wheel names its transform in (when ``--entry-point`` is not given).
ENTRY_POINT_GROUP: Final = "relgate.transforms"

_FILENAME = re.compile(
    r"^(?P<name>[A-Za-z0-9](?:[A-Za-z0-9._]*[A-Za-z0-9])?)-(?P<version>[A-Za-z0-9_.!+]+)"
    r"(?:-(?P<build>\d[A-Za-z0-9_.]*))?-(?P<tags>[A-Za-z0-9_.]+-[A-Za-z0-9_.]+-[A-Za-z0-9_.]+)\.whl$"
)
_ENTRY_POINT = re.compile(
    r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*:[A-Za-z_][A-Za-z0-9_]*$"
)


def _refuse(why: str, what: str, **details: object) -> RejectedError:
    return RejectedError(
        f"wheel refused: {why}", object=what, check=refusals.PACKAGE, details=dict(details)
    )


@dataclass(frozen=True)
class WheelName:
    """What a wheel's file name spells (PEP 427)."""

    distribution: str
    version: str


def normalized_name(name: str) -> str:
    """PEP 503 normalisation, with ``_`` as wheels spell it."""
    return re.sub(r"[-_.]+", "_", name).lower()


def parse_filename(filename: str) -> WheelName:
    """Distribution and version from ``{name}-{version}(-{build})?-{py}-{abi}-{plat}.whl``."""
    match = _FILENAME.fullmatch(filename)
    if match is None or "/" in filename:
        raise _refuse("file name is not a wheel name", filename)
    return WheelName(match["name"], match["version"])


def parse_metadata(data: bytes, what: str = "METADATA") -> WheelName:
    """``Name`` and ``Version`` of a core-metadata file (exactly one of each)."""
    if len(data) > MAX_METADATA_BYTES:
        raise _refuse("METADATA is too large", what, size=len(data))
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse("METADATA is not UTF-8", what) from None
    headers = HeaderParser().parsestr(text, headersonly=True)
    names, versions = headers.get_all("Name") or [], headers.get_all("Version") or []
    if len(names) != 1 or len(versions) != 1:
        raise _refuse("METADATA must have exactly one Name and one Version", what)
    name, version = str(names[0]).strip(), str(versions[0]).strip()
    if not re.fullmatch(r"[A-Za-z0-9](?:[A-Za-z0-9._-]*[A-Za-z0-9])?", name) or not re.fullmatch(
        r"[A-Za-z0-9][A-Za-z0-9_.!+-]*", version
    ):
        raise _refuse("METADATA Name or Version is malformed", what)
    return WheelName(name, version)


def safe_member_path(name: str, what: str) -> PurePosixPath:
    """A member name as a relative path inside its directory, or refused."""
    path = PurePosixPath(name)
    if (
        not name
        or "\\" in name
        or "\x00" in name
        or path.is_absolute()
        or ".." in path.parts
        or re.match(r"^[A-Za-z]:", name)
    ):
        raise RejectedError(
            "archive member would escape its directory",
            object=what,
            check=refusals.UNPACK,
            details={"member": name[:200]},
        )
    return path


def _members(archive: zipfile.ZipFile, what: str) -> list[zipfile.ZipInfo]:
    infos = archive.infolist()
    if len(infos) > MAX_MEMBERS:
        raise _refuse("too many members", what, members=len(infos))
    seen: set[str] = set()
    for info in infos:
        safe_member_path(info.filename, what)
        mode = info.external_attr >> 16
        if stat.S_ISLNK(mode) or (stat.S_IFMT(mode) not in (0, stat.S_IFREG, stat.S_IFDIR)):
            raise RejectedError(
                "archive member is a link or a special file",
                object=what,
                check=refusals.UNPACK,
                details={"member": info.filename[:200]},
            )
        if info.filename in seen:
            raise _refuse("duplicate member", what, member=info.filename[:200])
        seen.add(info.filename)
    return infos


def _read_member(archive: zipfile.ZipFile, info: zipfile.ZipInfo, limit: int, what: str) -> bytes:
    """A member's bytes, counting what is actually decompressed (sizes are not believed)."""
    try:
        with archive.open(info) as handle:
            data = handle.read(limit + 1)
    except (zipfile.BadZipFile, OSError, EOFError, ValueError, NotImplementedError) as exc:
        raise _refuse(
            "member unreadable", what, member=info.filename[:200], cause=str(exc)[:200]
        ) from None
    if len(data) > limit:
        raise _refuse("member too large", what, member=info.filename[:200])
    return data


@dataclass(frozen=True)
class WheelFacts:
    """What was read from a wheel: name and version (agreed), and its entry point."""

    distribution: str
    version: str
    entry_point: str


def _open(data: bytes, what: str) -> zipfile.ZipFile:
    if len(data) > MAX_WHEEL_BYTES:
        raise _refuse("wheel is too large", what, size=len(data))
    try:
        return zipfile.ZipFile(io.BytesIO(data))
    except (zipfile.BadZipFile, OSError, ValueError) as exc:
        raise _refuse("not a zip archive", what, cause=str(exc)[:200]) from None


def _dist_info(infos: list[zipfile.ZipInfo], what: str) -> str:
    dirs = {
        i.filename.split("/", 1)[0]
        for i in infos
        if i.filename.split("/", 1)[0].endswith(".dist-info")
    }
    if len(dirs) != 1:
        raise _refuse("wheel must have exactly one .dist-info directory", what, found=len(dirs))
    return dirs.pop()


def _entry_point(
    archive: zipfile.ZipFile, names: dict[str, zipfile.ZipInfo], dist_info: str, what: str
) -> str:
    info = names.get(f"{dist_info}/entry_points.txt")
    if info is None:
        raise _refuse(f"no --entry-point given and no [{ENTRY_POINT_GROUP}] entry point", what)
    text = _read_member(archive, info, MAX_METADATA_BYTES, what).decode("utf-8", "replace")
    group, found = "", []
    for raw in text.splitlines():
        line = raw.strip()
        if line.startswith("[") and line.endswith("]"):
            group = line[1:-1].strip()
        elif group == ENTRY_POINT_GROUP and "=" in line:
            found.append(line.split("=", 1)[1].strip())
    if len(found) != 1:
        raise _refuse(
            f"wheel must name exactly one [{ENTRY_POINT_GROUP}] entry point", what, found=len(found)
        )
    return found[0]


def check_entry_point(entry_point: str, what: str) -> str:
    if not _ENTRY_POINT.fullmatch(entry_point):
        raise _refuse("entry point must be module:function", what, entryPoint=entry_point[:200])
    return entry_point


def read_wheel(data: bytes, filename: str, entry_point: str | None = None) -> WheelFacts:
    """Check a wheel's bytes and name; its distribution, version and entry point."""
    spelled = parse_filename(filename)
    with _open(data, filename) as archive:
        infos = _members(archive, filename)
        total = sum(i.file_size for i in infos)
        if total > MAX_UNPACKED_BYTES:
            raise _refuse("unpacked size too large", filename, size=total)
        dist_info = _dist_info(infos, filename)
        names = {i.filename: i for i in infos}
        meta = names.get(f"{dist_info}/METADATA")
        if meta is None:
            raise _refuse("no METADATA", filename)
        declared = parse_metadata(
            _read_member(archive, meta, MAX_METADATA_BYTES, filename), filename
        )
        chosen = entry_point or _entry_point(archive, names, dist_info, filename)
    if normalized_name(declared.distribution) != normalized_name(spelled.distribution) or (
        declared.version.replace("-", "_") != spelled.version
    ):
        raise _refuse(
            "METADATA name/version disagree with the file name",
            filename,
            metadata=f"{declared.distribution} {declared.version}",
            filename=f"{spelled.distribution} {spelled.version}",
        )
    if normalized_name(dist_info.removesuffix(".dist-info")) != normalized_name(
        f"{spelled.distribution}-{spelled.version}"
    ):
        raise _refuse(
            ".dist-info directory disagrees with the file name", filename, distInfo=dist_info
        )
    return WheelFacts(declared.distribution, declared.version, check_entry_point(chosen, filename))


def unpack_wheel(data: bytes, dest: Path, what: str) -> None:
    """Unpack every member under ``dest`` (regular files only, new files, bounded)."""
    with _open(data, what) as archive:
        budget = MAX_UNPACKED_BYTES
        for info in _members(archive, what):
            target = dest.joinpath(*safe_member_path(info.filename, what).parts)
            if info.is_dir():
                target.mkdir(parents=True, exist_ok=True)
                continue
            body = _read_member(archive, info, budget, what)
            budget -= len(body)
            target.parent.mkdir(parents=True, exist_ok=True)
            fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
            with os.fdopen(fd, "wb") as out:
                out.write(body)
