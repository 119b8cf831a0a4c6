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
"""

from __future__ import annotations

import errno
import hashlib
import os
import shutil
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

from relgate.errors import NotFoundError, ObjectExistsError, UsageError
from relgate.objects.versioned import ObjectStore, ObjectVersion

_SEQ_WIDTH = 12
_MAX_NAME = 200  # bytes; directory names are limited to 255


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class LocalObjectStore(ObjectStore):
    kind = "local"

    def __init__(self, root: str | os.PathLike[str], *, fsync: bool = True) -> None:
        self.root = Path(root)
        self._keys = self.root / "keys"
        self._tmp = self.root / "tmp"
        self._fsync = fsync
        self._keys.mkdir(parents=True, exist_ok=True)
        self._tmp.mkdir(parents=True, exist_ok=True)

    def describe(self) -> str:
        return f"local:{self.root}"

    # -- paths ---------------------------------------------------------------------------
    def _key_dir(self, key: str) -> Path:
        if not key or key.startswith("/") or "\x00" in key:
            raise UsageError("invalid object key", object=repr(key), check="key-syntax")
        name = quote(key, safe="")
        if name.startswith("."):
            name = "%2E" + name[1:]
        if len(name) > _MAX_NAME:
            name = "~" + hashlib.sha256(key.encode()).hexdigest()
        return self._keys / name

    @staticmethod
    def _key_of(entry_name: str, path: Path) -> str:
        if entry_name.startswith("~"):
            return (path / "key").read_text(encoding="utf-8")
        return unquote(entry_name)

    def _ensure_key_dir(self, key: str) -> Path:
        key_dir = self._key_dir(key)
        key_dir.mkdir(parents=True, exist_ok=True)
        if key_dir.name.startswith("~") and not (key_dir / "key").exists():
            tmp = self._tmp / uuid.uuid4().hex
            tmp.write_text(key, encoding="utf-8")
            os.replace(tmp, key_dir / "key")
        return key_dir

    @staticmethod
    def _seqs(key_dir: Path) -> list[str]:
        try:
            names = os.listdir(key_dir)
        except FileNotFoundError:
            return []
        return sorted(n for n in names if n.isdigit())

    @staticmethod
    def _state(version_dir: Path) -> str | None:
        """'data', 'deleted', 'purged' or None for an interrupted claim."""
        for state in ("data", "deleted", "purged"):
            if (version_dir / state).exists():
                return state
        return None

    def _latest(self, key_dir: Path, seqs: list[str] | None = None) -> tuple[str, str] | None:
        for seq in reversed(self._seqs(key_dir) if seqs is None else seqs):
            state = self._state(key_dir / seq)
            if state in ("data", "deleted"):
                return seq, state
        return None

    # -- writes --------------------------------------------------------------------------
    def _assemble(self, state: str, data: bytes = b"") -> Path:
        """A complete version directory in tmp/: ``data`` (fsynced) or a ``deleted`` marker."""
        staged = self._tmp / uuid.uuid4().hex
        staged.mkdir()
        with open(staged / state, "xb") as fh:
            fh.write(data)
            if self._fsync:
                fh.flush()
                os.fsync(fh.fileno())
        if self._fsync:
            _fsync_dir(staged)
        return staged

    def _commit(self, key: str, staged: Path, *, only_if_absent: bool) -> str:
        key_dir = self._ensure_key_dir(key)
        try:
            while True:
                # The check and the target sequence number come from one listing: the
                # rename onto max+1 fails if anyone committed after that listing.
                seqs = self._seqs(key_dir)
                if only_if_absent:
                    latest = self._latest(key_dir, seqs)
                    if latest is not None and latest[1] == "data":
                        raise ObjectExistsError(
                            "object already exists", object=key, check="conditional-create"
                        )
                seq = f"{(int(seqs[-1]) + 1) if seqs else 1:0{_SEQ_WIDTH}d}"
                try:
                    os.rename(staged, key_dir / seq)
                except OSError as exc:
                    if exc.errno in (errno.EEXIST, errno.ENOTEMPTY):
                        continue  # another writer committed this sequence number first
                    raise
                if self._fsync:
                    _fsync_dir(key_dir)
                return seq
        finally:
            if staged.exists():
                shutil.rmtree(staged, ignore_errors=True)

    def put(self, key: str, data: bytes) -> ObjectVersion:
        self._key_dir(key)  # validate before staging
        seq = self._commit(key, self._assemble("data", data), only_if_absent=False)
        return ObjectVersion(key=key, version_id=seq, size=len(data))

    def create(self, key: str, data: bytes) -> ObjectVersion:
        self._key_dir(key)
        seq = self._commit(key, self._assemble("data", data), only_if_absent=True)
        return ObjectVersion(key=key, version_id=seq, size=len(data))

    def delete(self, key: str) -> None:
        key_dir = self._key_dir(key)
        latest = self._latest(key_dir)
        if latest is None or latest[1] == "deleted":
            return
        self._commit(key, self._assemble("deleted"), only_if_absent=False)

    def delete_version(self, key: str, version_id: str) -> None:
        vdir = self._key_dir(key) / version_id
        if self._state(vdir) != "data":
            raise NotFoundError(
                "no such object version", object=f"{key}@{version_id}", check="exists"
            )
        (vdir / "purged").touch()
        (vdir / "data").unlink()

    # -- reads ---------------------------------------------------------------------------
    def _data_path(self, key: str, version_id: str) -> Path:
        if not version_id.isdigit():
            raise NotFoundError(
                "no such object version", object=f"{key}@{version_id}", check="exists"
            )
        path = self._key_dir(key) / version_id / "data"
        if not path.exists():
            raise NotFoundError(
                "no such object version", object=f"{key}@{version_id}", check="exists"
            )
        return path

    def get(self, key: str, version_id: str) -> bytes:
        return self._data_path(key, version_id).read_bytes()

    def get_range(self, key: str, version_id: str, start: int, length: int) -> bytes:
        with open(self._data_path(key, version_id), "rb") as fh:
            fh.seek(start)
            return fh.read(length)

    def local_path(self, key: str, version_id: str) -> Path:
        """Zero-copy access for readers on the same machine (never for writing)."""
        return self._data_path(key, version_id)

    def head(self, key: str, version_id: str | None = None) -> ObjectVersion:
        key_dir = self._key_dir(key)
        latest = self._latest(key_dir)
        if version_id is None:
            if latest is None or latest[1] != "data":
                raise NotFoundError("no current version", object=key, check="exists")
            version_id = latest[0]
        path = self._data_path(key, version_id)
        return ObjectVersion(
            key=key,
            version_id=version_id,
            size=path.stat().st_size,
            is_latest=latest is not None and latest[0] == version_id,
        )

    def _keys_under(self, prefix: str) -> list[tuple[str, Path]]:
        out = []
        for entry in os.scandir(self._keys):
            key = self._key_of(entry.name, Path(entry.path))
            if key.startswith(prefix):
                out.append((key, Path(entry.path)))
        out.sort()
        return out

    def list(self, prefix: str = "") -> Iterator[ObjectVersion]:
        for key, key_dir in self._keys_under(prefix):
            latest = self._latest(key_dir)
            if latest is None or latest[1] != "data":
                continue
            size = (key_dir / latest[0] / "data").stat().st_size
            yield ObjectVersion(key=key, version_id=latest[0], size=size, is_latest=True)

    def list_versions(self, prefix: str = "") -> Iterator[ObjectVersion]:
        for key, key_dir in self._keys_under(prefix):
            latest = self._latest(key_dir)
            for seq in self._seqs(key_dir):
                data = key_dir / seq / "data"
                if data.exists():
                    yield ObjectVersion(
                        key=key,
                        version_id=seq,
                        size=data.stat().st_size,
                        is_latest=latest is not None and latest == (seq, "data"),
                    )
