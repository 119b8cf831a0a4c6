"""The reader training code uses: verified records of an assignment, in a deterministic
order for a seed, with an input position that resumes exactly.

Reading needs admission (:func:`admit_read`, check ``reader-admission``): a root is opened
only for an admitted run whose permit is open on that root (``run=``), or for a
checkpoint pin holding a saved input position of that root (``pin=``, resume).  Either
way the root must be PUBLISHED, free of fence hits, its envelope must re-verify and the
release and its snapshot must carry signed approvals (the gate's one approval rule), all
decided in one admission transaction; before every record the reader checks again that
the permit (or pin) is still open on the root.  Looking at a root without a run is
:func:`audit_root`: a separate, recorded entry point that verifies shards and returns
counts, never records.

Shards are read from their exact object versions and checked against the root manifest's
descriptor (size and storage digest) before a single record is decoded.  The order is a
pure function of (seed, pass, shard id, sampleId), so the same position always names the
same next record: save :meth:`ShardReader.position` beside a checkpoint, pass it back to
resume, and no sample is skipped or repeated.

A reader holds a reader lease on its root for its life (renewed by a daemon thread before
it expires, released when the reader is exhausted or closed), so the collector keeps the
root's objects while it reads; a lease it could not renew stops the reader.  Before every
record (``revocation_check_every``) it asks the catalog whether a fence hit the root:
once one did, it refuses, naming the fence entry and the sample digest, and never yields
another record of that root.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import threading
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
from relgate_trust.digests import is_digest, sha256_digest
from relgate_trust.retry import Backoff, retry_call
from sqlalchemy import Connection

from relgate.catalog.db import one
from relgate.catalog.events import GateOperation, Outcome, record
from relgate.catalog.release_table import get_release
from relgate.catalog.versions import read_release
from relgate.documents import release_root as rm
from relgate.errors import IntegrityError, NotFoundError, RejectedError, RelgateError, UsageError
from relgate.gate.transitions import open_gate
from relgate.holds.pins import acquire_lease, release_lease, renew_lease
from relgate.holds.retention import format_time, now_utc
from relgate.integrity.contract import Contract
from relgate.objects.cas import ContentRef
from relgate.release import crypto
from relgate.runs.store import read_run, refuse_ended
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
    def from_json(cls, data: object) -> InputPosition:
        """A saved position read back (from a checkpoint pin, a file, a caller): hostile
        until it has exactly the six fields, each of its type, cursors not negative."""
        if not isinstance(data, dict) or set(data) != _POSITION_FIELDS:
            raise _bad_position(f"fields {sorted(_POSITION_FIELDS)}")
        root, shards = data["root"], data["shards"]
        counts = [data[name] for name in ("seed", "data_pass", "shard_cursor", "record_cursor")]
        if not is_digest(root):
            raise _bad_position("root is a sha256 digest")
        if not isinstance(shards, list) or not all(isinstance(s, str) for s in shards):
            raise _bad_position("shards is a list of shard ids")
        if not all(type(n) is int for n in counts) or min(counts[1:]) < 0:
            raise _bad_position("seed and cursors are integers, cursors not negative")
        return cls(root, counts[0], tuple(shards), *counts[1:])


_POSITION_FIELDS = frozenset(
    ("root", "seed", "shards", "data_pass", "shard_cursor", "record_cursor")
)


def _bad_position(rule: str) -> RejectedError:
    return RejectedError(
        f"a saved input position needs {rule}", object="input-position", check="schema"
    )


class ReaderLease:
    """A reader lease on one version, held for the holder's life.

    Acquired on construction, renewed by a daemon thread every third of its TTL, released
    by :meth:`close`.  An expired lease protects nothing, so once a renewal fails (the
    lease expired or was released) or none succeeded for a whole TTL, the lease is *lost*
    and :meth:`check` refuses: the holder must stop reading.
    """

    def __init__(self, ws: Workspace, digest: str, *, holder: str, ttl_seconds: int = 60) -> None:
        self.ws = ws
        self.digest = digest
        self.ttl = int(ttl_seconds)
        self.lease_id = str(
            acquire_lease(
                ws, holder=holder, purpose="reader", ttl_seconds=self.ttl, digest=digest
            ).lease_id
        )
        self.renewals = 0
        self._ok_at = time.monotonic()
        self._error: RelgateError | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(
            target=self._renew, name=f"lease-{self.lease_id}", daemon=True
        )
        self._thread.start()

    def _renew(self) -> None:
        interval = max(self.ttl / 3.0, 0.05)
        while not self._stop.wait(interval):
            try:
                # A transient catalog error is retried every interval, bounded by the TTL
                # (past it, :attr:`live` is False); a refusal ends the renewals for good.
                retry_call(
                    self._renew_once,
                    retry_on=Exception,
                    give_up=lambda exc: isinstance(exc, RelgateError),
                    backoff=Backoff(interval, multiplier=1.0),
                    stop_event=self._stop,
                )
            except RelgateError as exc:  # expired or released: it protects nothing now
                self._error = exc
                return
            except Exception:  # still failing when the reader closed: nothing to renew
                return

    def _renew_once(self) -> None:
        renew_lease(self.ws, self.lease_id, ttl_seconds=self.ttl)
        self._ok_at = time.monotonic()
        self.renewals += 1

    @property
    def live(self) -> bool:
        return (
            self._error is None
            and not self._stop.is_set()
            and time.monotonic() - self._ok_at < self.ttl
        )

    def check(self) -> None:
        if not self.live:
            raise RejectedError(
                "reader lease lost (expired, released or not renewed in time); reopen the reader",
                object=self.lease_id,
                check="reader-lease",
                digest=self.digest,
                details={"cause": self._error.check if self._error else None},
            )

    def close(self) -> None:
        if self._stop.is_set():
            return
        self._stop.set()
        self._thread.join(timeout=30)
        with contextlib.suppress(RelgateError):  # an unreleased lease expires on its own
            release_lease(self.ws, self.lease_id)

    def __enter__(self) -> ReaderLease:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def revocation(ws: Workspace, root: str) -> RejectedError | None:
    """The refusal for a root a fence entry hit, naming the fence and the sample digest."""
    with ws.db.tx() as conn:
        hit = one(
            conn,
            "SELECT fence_kind, fence_seq FROM fence_hits WHERE subject_digest = :d"
            " ORDER BY fence_kind, fence_seq LIMIT 1",
            {"d": root},
        )
        if hit is None:
            return None
        fence, seq = str(hit["fence_kind"]), int(hit["fence_seq"])
        sample_digest: str | None = None
        if fence == "benchmark":
            entry = one(
                conn, "SELECT content_digest FROM benchmark_items WHERE seq = :s", {"s": seq}
            )
            sample_digest = str(entry["content_digest"]) if entry else None
        else:
            entry = one(conn, "SELECT sample_id FROM tombstones WHERE seq = :s", {"s": seq})
            release = one(
                conn,
                "SELECT members_digest, members_version FROM releases WHERE digest = :d",
                {"d": root},
            )
            if entry is not None and release is not None:
                sample_digest = _sample_digest(ws, release, str(entry["sample_id"]))
    return RejectedError(
        f"root revoked: {fence} fence entry {seq} hit sample {sample_digest}",
        object=root,
        check="root-revoked",
        digest=sample_digest,
        details={"fence": fence, "fenceSeq": seq, "sampleDigest": sample_digest, "root": root},
    )


def _sample_digest(ws: Workspace, release: dict[str, Any], sample_id: str) -> str | None:
    """The logical content digest of a member (errors name digests, never sample ids)."""
    ref = ContentRef(str(release["members_digest"]), str(release["members_version"]), 0)
    try:
        found = (
            ws.membership.scan(ref)
            .filter(pl.col("sampleId") == sample_id)
            .select("logicalContentDigest")
            .collect()
        )
    except Exception:  # the refusal stands without the digest
        return None
    return str(found["logicalContentDigest"][0]) if found.height else None


def _key(*parts: object) -> bytes:
    return hashlib.sha256("\x00".join(str(p) for p in parts).encode()).digest()


def load_verified_shard(
    ws: Workspace, manifest: rm.ReleaseManifest, d: rm.ShardDescriptor, keys: Mapping[str, bytes]
) -> pa.Table:
    """One shard from its exact version, bounded by its recorded size (``size-mismatch``
    past it, before a byte is parsed), its storage digest, decrypted when encrypted,
    decoded and checked against its logical digest."""
    shard_id, digest = d.id, d.storage_digest
    data = ws.store.get(d.object_key, d.object_version, max_size=d.size)
    if len(data) != d.size or sha256_digest(data) != digest:
        raise IntegrityError(
            "shard bytes do not match their descriptor",
            object=shard_id,
            check="storage-digest",
            digest=digest,
        )
    if d.encrypted:
        key_version = str(manifest.key_version)
        key = keys.get(key_version)
        if key is None:
            raise RejectedError(
                "no key for this shard's key version",
                object=shard_id,
                check="key-version",
                digest=digest,
                details={"keyVersion": key_version},
            )
        aad = crypto.shard_aad(
            snapshot=manifest.snapshot,
            shard=shard_id,
            logical_digest=d.logical_digest,
            record_schema=manifest.record_schema,
            key_version=key_version,
        )
        data = crypto.decrypt_shard(
            data, key, aad, key_version=key_version, shard=shard_id, digest=digest
        )
    table = pq.read_table(pa.BufferReader(data))
    if manifest.shard_format().logical_digest(table) != d.logical_digest:
        raise IntegrityError(
            "decoded records differ from the descriptor's logical digest",
            object=shard_id,
            check="logical-digest",
            digest=d.logical_digest,
        )
    return table


#: The check a read for training without (or past) its admission is refused under.
READ_ADMISSION = "reader-admission"
#: The one state a root is read for training in.
READABLE_STATE = "PUBLISHED"


@dataclass(frozen=True)
class ReadAdmission:
    """What :func:`admit_read` decided: the root, and the open permit (of a run) or the
    held checkpoint pin (with its saved position) that the reader re-checks per record."""

    root: str
    run_id: str | None = None
    permit_id: str | None = None
    pin_id: str | None = None
    position: InputPosition | None = None


def _refused(message: str, root: str, *, obj: str, **details: object) -> RejectedError:
    return RejectedError(
        message, object=obj, check=READ_ADMISSION, digest=root, details=dict(details) or None
    )


def _run_permit(conn: Connection, run_id: str, root: str) -> str:
    """The open permit of a live run admitted on exactly ``root``."""
    run = read_run(conn, run_id)
    if run.root_digest != root:
        raise _refused(
            "the run was admitted on another root", root, obj=run_id, runRoot=run.root_digest
        )
    refuse_ended(run)
    permit = one(
        conn,
        "SELECT state, root_digest, closed_reason FROM permits WHERE permit_id = :p",
        {"p": run.permit_id},
    )
    if permit is None or permit["state"] != "OPEN" or permit["root_digest"] != root:
        raise RejectedError(
            f"permit closed: {permit['closed_reason'] if permit else 'missing'}",
            object=run_id,
            check="permit-closed",
            digest=root,
        )
    return run.permit_id


def _pin_position(conn: Connection, pin_id: str, root: str) -> InputPosition:
    """The saved input position of a held, unexpired checkpoint pin on exactly ``root``."""
    pin = one(conn, "SELECT * FROM pins WHERE pin_id = :p", {"p": pin_id})
    if pin is None:
        raise NotFoundError("unknown pin", object=pin_id, check="exists", digest=root)
    expired = pin["expires_at"] is not None and str(pin["expires_at"]) <= format_time(now_utc())
    if pin["kind"] != "checkpoint" or not pin["position"]:
        raise _refused(
            "only a checkpoint pin with a saved input position resumes", root, obj=pin_id
        )
    if pin["digest"] != root or pin["state"] != "HELD" or expired:
        raise _refused(
            "the pin does not hold this root", root, obj=pin_id, state=pin["state"], expired=expired
        )
    return InputPosition.from_json(json.loads(pin["position"]))


def admit_read(
    ws: Workspace, root: str, *, run: str | None = None, pin: str | None = None
) -> ReadAdmission:
    """Decide, in one admission transaction, whether ``root`` may be read for training.

    Exactly one of ``run`` (an admitted, live run whose permit is open on ``root``) or
    ``pin`` (a held checkpoint pin with a saved input position of ``root``).  The root
    must be PUBLISHED and pass :meth:`Gate.check_root` (no fence hit, watermarks, stored
    envelope, signed approvals of the release and its snapshot).  INVALID, unapproved,
    unpublished or revoked roots are refused; so is a read with neither (or both)."""
    if (run is None) == (pin is None):
        raise _refused(
            "reading a root for training needs an admitted run (run=) or a checkpoint pin"
            " holding a saved input position (pin=); audit_root looks at a root without one",
            root,
            obj=root,
        )
    gate = open_gate(ws)
    with ws.db.admission_tx() as conn:
        permit = _run_permit(conn, run, root) if run is not None else None
        position = _pin_position(conn, pin, root) if pin is not None else None
        state = read_release(conn, root).state
        if state != READABLE_STATE:
            raise RejectedError(
                f"release is {state}; roots are read for training when PUBLISHED only",
                object=run or pin or root,
                check="release-state",
                digest=root,
            )
        gate.check_root(conn, "release", root)
    return ReadAdmission(root=root, run_id=run, permit_id=permit, pin_id=pin, position=position)


class ShardReader:
    def __init__(
        self,
        ws: Workspace,
        manifest: rm.ReleaseManifest,
        position: InputPosition,
        *,
        admission: ReadAdmission,
        keys: Mapping[str, bytes] | None = None,
        passes: int = 1,
        lease: ReaderLease | None = None,
        revocation_check_every: int = 1,
    ) -> None:
        if revocation_check_every < 1:
            raise UsageError(
                "revocation_check_every must be at least 1", object="reader", check="revocation"
            )
        if admission.root != manifest.digest or (
            admission.permit_id is None and admission.pin_id is None
        ):
            raise _refused("no admission for this root", manifest.digest, obj="reader")
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
        self._by_id = {d.id: d for d in manifest.descriptors}
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
        self.admission = admission
        self.bytes_read = 0
        self.records_read = 0
        self.lease = lease
        self.check_every = revocation_check_every
        self._unchecked = revocation_check_every  # the first record is always checked
        if lease is not None:
            self._finalizer = weakref.finalize(self, lease.close)

    def guard(self) -> None:
        """Refuse if the lease was lost or a fence hit the root (before each record).

        One catalog round trip: is there a fence hit on the root, and is our lease still
        ACTIVE and unexpired (a lease released or expired behind our back protects
        nothing, so the reader stops at once rather than at the next renewal)."""
        if self.lease is not None:
            self.lease.check()
        self._unchecked += 1
        if self._unchecked < self.check_every:
            return
        self._unchecked = 0
        root = self.manifest.digest
        admitted = self.admission
        with self.ws.db.tx() as conn:
            row = one(
                conn,
                "SELECT (SELECT fence_seq FROM fence_hits WHERE subject_digest = :d LIMIT 1) AS hit,"
                " (SELECT state FROM leases WHERE lease_id = :l) AS lease_state,"
                " (SELECT expires_at FROM leases WHERE lease_id = :l) AS expires_at,"
                " (SELECT state FROM permits WHERE permit_id = :p AND root_digest = :d)"
                " AS permit_state,"
                " (SELECT state FROM pins WHERE pin_id = :pin AND digest = :d) AS pin_state,"
                " (SELECT state FROM releases WHERE digest = :d) AS root_state",
                {
                    "d": root,
                    "l": self.lease.lease_id if self.lease else "",
                    "p": admitted.permit_id or "",
                    "pin": admitted.pin_id or "",
                },
            )
        if row is None:  # a SELECT without FROM always returns its one row
            raise RelgateError("the catalog returned no row", object=root, check="catalog")
        if row["hit"] is not None:
            refusal = revocation(self.ws, root)
            self.close()
            if refusal is not None:
                raise refusal
        if row["root_state"] != READABLE_STATE:  # found INVALID (or moved) since admission
            self.close()
            raise RejectedError(
                f"release is {row['root_state']}; roots are read for training when PUBLISHED only",
                object=root,
                check="release-state",
                digest=root,
            )
        held = row["permit_state"] == "OPEN" if admitted.permit_id else row["pin_state"] == "HELD"
        if not held:  # the run ended, its permit closed, or the pin was released
            self.close()
            raise RejectedError(
                "the admission this reader was opened on has ended; reopen with an admitted run",
                object=admitted.run_id or admitted.pin_id or root,
                check="permit-closed",
                digest=root,
                details={"permit": row["permit_state"], "pin": row["pin_state"]},
            )
        if self.lease is not None and (
            row["lease_state"] != "ACTIVE" or str(row["expires_at"]) <= format_time(now_utc())
        ):
            self.close()
            raise RejectedError(
                "reader lease expired or released; reopen the reader",
                object=self.lease.lease_id,
                check="reader-lease",
                digest=root,
                details={"state": row["lease_state"], "expiresAt": row["expires_at"]},
            )

    def close(self) -> None:
        """Release the reader lease (idempotent); the reader reads nothing after this."""
        if self.lease is not None:
            self.lease.close()

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def position(self) -> InputPosition:
        return self._pos

    def shard_order(self, data_pass: int) -> list[str]:
        seed = self._pos.seed
        return sorted(self._pos.shards, key=lambda s: _key(seed, data_pass, s))

    def load_shard(self, shard_id: str) -> pa.Table:
        """Exact version -> storage digest -> decrypt (if encrypted) -> decode -> logical digest."""
        d = self._by_id[shard_id]
        table = load_verified_shard(self.ws, self.manifest, d, self.keys)
        self.bytes_read += d.size
        return table

    def __iter__(self) -> Iterator[dict[str, Any]]:
        try:
            yield from self._records()
        finally:
            # Exhausted, refused or abandoned: the reader's life is over.
            self.close()

    def _records(self) -> Iterator[dict[str, Any]]:
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
                    self.guard()
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


def open_reader(  # noqa: PLR0913 - the public keyword API training code calls
    ws: Workspace,
    root: str,
    shards: list[str],
    *,
    seed: int,
    run: str | None = None,
    pin: str | None = None,
    position: InputPosition | None = None,
    keys: Mapping[str, bytes] | None = None,
    passes: int = 1,
    lease: bool = True,
    lease_ttl: int = 60,
    holder: str = "reader",
    revocation_check_every: int = 1,
) -> ShardReader:
    """A verified reader over ``shards`` of ``root`` for an admitted ``run`` (its permit
    open on ``root``) or, to resume, a checkpoint ``pin`` (its saved position is where
    reading resumes unless ``position`` is given); holds a reader lease by default.

    Refuses at once if a fence already hit the root (``root-revoked``), and without an
    admission (``reader-admission``), on a root that is not PUBLISHED (``release-state``),
    unapproved (``approval``) or whose permit is closed (``permit-closed``).
    """
    refusal = revocation(ws, root)
    if refusal is not None:
        raise refusal
    admission = admit_read(ws, root, run=run, pin=pin)
    manifest = rm.load(ws.store, ws.trusted_keys, root, get_release(ws.db, root).envelope_version)
    if position is not None:
        pos = position
    elif admission.position is not None:
        pos = admission.position
    else:
        pos = InputPosition(root, seed, tuple(shards))
    held = ReaderLease(ws, root, holder=holder, ttl_seconds=lease_ttl) if lease else None
    try:
        return ShardReader(
            ws,
            manifest,
            pos,
            admission=admission,
            keys=keys,
            passes=passes,
            lease=held,
            revocation_check_every=revocation_check_every,
        )
    except BaseException:
        if held is not None:
            held.close()
        raise


class ShardAudit(Contract):
    """One shard of an audited root: verified from its exact version, never yielded."""

    id: str
    ok: bool
    records: int = 0
    check: str | None = None
    message: str | None = None


class RootAudit(Contract):
    """What :func:`audit_root` found: counts per shard, no records."""

    root: str
    state: str
    actor: str
    reason: str
    shards: tuple[ShardAudit, ...]

    @property
    def ok(self) -> bool:
        return all(s.ok for s in self.shards)


def audit_root(
    ws: Workspace,
    root: str,
    *,
    actor: str,
    reason: str,
    shards: list[str] | None = None,
    keys: Mapping[str, bytes] | None = None,
) -> RootAudit:
    """Audit a root without a run: the explicit, recorded entry point for looking at any
    root (INVALID, unapproved or revoked included).

    Each shard is checked as the training reader checks it (exact version, size, storage
    digest, decryption, logical digest) and counted; no record is returned, so nothing
    reaches a training process.  The audit is recorded first, as an ``audit-read`` gate
    event naming the actor and the reason."""
    if not actor.strip() or not reason.strip():
        raise UsageError("an audit needs an actor and a reason", object=root, check="audit-reason")
    release = get_release(ws.db, root)
    with ws.db.tx() as conn:
        record(
            conn,
            GateOperation.AUDIT_READ,
            Outcome.OK,
            subject=f"{actor}: {reason}",
            digest=root,
            check="audit",
        )
    manifest = rm.load(ws.store, ws.trusted_keys, root, release.envelope_version)
    wanted = shards if shards is not None else [d.id for d in manifest.descriptors]
    by_id = {d.id: d for d in manifest.descriptors}
    found = []
    for shard_id in wanted:
        d = by_id.get(shard_id)
        if d is None:
            raise UsageError(
                "no such shard in this root", object=shard_id, check="shards", digest=root
            )
        try:
            table = load_verified_shard(ws, manifest, d, keys or {})
        except RelgateError as exc:
            found.append(ShardAudit(id=shard_id, ok=False, check=exc.check, message=exc.message))
            continue
        found.append(ShardAudit(id=shard_id, ok=True, records=table.num_rows))
    return RootAudit(
        root=root, state=str(release.state), actor=actor, reason=reason, shards=tuple(found)
    )


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
