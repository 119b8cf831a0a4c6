"""The reader training code uses: verified records of an assignment, in a deterministic
order for a seed, with an input position that resumes exactly.

Shards are read from their exact object versions and checked against the root manifest's
descriptor (size and storage digest) before a single record is decoded.  The order is a
pure function of (seed, pass, shard id, sampleId), so the same position always names the
same next record: save :meth:`ShardReader.position` beside a checkpoint, pass it back to
resume, and no sample is skipped or repeated.
"""

from __future__ import annotations

import hashlib
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq

from relgate.digests import sha256_digest
from relgate.errors import IntegrityError, RejectedError, UsageError
from relgate.release import crypto
from relgate.release import manifest as rm
from relgate.release import records as rr
from relgate.release.verifier import object_key
from relgate.workspace import Workspace


@dataclass(frozen=True)
class InputPosition:
    """Where a reader is: saved beside a checkpoint, it resumes the exact next record."""

    root: str
    seed: int
    shards: tuple[str, ...]
    data_pass: int = 0
    shard_cursor: int = 0
    record_cursor: int = 0

    def to_json(self) -> dict[str, Any]:
        out = asdict(self)
        out["shards"] = list(self.shards)
        return out

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> InputPosition:
        return cls(
            str(data["root"]),
            int(data["seed"]),
            tuple(data["shards"]),
            int(data["data_pass"]),
            int(data["shard_cursor"]),
            int(data["record_cursor"]),
        )


def _key(*parts: object) -> bytes:
    return hashlib.sha256("\x00".join(str(p) for p in parts).encode()).digest()


class ShardReader:
    def __init__(
        self,
        ws: Workspace,
        manifest: rm.ReleaseManifest,
        position: InputPosition,
        *,
        keys: Mapping[str, bytes] | None = None,
        passes: int = 1,
    ) -> None:
        if position.root != manifest.digest:
            raise RejectedError(
                "input position belongs to another root",
                object="input-position",
                check="root",
                digest=position.root,
                details={"manifest": manifest.digest},
            )
        self.ws = ws
        self.manifest = manifest
        self.keys = dict(keys or {})
        self.passes = passes
        self._by_id = {s["id"]: s for s in manifest.shards}
        missing = [s for s in position.shards if s not in self._by_id]
        if missing:
            raise UsageError(
                "position names shards that are not in the root",
                object="input-position",
                check="shards",
                digest=manifest.digest,
                details={"missing": missing},
            )
        self._pos = position
        self.bytes_read = 0
        self.records_read = 0

    @property
    def position(self) -> InputPosition:
        return self._pos

    def shard_order(self, data_pass: int) -> list[str]:
        seed = self._pos.seed
        return sorted(self._pos.shards, key=lambda s: _key(seed, data_pass, s))

    def load_shard(self, shard_id: str) -> pa.Table:
        """Exact version -> storage digest -> decrypt (if encrypted) -> decode -> logical digest."""
        d = self._by_id[shard_id]
        digest = str(d["digest"])
        data = self.ws.store.get(object_key(d), str(d["objectVersion"]))
        if len(data) != int(d["size"]) or sha256_digest(data) != digest:
            raise IntegrityError(
                "shard bytes do not match their descriptor",
                object=shard_id,
                check="storage-digest",
                digest=digest,
            )
        self.bytes_read += len(data)
        if d["mediaType"] == rm.ENCRYPTED_SHARD_MEDIA_TYPE:
            key_version = str(self.manifest.body["writer"].get("keyVersion"))
            key = self.keys.get(key_version)
            if key is None:
                raise RejectedError(
                    "no key for this shard's key version",
                    object=shard_id,
                    check="key-version",
                    digest=digest,
                    details={"keyVersion": key_version},
                )
            aad = crypto.shard_aad(
                snapshot=self.manifest.snapshot,
                shard=shard_id,
                logical_digest=str(d["logicalDigest"]),
                record_schema=str(self.manifest.body["recordSchema"]),
                key_version=key_version,
            )
            data = crypto.decrypt_shard(
                data, key, aad, key_version=key_version, shard=shard_id, digest=digest
            )
        table = pq.read_table(pa.BufferReader(data))
        if rr.logical_digest(table) != d["logicalDigest"]:
            raise IntegrityError(
                "decoded records differ from the descriptor's logical digest",
                object=shard_id,
                check="logical-digest",
                digest=str(d["logicalDigest"]),
            )
        return table

    def __iter__(self) -> Iterator[dict[str, Any]]:
        pos = self._pos
        for data_pass in range(pos.data_pass, self.passes):
            order = self.shard_order(data_pass)
            start_shard = pos.shard_cursor if data_pass == pos.data_pass else 0
            for shard_index in range(start_shard, len(order)):
                table = self.load_shard(order[shard_index])
                records = table.to_pylist()
                records.sort(key=lambda r: _key(pos.seed, data_pass, r["sampleId"]))
                start = (
                    pos.record_cursor
                    if (data_pass == pos.data_pass and shard_index == start_shard)
                    else 0
                )
                for record_index in range(start, len(records)):
                    # Advance first: a position saved after this record names the next one.
                    self._pos = InputPosition(
                        pos.root, pos.seed, pos.shards, data_pass, shard_index, record_index + 1
                    )
                    self.records_read += 1
                    yield records[record_index]
                self._pos = InputPosition(
                    pos.root, pos.seed, pos.shards, data_pass, shard_index + 1, 0
                )
            self._pos = InputPosition(pos.root, pos.seed, pos.shards, data_pass + 1, 0, 0)


def open_reader(
    ws: Workspace,
    root: str,
    shards: list[str],
    *,
    seed: int,
    position: dict[str, Any] | None = None,
    keys: Mapping[str, bytes] | None = None,
    passes: int = 1,
) -> ShardReader:
    from relgate.release.catalog import get_release

    manifest = rm.load(
        ws.store, ws.trusted_keys, root, get_release(ws.db, root)["envelope_version"]
    )
    pos = (
        InputPosition.from_json(position) if position else InputPosition(root, seed, tuple(shards))
    )
    return ShardReader(ws, manifest, pos, keys=keys, passes=passes)


try:  # torch stays optional: the adapter exists only where torch is installed
    import torch.utils.data as _torch_data

    class TorchShardDataset(_torch_data.IterableDataset):  # type: ignore[misc,unused-ignore]
        """PyTorch IterableDataset over a :class:`ShardReader` (state_dict = input position)."""

        def __init__(self, reader: ShardReader) -> None:
            self.reader = reader

        def __iter__(self) -> Iterator[dict[str, Any]]:
            return iter(self.reader)

        def state_dict(self) -> dict[str, Any]:
            return self.reader.position.to_json()

except ImportError:  # pragma: no cover - depends on the environment
    TorchShardDataset = None  # type: ignore[assignment,misc,unused-ignore]
