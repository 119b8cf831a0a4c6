"""The embedded default: a versioned object store on the local filesystem.

Layout under ``root``::

    keys/<quoted key>/<seq>/data      one immutable version (renamed into place complete)
    keys/<quoted key>/<seq>/deleted   a delete marker
    keys/<quoted key>/<seq>/purged    a permanently deleted version (keeps <seq> from reuse)
    tmp/                              writes in flight

A version is claimed with ``mkdir`` of the next sequence number, which is atomic across
processes, and becomes visible only when its ``data`` file is renamed in complete and
fsynced.  A claimed directory without any of the three files is an interrupted write and
is invisible to readers.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote, unquote

from relgate.errors import NotFoundError, ObjectExistsError, UsageError
from relgate.objects.base import ObjectStore, ObjectVersion

_SEQ_WIDTH = 12


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
        return self._keys / quote(key, safe="")

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

    def _latest(self, key_dir: Path) -> tuple[str, str] | None:
        for seq in reversed(self._seqs(key_dir)):
            state = self._state(key_dir / seq)
            if state in ("data", "deleted"):
                return seq, state
        return None

    # -- writes --------------------------------------------------------------------------
    def _stage(self, data: bytes) -> Path:
        tmp = self._tmp / uuid.uuid4().hex
        with open(tmp, "xb") as fh:
            fh.write(data)
            if self._fsync:
                fh.flush()
                os.fsync(fh.fileno())
        return tmp

    def _claim(self, key_dir: Path, *, only_if_absent: bool) -> str:
        key_dir.mkdir(parents=True, exist_ok=True)
        while True:
            seqs = self._seqs(key_dir)
            if only_if_absent:
                latest = self._latest(key_dir)
                if latest is not None and latest[1] == "data":
                    raise ObjectExistsError(
                        "object already exists",
                        object=unquote(key_dir.name),
                        check="conditional-create",
                    )
            nxt = f"{(int(seqs[-1]) + 1) if seqs else 1:0{_SEQ_WIDTH}d}"
            try:
                os.mkdir(key_dir / nxt)
                return nxt
            except FileExistsError:
                if only_if_absent and self._state(key_dir / nxt) is None:
                    # Another creator claimed the slot and is still writing it: it wins.
                    raise ObjectExistsError(
                        "object is being created by another writer",
                        object=unquote(key_dir.name),
                        check="conditional-create",
                    ) from None
                continue

    def _write(self, key: str, data: bytes, *, only_if_absent: bool) -> ObjectVersion:
        key_dir = self._key_dir(key)
        tmp = self._stage(data)
        try:
            seq = self._claim(key_dir, only_if_absent=only_if_absent)
            os.rename(tmp, key_dir / seq / "data")
        except BaseException:
            with contextlib.suppress(FileNotFoundError):
                tmp.unlink()
            raise
        if self._fsync:
            _fsync_dir(key_dir / seq)
            _fsync_dir(key_dir)
        return ObjectVersion(key=key, version_id=seq, size=len(data))

    def put(self, key: str, data: bytes) -> ObjectVersion:
        return self._write(key, data, only_if_absent=False)

    def create(self, key: str, data: bytes) -> ObjectVersion:
        return self._write(key, data, only_if_absent=True)

    def delete(self, key: str) -> None:
        key_dir = self._key_dir(key)
        latest = self._latest(key_dir)
        if latest is None or latest[1] == "deleted":
            return
        seq = self._claim(key_dir, only_if_absent=False)
        (key_dir / seq / "deleted").touch()

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
            key = unquote(entry.name)
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
