"""Fault-injection helpers: read, rewrite and re-store real shard objects, and forge root
manifests signed with the workspace's trusted key (so only the verifier's own checks can
catch what was changed)."""

import copy
import io
import os
from dataclasses import dataclass

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
from relgate_trust.digests import sha256_digest

from relgate.catalog.release_table import get_release, insert_release
from relgate.catalog.snapshot_table import get_snapshot
from relgate.documents import release_root as rm
from relgate.documents import shard_format as rr
from relgate.documents import snapshot_manifest as sm
from relgate.release import crypto
from relgate.release.writer import ParquetParams, serialize_shard, shard_key, write_release
from relgate.snapshot import tokenizer
from relgate.snapshot.build import BuildSpec

RECORDS_PER_SHARD = 40


def shard_format(ws) -> rr.ShardFormat:
    """The shard format of the records the workspace builds (the demo's text records, with
    the tokenizer trained on its corpus)."""
    return rr.ShardFormat(BuildSpec.from_config(ws.config).records)


def write(ws, snapshot_digest, **kw):
    kw.setdefault("records_per_shard", RECORDS_PER_SHARD)
    return write_release(ws, snapshot_digest, actor="test", **kw)


def state(ws, digest):
    return get_release(ws.db, digest).state


def shard_path(ws, descriptor):
    key = shard_key(
        descriptor["digest"], encrypted=descriptor["mediaType"] == rm.ENCRYPTED_SHARD_MEDIA_TYPE
    )
    return ws.store.local_path(key, descriptor["objectVersion"])


def read_shard(ws, descriptor) -> pa.Table:
    data = shard_path(ws, descriptor).read_bytes()
    return pq.read_table(io.BytesIO(data))


def overwrite_in_place(path, data: bytes):
    """What a store without real versioning (or a bad actor with disk access) does."""
    os.chmod(path, 0o644)
    with open(path, "wb") as fh:
        fh.write(data)


def store_shard(ws, table: pa.Table, descriptor, member_schema, *, raw: bytes | None = None):
    """Serialize (unless ``raw``), store under the new digest, return a consistent descriptor
    whose per-shard digests are recomputed, so per-shard checks pass on the new bytes."""
    fmt = shard_format(ws)
    data = raw if raw is not None else serialize_shard(table, ParquetParams(), fmt)
    digest = sha256_digest(data)
    version = ws.store.create(shard_key(digest, encrypted=False), data).version_id
    return {
        **descriptor,
        "digest": digest,
        "size": len(data),
        "objectVersion": version,
        "logicalDigest": fmt.logical_digest(table),
        "records": table.num_rows,
        "tokens": int(pc.sum(table.column("tokens")).as_py() or 0),
        "memberSetDigest": rr.member_set_digest(table, member_schema),
    }


def tokens_of(ws, release, text: str) -> int:
    """What the snapshot's token rule (the trained tokenizer) counts for ``text``."""
    row = get_snapshot(ws.db, release.snapshot)
    snap = sm.load(ws.store, ws.trusted_keys, release.snapshot, row.envelope_version)
    counts = shard_format(ws).token_counts(pa.table({"text": [text]}), tokenizer.fetcher(ws, snap))
    return int(counts[0].as_py())


def member_schema(ws, release):
    row = get_snapshot(ws.db, release.snapshot)
    snap = sm.load(ws.store, ws.trusted_keys, release.snapshot, row.envelope_version)
    return snap.body["recordSchema"]


@dataclass(frozen=True)
class Forged:
    """A root as a forger signed it: sealed and signed, but maybe not a valid root model."""

    body: dict

    @property
    def digest(self) -> str:
        return str(self.body["rootId"])

    def document(self) -> dict:
        return self.body


def forge(ws, release, mutate, *, key=None, renumber=False):
    """A root manifest derived from ``release`` by ``mutate(body)``, signed and staged."""
    body = copy.deepcopy(release.document())
    mutate(body)
    if renumber:
        total = len(body["shards"])
        for i, d in enumerate(body["shards"]):
            d["id"] = rr.shard_id(i, total)
    shards = [d for d in body["shards"] if isinstance(d, dict)]
    body["totals"] = {
        "shards": len(body["shards"]),
        "records": sum(d.get("records", 0) for d in shards),
        "tokens": sum(d.get("tokens", 0) for d in shards),
        "bytes": sum(d.get("size", 0) for d in shards),
    }
    sealed = Forged(rm.seal_document(body))
    version = rm.store_envelope(ws.store, sealed.body, rm.sign(sealed.body, key or ws.signing_key))
    row = get_release(ws.db, release.digest)
    with ws.db.tx() as conn:
        insert_release(
            conn,
            sealed.body,
            members_digest=row.members_digest,
            members_version=row.members_version,
            envelope_version=version,
            actor="forger",
        )
    return sealed


def rewrite_record(table: pa.Table, index: int, **changes) -> pa.Table:
    rows = table.to_pylist()
    rows[index] = {**rows[index], **changes}
    return pa.Table.from_pylist(rows, schema=table.schema)


def encrypt_for(ws, plain: bytes, key: bytes, *, snapshot, shard, logical, key_version):
    aad = crypto.shard_aad(
        snapshot=snapshot,
        shard=shard,
        logical_digest=logical,
        record_schema=shard_format(ws).digest,
        key_version=key_version,
    )
    data = crypto.encrypt_shard(plain, key, aad, key_version=key_version)
    digest = sha256_digest(data)
    version = ws.store.create(shard_key(digest, encrypted=True), data).version_id
    return digest, len(data), version
