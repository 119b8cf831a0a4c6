"""Deletion propagation you can watch: where a tombstoned sample's bytes still are.

``relgate fence show TOMBSTONE --propagation`` answers, for one erased sample:

* every stored object under the managed prefixes that still holds its bytes: the shards
  of every release that has the sample as a member (found by membership, proven like
  ``relgate lineage``), each read from its exact pinned version and confirmed by its
  ``sampleId`` column (a shard that cannot be inspected, e.g. encrypted, is listed as
  holding it: the answer errs on the side of "not gone");
* who holds each one (the runs, permits, pins and reader leases that retain a version
  referencing it: a version a tombstone hit is held by nothing else, see
  :mod:`relgate.holds.retention`), and when it becomes deletable: when the last
  holder lapses (a pin's or lease's expiry) and the grace period since the collector
  first saw it has passed; ``None`` while a run or permit (or a pin without expiry) holds
  it: those end only when someone ends them;
* every shard of those releases a sweep already deleted (which sweep, when), and ``gone``
  once no managed object holds the sample's bytes.

A snapshot's own objects hold no record bytes (its membership table names the sample by
id and digest: that is the audit trail, kept under the audit policy and listed as such).
Raw sources outside the managed store are their owner's to erase and are not reported.
"""

from __future__ import annotations

import datetime as dt
import io

import pyarrow.parquet as pq
from sqlalchemy import Connection

from relgate.catalog.db import one, rows
from relgate.catalog.release_table import get_release
from relgate.documents import release_root as rm
from relgate.errors import NotFoundError, RelgateError
from relgate.holds.refs import descriptor_key
from relgate.holds.retention import (
    format_time,
    holder_expiries,
    now_utc,
    parse_time,
    retained_versions,
)
from relgate.integrity.contract import Contract, JsonObject
from relgate.lifecycle.lineage import lineage
from relgate.objects.layout import canonical_key
from relgate.runs.shard_fetch import fetch_shard
from relgate.workspace import Workspace

#: The shard column every record's sample id is in (relgate.documents.shard_format).
_SAMPLE_COLUMN = "sampleId"


class Holder(Contract):
    """Something that keeps a stored object, and when it lapses by itself (if ever)."""

    name: str
    until: str | None


class HeldObject(Contract):
    """A stored object version that still holds the erased sample's bytes."""

    key: str
    version_id: str
    size: int
    role: str
    releases: list[str]
    #: False when the object could not be read to confirm (encrypted, other format)
    inspected: bool
    held_by: list[Holder]
    #: when a sweep may delete it; None while a holder without an end holds it
    deletable_at: str | None


class ErasedObject(Contract):
    """A shard of a version that has the sample, deleted by a sweep (the ones that held
    the sample among them: a deleted shard can no longer be read to tell)."""

    key: str
    version_id: str
    gc_run: str
    at: str


class Propagation(Contract):
    """Where a tombstoned sample's bytes still are (``fence show --propagation``)."""

    sample_id: str
    tombstones: list[int]
    at: str
    grace_seconds: int
    versions: list[str]
    held: list[HeldObject]
    erased: list[ErasedObject]
    #: versions whose audit trail (signed manifest, membership table) names the sample
    audit_trail: list[str]
    #: no managed object holds the sample's bytes any more
    gone: bool


def tombstoned_sample(ws: Workspace, tombstone: str) -> tuple[str, list[int]]:
    """(sample id, its tombstone seqs) of a tombstone named by seq or by sample id."""
    with ws.db.tx() as conn:
        if tombstone.isdigit():
            row = one(
                conn, "SELECT sample_id FROM tombstones WHERE seq = :s", {"s": int(tombstone)}
            )
            sample = None if row is None else str(row["sample_id"])
        else:
            sample = tombstone
        seqs = [
            int(r["seq"])
            for r in rows(
                conn,
                "SELECT seq FROM tombstones WHERE sample_id = :s ORDER BY seq",
                {"s": sample or ""},
            )
        ]
    if sample is None or not seqs:
        raise NotFoundError("no such tombstone", object=tombstone, check="tombstone")
    return sample, seqs


def _holds(ws: Workspace, descriptor: JsonObject, sample: str) -> bool | None:
    """Does this stored shard hold the sample (None: stored, but it could not be read)."""
    try:
        data, _ = fetch_shard(ws.store, descriptor)
    except NotFoundError:
        return False
    except RelgateError:
        return None  # damaged: cannot confirm either way
    try:
        ids = pq.read_table(io.BytesIO(data), columns=[_SAMPLE_COLUMN])[_SAMPLE_COLUMN]
    except (OSError, KeyError, ValueError):
        return None  # encrypted or another shard format
    return sample in set(ids.to_pylist())


def _shards(ws: Workspace, digest: str) -> list[JsonObject]:
    """The shard descriptors of a release's signed root (none if its trail is gone)."""
    try:
        row = get_release(ws.db, digest)
        document = rm.load_document(ws.store, ws.trusted_keys, digest, row.envelope_version)
        return rm.wire_shards(document)
    except RelgateError:
        return []


def _first_seen(conn: Connection, key: str, version: str) -> str | None:
    row = one(
        conn,
        "SELECT first_seen FROM gc_seen WHERE object_key = :k AND version_id = :v",
        {"k": key, "v": version},
    )
    return None if row is None else str(row["first_seen"])


def _deletable_at(
    holders: list[Holder], first_seen: str | None, now: dt.datetime, grace: int
) -> str | None:
    if any(h.until is None for h in holders):
        return None
    seen = parse_time(first_seen) if first_seen else now
    moments = [
        seen + dt.timedelta(seconds=grace),
        *(parse_time(h.until) for h in holders if h.until),
    ]
    return format_time(max(moments))


def propagation(ws: Workspace, tombstone: str, *, grace_seconds: int) -> Propagation:
    sample, seqs = tombstoned_sample(ws, tombstone)
    moment = now_utc()
    found = lineage(ws, sample).versions
    releases = sorted(v.subject for v in found if v.kind == "release")
    objects: dict[tuple[str, str], tuple[JsonObject, set[str]]] = {}
    for digest in releases:
        for descriptor in _shards(ws, digest):
            pair = (descriptor_key(descriptor), str(descriptor["objectVersion"]))
            objects.setdefault(pair, (descriptor, set()))[1].add(digest)
    with ws.db.tx() as conn:
        retained = retained_versions(conn, moment)
        expiries = holder_expiries(conn)
        deletions = rows(
            conn, "SELECT run_id, object_key, version_id, at FROM gc_deletions ORDER BY id"
        )
        seen = {pair: _first_seen(conn, *pair) for pair in objects}
    held: list[HeldObject] = []
    for (key, version), (descriptor, owners) in sorted(objects.items()):
        contains = _holds(ws, descriptor, sample)
        if contains is False:
            continue
        names = sorted({r for d in owners for r in retained.get(("release", d), [])})
        holders = [Holder(name=n, until=expiries.get(n)) for n in names]
        held.append(
            HeldObject(
                key=key,
                version_id=version,
                size=int(str(descriptor["size"])),
                role="shard",
                releases=sorted(owners),
                inspected=contains is not None,
                held_by=holders,
                deletable_at=_deletable_at(holders, seen[(key, version)], moment, grace_seconds),
            )
        )
    wanted = {(canonical_key(k), v) for k, v in objects}
    erased = [
        ErasedObject(
            key=str(r["object_key"]),
            version_id=str(r["version_id"]),
            gc_run=str(r["run_id"]),
            at=str(r["at"]),
        )
        for r in deletions
        if (str(r["object_key"]), str(r["version_id"])) in wanted
    ]
    return Propagation(
        sample_id=sample,
        tombstones=seqs,
        at=format_time(moment),
        grace_seconds=grace_seconds,
        versions=[v.subject for v in found],
        held=held,
        erased=erased,
        audit_trail=sorted({v.subject for v in found}),
        gone=not held,
    )
