"""The embedded default: a versioned object store on the local filesystem.

Layout under ``root``::

    keys/<name>/<seq>/data      one immutable version
    keys/<name>/<seq>/deleted   a delete marker
    keys/<name>/<seq>/purged    a permanently deleted version (keeps <seq> from reuse)
    keys/<name>/key             the key itself, for names that had to be hashed
    tmp/                        versions being assembled

``<name>`` is the percent-quoted key (a leading dot quoted too, so ``.`` and ``..`` stay
ordinary keys), or ``~`` plus the SHA-256 of the key when the quoted form would not fit a
directory name.  A version is assembled complete in ``tmp/`` (data fsynced) and committed
by renaming its directory onto ``keys/<name>/<seq>``: a rename onto an existing non-empty
directory fails, so claiming the sequence number and publishing the bytes are one atomic
step and a half-written version is never visible.

The store never follows a symbolic link and never leaves its directory: every path under
``keys/`` and ``tmp/`` is opened one component at a time beneath a directory descriptor
with ``O_NOFOLLOW`` (directories ``O_DIRECTORY``, files must be regular), so a link
planted anywhere in the tree (a key directory, a version directory, a ``data`` file) is
reported (check ``store-symlink``, exit 3) and never read, written or deleted through.
Listings skip a planted link and record it in :attr:`LocalObjectStore.planted` (and log
it), so the garbage collector never sees it as a candidate.  Reads can be bounded:
``get(..., max_size=N)`` refuses a version larger than ``N`` (check ``size-mismatch``)
from its ``fstat`` before reading, and never reads more than ``N + 1`` bytes.
"""

from __future__ import annotations

import contextlib
import errno
import hashlib
import logging
import os
import shutil
import stat
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

from relgate_trust.fstree import UnsafePathError, open_dir, open_dirs_beneath

from relgate.errors import IntegrityError, NotFoundError, ObjectExistsError, UsageError
from relgate.objects.versioned import ObjectStore, ObjectVersion, Writable, size_refusal

_SEQ_WIDTH = 12
_MAX_NAME = 200  # bytes; directory names are limited to 255
_CHUNK = 1 << 20
#: The check a link planted inside the store is reported under.
PLANTED_LINK = "store-symlink"
_DIR = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# O_NONBLOCK: a FIFO planted as ``data`` must not block the open; it is refused below.
_FILE = os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
_STATES = ("data", "deleted", "purged")
_log = logging.getLogger(__name__)


def _planted(where: str, path: str) -> IntegrityError:
    return IntegrityError(
        "a symbolic link (or a non-regular file) was planted in the object store; not followed",
        object=where,
        check=PLANTED_LINK,
        details={"path": path},
    )


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


class LocalObjectStore(ObjectStore):
    kind = "local"

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root)
        self._keys = self.root / "keys"
        self._tmp = self.root / "tmp"
        self._fsync = fsync
        #: Links (and other non-regular entries) found planted in the tree, as paths
        #: relative to the store root; never followed.
        self.planted: list[str] = []
        self._keys.mkdir(parents=True, exist_ok=True)
        self._tmp.mkdir(parents=True, exist_ok=True)

    def describe(self) -> str:
        return f"local:{self.root}"

    # -- confined opens --------------------------------------------------------------------
    def _report(self, relpath: str) -> None:
        if relpath not in self.planted:
            self.planted.append(relpath)
            _log.warning("object store %s: planted link %s not followed", self.root, relpath)

    def _open_dir(self, parts: tuple[str, ...], where: str) -> int:
        """A directory descriptor for ``root/<parts>``, never through a link (the root
        itself is configured, and may be one)."""
        root_fd = open_dir(self.root)
        try:
            fd: int = open_dirs_beneath(root_fd, Path(), list(parts))
        except UnsafePathError as exc:
            self._report(exc.path)
            raise _planted(where, exc.path) from None
        finally:
            os.close(root_fd)
        return fd

    @contextlib.contextmanager
    def _dir(self, parts: tuple[str, ...], where: str) -> Iterator[int]:
        fd = self._open_dir(parts, where)
        try:
            yield fd
        finally:
            os.close(fd)

    def _open_file(self, dir_fd: int, name: str, where: str, relpath: str) -> int:
        """A regular file beneath ``dir_fd`` (a link or FIFO is refused, never opened)."""
        try:
            fd = os.open(name, _FILE, dir_fd=dir_fd)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                self._report(relpath)
                raise _planted(where, relpath) from None
            raise
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            os.close(fd)
            if stat.S_ISDIR(mode):  # damaged, not planted: unreadable, as a file read says
                raise IsADirectoryError(errno.EISDIR, "not a file", relpath)
            self._report(relpath)
            raise _planted(where, relpath)
        os.set_blocking(fd, True)
        return fd

    # -- paths ---------------------------------------------------------------------------
    def _key_name(self, key: str) -> str:
        if not key or key.startswith("/") or "\x00" in key:
            raise UsageError("invalid object key", object=repr(key), check="key-syntax")
        name = quote(key, safe="")
        if name.startswith("."):
            name = "%2E" + name[1:]
        if len(name) > _MAX_NAME:
            name = "~" + hashlib.sha256(key.encode()).hexdigest()
        return name

    def _key_dir(self, key: str) -> Path:
        return self._keys / self._key_name(key)

    def _key_of(self, entry_name: str, keys_fd: int) -> str | None:
        if not entry_name.startswith("~"):
            return unquote(entry_name)
        where = f"keys/{entry_name}/key"
        try:
            with self._dir(("keys", entry_name), where) as kfd:
                fd = self._open_file(kfd, "key", where, where)
        except FileNotFoundError:
            return None
        with os.fdopen(fd, "rb") as fh:
            return fh.read().decode("utf-8")

    def _ensure_key_dir(self, key: str) -> str:
        name = self._key_name(key)
        with self._dir(("keys",), key) as keys_fd:
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, dir_fd=keys_fd)
            if name.startswith("~"):
                with self._dir(("keys", name), key) as kfd:
                    if _lstat("key", kfd) is None:
                        with self._dir(("tmp",), key) as tmp_fd:
                            tmp = uuid.uuid4().hex
                            wfd = os.open(
                                tmp,
                                os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW,
                                0o644,
                                dir_fd=tmp_fd,
                            )
                            with os.fdopen(wfd, "wb") as fh:
                                fh.write(key.encode("utf-8"))
                            os.replace(tmp, "key", src_dir_fd=tmp_fd, dst_dir_fd=kfd)
        return name

    @staticmethod
    def _seqs_at(key_fd: int) -> list[str]:
        return sorted(n for n in os.listdir(key_fd) if n.isdigit())

    def _state_at(self, key_fd: int, seq: str, relpath: str) -> str | None:
        """'data', 'deleted', 'purged' or None for an interrupted claim (or a planted link)."""
        found = _lstat(seq, key_fd)
        if found is None:
            return None
        if not stat.S_ISDIR(found.st_mode):
            self._report(relpath)
            return None
        vfd = os.open(seq, _DIR, dir_fd=key_fd)
        try:
            for state in _STATES:
                entry = _lstat(state, vfd)
                if entry is None:
                    continue
                if stat.S_ISREG(entry.st_mode) or stat.S_ISDIR(entry.st_mode):
                    return state  # a directory: damaged, and unreadable when read
                self._report(f"{relpath}/{state}")
                return None
        finally:
            os.close(vfd)
        return None

    def _latest_at(
        self, key_fd: int, name: str, seqs: list[str] | None = None
    ) -> tuple[str, str] | None:
        for seq in reversed(self._seqs_at(key_fd) if seqs is None else seqs):
            state = self._state_at(key_fd, seq, f"keys/{name}/{seq}")
            if state in ("data", "deleted"):
                return seq, state
        return None

    def _latest(self, name: str, where: str) -> tuple[str, str] | None:
        try:
            with self._dir(("keys", name), where) as kfd:
                return self._latest_at(kfd, name)
        except FileNotFoundError:
            return None

    # -- writes --------------------------------------------------------------------------
    def _assemble(self, state: str, data: bytes = b"", source: Path | None = None) -> str:
        """A complete version directory in tmp/: ``data`` or the bytes of ``source``
        (copied in 1 MiB reads, fsynced) or a ``deleted`` marker; returns its name there."""
        staged = uuid.uuid4().hex
        with self._dir(("tmp",), "tmp") as tmp_fd:
            os.mkdir(staged, dir_fd=tmp_fd)
            sfd = os.open(staged, _DIR, dir_fd=tmp_fd)
            try:
                wfd = os.open(
                    state, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644, dir_fd=sfd
                )
                with os.fdopen(wfd, "wb") as fh:
                    if source is None:
                        fh.write(data)
                    else:
                        with open(source, "rb") as src:
                            shutil.copyfileobj(src, fh, _CHUNK)
                    if self._fsync:
                        fh.flush()
                        os.fsync(fh.fileno())
                if self._fsync:
                    os.fsync(sfd)
            finally:
                os.close(sfd)
        return staged

    def _commit(self, key: str, staged: str, *, only_if_absent: bool) -> str:
        name = self._ensure_key_dir(key)
        try:
            with self._dir(("tmp",), key) as tmp_fd, self._dir(("keys", name), key) as kfd:
                while True:
                    # The check and the target sequence number come from one listing: the
                    # rename onto max+1 fails if anyone committed after that listing.
                    seqs = self._seqs_at(kfd)
                    if only_if_absent:
                        latest = self._latest_at(kfd, name, seqs)
                        if latest is not None and latest[1] == "data":
                            raise ObjectExistsError(
                                "object already exists", object=key, check="conditional-create"
                            )
                    seq = f"{(int(seqs[-1]) + 1) if seqs else 1:0{_SEQ_WIDTH}d}"
                    try:
                        os.rename(staged, seq, src_dir_fd=tmp_fd, dst_dir_fd=kfd)
                    except OSError as exc:
                        if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                            continue  # another writer committed this sequence number first
                        raise
                    if self._fsync:
                        os.fsync(kfd)
                    return seq
        finally:
            leftover = self._tmp / staged
            if leftover.exists():
                shutil.rmtree(leftover, ignore_errors=True)

    def put(self, key: str, data: bytes) -> ObjectVersion:
        self._key_name(key)  # validate before staging
        seq = self._commit(key, self._assemble("data", data), only_if_absent=False)
        return ObjectVersion(key=key, version_id=seq, size=len(data))

    def create(self, key: str, data: bytes) -> ObjectVersion:
        self._key_name(key)
        seq = self._commit(key, self._assemble("data", data), only_if_absent=True)
        return ObjectVersion(key=key, version_id=seq, size=len(data))

    def put_file(self, key: str, source: Path) -> ObjectVersion:
        return self._store_file(key, source, only_if_absent=False)

    def create_file(self, key: str, source: Path) -> ObjectVersion:
        return self._store_file(key, source, only_if_absent=True)

    def _store_file(self, key: str, source: Path, *, only_if_absent: bool) -> ObjectVersion:
        """Stage a copy of ``source`` and commit it; its size is the copy's (the source may
        change after it was read)."""
        self._key_name(key)
        staged = self._assemble("data", source=source)
        with self._dir(("tmp",), "tmp") as tmp_fd:
            size = os.stat(f"{staged}/data", dir_fd=tmp_fd, follow_symlinks=False).st_size
        seq = self._commit(key, staged, only_if_absent=only_if_absent)
        return ObjectVersion(key=key, version_id=seq, size=size)

    def delete(self, key: str) -> None:
        latest = self._latest(self._key_name(key), key)
        if latest is None or latest[1] == "deleted":
            return
        self._commit(key, self._assemble("deleted"), only_if_absent=False)

    def delete_version(self, key: str, version_id: str) -> None:
        """Purge one version beneath its directory descriptor: a planted link (for the key,
        the version or its ``data``) is refused, never followed, and nothing outside the
        store is touched."""
        where = f"{key}@{version_id}"
        name = self._key_name(key)
        if not version_id.isdigit():
            raise NotFoundError("no such object version", object=where, check="exists")
        relpath = f"keys/{name}/{version_id}"
        try:
            vfd = self._open_dir(("keys", name, version_id), where)
        except FileNotFoundError:
            raise NotFoundError("no such object version", object=where, check="exists") from None
        try:
            data = _lstat("data", vfd)
            if data is None or _lstat("purged", vfd) is not None:
                raise NotFoundError("no such object version", object=where, check="exists")
            if stat.S_ISDIR(data.st_mode):
                raise IsADirectoryError(errno.EISDIR, "not a file", f"{relpath}/data")
            if not stat.S_ISREG(data.st_mode):
                self._report(f"{relpath}/data")
                raise _planted(where, f"{relpath}/data")
            os.close(os.open("purged", os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o644, dir_fd=vfd))
            os.unlink("data", dir_fd=vfd)
        finally:
            os.close(vfd)

    # -- reads ---------------------------------------------------------------------------
    def _open_data(self, key: str, version_id: str) -> int:
        """The ``data`` file of an exact version, opened beneath the store (never a link)."""
        where = f"{key}@{version_id}"
        if not version_id.isdigit():
            raise NotFoundError("no such object version", object=where, check="exists")
        name = self._key_name(key)
        try:
            with self._dir(("keys", name, version_id), where) as vfd:
                return self._open_file(vfd, "data", where, f"keys/{name}/{version_id}/data")
        except FileNotFoundError:
            raise NotFoundError("no such object version", object=where, check="exists") from None

    def _data_path(self, key: str, version_id: str) -> Path:
        os.close(self._open_data(key, version_id))  # exists, and no link on the way
        return self._key_dir(key) / version_id / "data"

    def get(self, key: str, version_id: str, *, max_size: int | None = None) -> bytes:
        fd = self._open_data(key, version_id)
        with os.fdopen(fd, "rb") as fh:
            if max_size is None:
                return fh.read()
            size = os.fstat(fd).st_size
            if size > max_size:  # refused before a byte is read
                raise size_refusal(key, version_id, max_size, size)
            data = fh.read(max_size + 1)
        if len(data) > max_size:  # grew between the fstat and the read
            raise size_refusal(key, version_id, max_size, len(data))
        return data

    def read_into(
        self, key: str, version_id: str, sink: Writable, *, max_size: int | None = None
    ) -> int:
        fd = self._open_data(key, version_id)
        with os.fdopen(fd, "rb") as fh:
            size = os.fstat(fd).st_size
            if max_size is not None and size > max_size:
                raise size_refusal(key, version_id, max_size, size)
            limit = size if max_size is None else max_size + 1
            copied = 0
            while chunk := fh.read(min(_CHUNK, limit - copied) or 1):
                copied += len(chunk)
                if max_size is not None and copied > max_size:
                    raise size_refusal(key, version_id, max_size, copied)
                sink.write(chunk)
        return copied

    def get_range(self, key: str, version_id: str, start: int, length: int) -> bytes:
        fd = self._open_data(key, version_id)
        with os.fdopen(fd, "rb") as fh:
            fh.seek(start)
            return fh.read(length)

    def local_path(self, key: str, version_id: str) -> Path:
        """Zero-copy access for readers on the same machine (never for writing); checked
        to be a regular file reached through no link when it is returned."""
        return self._data_path(key, version_id)

    def head(self, key: str, version_id: str | None = None) -> ObjectVersion:
        name = self._key_name(key)
        latest = self._latest(name, key)
        if version_id is None:
            if latest is None or latest[1] != "data":
                raise NotFoundError("no current version", object=key, check="exists")
            version_id = latest[0]
        fd = self._open_data(key, version_id)
        try:
            size = os.fstat(fd).st_size
        finally:
            os.close(fd)
        return ObjectVersion(
            key=key,
            version_id=version_id,
            size=size,
            is_latest=latest is not None and latest[0] == version_id,
        )

    def _keys_under(self, prefix: str) -> list[tuple[str, str]]:
        out = []
        with self._dir(("keys",), "keys") as keys_fd:
            for entry in os.scandir(keys_fd):
                if entry.is_symlink() or not entry.is_dir(follow_symlinks=False):
                    self._report(f"keys/{entry.name}")
                    continue
                key = self._key_of(entry.name, keys_fd)
                if key is not None and key.startswith(prefix):
                    out.append((key, entry.name))
        out.sort()
        return out

    def _data_size(self, key_fd: int, seq: str) -> int | None:
        """The size of a version's regular ``data`` file (None without one)."""
        found = _lstat(seq, key_fd)
        if found is None or not stat.S_ISDIR(found.st_mode):
            return None
        vfd = os.open(seq, _DIR, dir_fd=key_fd)
        try:
            data = _lstat("data", vfd)
        finally:
            os.close(vfd)
        if data is None or not (stat.S_ISREG(data.st_mode) or stat.S_ISDIR(data.st_mode)):
            return None
        return data.st_size

    def _listed(self, prefix: str, *, every: bool) -> Iterator[ObjectVersion]:
        for key, name in self._keys_under(prefix):
            try:
                kfd = self._open_dir(("keys", name), key)
            except (FileNotFoundError, IntegrityError):
                continue
            try:
                latest = self._latest_at(kfd, name)
                seqs = self._seqs_at(kfd) if every else ([latest[0]] if latest else [])
                for seq in seqs:
                    size = self._data_size(kfd, seq)
                    if size is None:
                        continue
                    yield ObjectVersion(
                        key=key,
                        version_id=seq,
                        size=size,
                        is_latest=latest is not None and latest == (seq, "data"),
                    )
            finally:
                os.close(kfd)

    def list(self, prefix: str = "") -> Iterator[ObjectVersion]:
        return self._listed(prefix, every=False)

    def list_versions(self, prefix: str = "") -> Iterator[ObjectVersion]:
        return self._listed(prefix, every=True)
