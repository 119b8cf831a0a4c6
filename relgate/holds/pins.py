"""Pins and leases, acquired and released inside the gate transaction.

A pin names one version and says who needs it and why.  Acquiring it runs in
:meth:`Database.gate_tx`, the same transaction order every sweep batch deletes in, so a
pin either commits before a batch (the batch sees it and keeps every object the version
references) or after (the pin checks that no object it needs was deleted, and is refused,
naming the object, if one was).  There is no third order.

Leases are the short-lived form: an in-progress publisher leases the keys it is staging,
an active reader leases the version it reads; both renew before ``expires_at`` and an
expired lease protects nothing.
"""

from __future__ import annotations

import datetime as dt
import json
import uuid
from collections.abc import Iterable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from pydantic import Field, JsonValue
from sqlalchemy import Connection

from relgate.catalog.db import execute, one, rows, utcnow
from relgate.errors import ConflictError, NotFoundError, RejectedError, RelgateError, UsageError
from relgate.holds.refs import Ref, cas_refs, version_refs
from relgate.holds.retention import format_time, now_utc, parse_time
from relgate.integrity.contract import Contract
from relgate.objects.layout import canonical_key
from relgate.workspace import Workspace

PIN_KINDS = ("explicit", "checkpoint")
LEASE_PURPOSES = ("publisher", "reader")
#: A publisher lease outlives any one staging step; it is renewed before every key is
#: written, so only a writer that stops renewing (crashed) loses its protection.
PUBLISHER_LEASE_TTL_SECONDS = 3600
#: Pin fields present on the wire only when set.
_OPTIONAL_PIN_FIELDS = ("position", "releasedBy", "expired")


class Pin(Contract):
    """A held (or released) pin on one version: who needs it, why, until when."""

    pin_id: str
    kind: str
    subject_kind: str
    subject: str = Field(validation_alias="digest", serialization_alias="digest")
    owner: str
    reason: str
    expires_at: str | None
    state: str
    created_at: str
    position: dict[str, JsonValue] | None = None
    released_by: str | None = None
    expired: bool | None = None

    def to_json(self, *, exclude_none: bool = False) -> dict[str, Any]:
        out = super().to_json(exclude_none=exclude_none)
        for name in _OPTIONAL_PIN_FIELDS:
            if out.get(name) is None:
                out.pop(name, None)
        return out


class Lease(Contract):
    """A publisher lease (the keys it stages) or a reader lease (the version it reads)."""

    lease_id: str
    holder: str
    purpose: str
    subject: str | None = Field(validation_alias="digest", serialization_alias="digest")
    state: str
    expires_at: str
    keys: list[str]


class DeletedRef(Contract):
    """A referenced object a garbage-collection run already deleted."""

    object_key: str
    version_id: str
    run_id: str
    reason: str


def subject_kind(conn: Connection, digest: str) -> str:
    if one(conn, "SELECT 1 AS x FROM releases WHERE digest = :d", {"d": digest}):
        return "release"
    if one(conn, "SELECT 1 AS x FROM snapshots WHERE digest = :d", {"d": digest}):
        return "snapshot"
    raise NotFoundError(
        "no snapshot or release has this digest", object="pin", check="exists", digest=digest
    )


def deleted_refs(conn: Connection, refs: Iterable[Ref]) -> list[DeletedRef]:
    """Which of ``refs`` a sweep has deleted (recorded in the same gate transaction)."""
    wanted = {(r.key, r.version_id) for r in refs}
    if not wanted:
        return []
    found = []
    keys = sorted({k for k, _ in wanted})
    for start in range(0, len(keys), 500):
        chunk = keys[start : start + 500]
        marks = ", ".join(f":k{i}" for i in range(len(chunk)))
        for row in rows(
            conn,
            "SELECT object_key, version_id, run_id, reason FROM gc_deletions"  # noqa: S608 bind-parameter names only
            f" WHERE object_key IN ({marks})",
            {f"k{i}": k for i, k in enumerate(chunk)},
        ):
            if (row["object_key"], row["version_id"]) in wanted:
                found.append(DeletedRef.model_validate(row))
    return found


def _check_complete(ws: Workspace, conn: Connection, digest: str, refs: list[Ref]) -> None:
    gone = deleted_refs(conn, refs)
    if gone:
        first = gone[0]
        raise RejectedError(
            "cannot pin: garbage collection already deleted an object this version needs",
            object=f"{first.object_key}@{first.version_id}",
            check="pin-objects-present",
            digest=digest,
            details={"deleted": len(gone), "gcRun": first.run_id},
        )
    for ref in refs:
        if ref.role == "raw-source":
            continue
        try:
            ws.store.head(ref.key, ref.version_id)
        except RelgateError:
            raise RejectedError(
                "cannot pin: an object this version needs is missing",
                object=ref.name,
                check="pin-objects-present",
                digest=digest,
            ) from None


def add_pin(
    ws: Workspace,
    digest: str,
    *,
    owner: str,
    reason: str,
    expires_at: str | None = None,
    kind: str = "explicit",
    position: Mapping[str, JsonValue] | None = None,
) -> Pin:
    """Pin a version (explicit pin, or a checkpoint pin with its saved input position)."""
    if kind not in PIN_KINDS:
        raise UsageError(f"pin kind must be one of {PIN_KINDS}", object="pin", check="pin-kind")
    if not owner or not reason:
        raise UsageError("a pin needs an owner and a reason", object="pin", check="pin-owner")
    if expires_at is not None:
        expires_at = format_time(parse_time(expires_at))
    if kind == "checkpoint" and (position is None or position.get("root") != digest):
        raise UsageError(
            "a checkpoint pin needs the saved input position of this release",
            object="pin",
            check="checkpoint-position",
            digest=digest,
        )
    # The manifest is read outside the gate (it can be large); the gate transaction then
    # decides against every sweep batch whether all of it is still there.
    with ws.db.tx() as conn:
        kind_of = subject_kind(conn, digest)
        try:
            refs = version_refs(ws, conn, kind_of, digest)
            if kind_of == "release":
                snap = one(
                    conn, "SELECT snapshot_digest FROM releases WHERE digest = :d", {"d": digest}
                )
                if snap is not None:  # a release row always names its snapshot
                    refs += version_refs(ws, conn, "snapshot", snap["snapshot_digest"])
        except RejectedError as exc:
            raise RejectedError(
                "cannot pin: the version's manifest is missing or unreadable",
                object=exc.object,
                check="pin-objects-present",
                digest=exc.digest,
                details=exc.details,
            ) from None
    if kind == "checkpoint" and kind_of != "release":
        raise UsageError(
            "a checkpoint pins a release", object="pin", check="checkpoint-subject", digest=digest
        )
    pin = {
        "pin_id": "pin-" + uuid.uuid4().hex[:16],
        "kind": kind,
        "subject_kind": kind_of,
        "digest": digest,
        "owner": owner,
        "reason": reason,
        "expires_at": expires_at,
        "position": json.dumps(position, sort_keys=True) if position is not None else None,
        "state": "HELD",
        "created_at": utcnow(),
    }
    with ws.db.gate_tx() as conn:
        _check_complete(ws, conn, digest, refs)
        execute(
            conn,
            "INSERT INTO pins (pin_id, kind, subject_kind, digest, owner, reason, expires_at, position,"
            " state, created_at) VALUES (:pin_id, :kind, :subject_kind, :digest, :owner, :reason,"
            " :expires_at, :position, :state, :created_at)",
            pin,
        )
    return _pin(pin)


def remove_pin(ws: Workspace, pin_id: str, *, actor: str) -> Pin:
    with ws.db.gate_tx() as conn:
        row = one(conn, "SELECT * FROM pins WHERE pin_id = :p", {"p": pin_id})
        if row is None:
            raise NotFoundError("unknown pin", object=pin_id, check="exists")
        if row["state"] != "HELD":
            raise ConflictError(
                "pin already released", object=pin_id, check="pin-state", digest=row["digest"]
            )
        now = utcnow()
        execute(
            conn,
            "UPDATE pins SET state = 'RELEASED', released_at = :now WHERE pin_id = :p AND state = 'HELD'",
            {"now": now, "p": pin_id},
        )
        row.update(state="RELEASED", released_at=now)
    return _pin(row).model_copy(update={"released_by": actor})


def list_pins(ws: Workspace, *, include_released: bool = False) -> list[Pin]:
    sql = "SELECT * FROM pins" + ("" if include_released else " WHERE state = 'HELD'")  # noqa: S608 constant clauses
    with ws.db.tx() as conn:
        found = rows(conn, sql + " ORDER BY created_at, pin_id")
    now = format_time(now_utc())
    return [
        _pin(row).model_copy(
            update={"expired": row["expires_at"] is not None and row["expires_at"] <= now}
        )
        for row in found
    ]


def _pin(row: Mapping[str, Any]) -> Pin:
    position = row.get("position")
    return Pin(
        pin_id=row["pin_id"],
        kind=row["kind"],
        subject_kind=row["subject_kind"],
        subject=row["digest"],
        owner=row["owner"],
        reason=row["reason"],
        expires_at=row.get("expires_at"),
        state=row["state"],
        created_at=row["created_at"],
        position=json.loads(position) if position else None,
    )


# -- leases ---------------------------------------------------------------------------------


def _expiry(ttl_seconds: int) -> str:
    if ttl_seconds <= 0:
        raise UsageError("lease ttl must be positive", object="lease", check="ttl")
    return format_time(now_utc() + dt.timedelta(seconds=ttl_seconds))


def acquire_lease(
    ws: Workspace,
    *,
    holder: str,
    purpose: str,
    ttl_seconds: int,
    keys: Iterable[str] = (),
    digest: str | None = None,
) -> Lease:
    """A publisher leases the keys it stages; a reader leases the version it reads."""
    if purpose not in LEASE_PURPOSES:
        raise UsageError(
            f"lease purpose must be one of {LEASE_PURPOSES}", object="lease", check="purpose"
        )
    lease_id = "lease-" + uuid.uuid4().hex[:16]
    now = utcnow()
    with ws.db.gate_tx() as conn:
        if digest is not None:
            subject_kind(conn, digest)
        execute(
            conn,
            "INSERT INTO leases (lease_id, holder, purpose, digest, state, expires_at, created_at, renewed_at)"
            " VALUES (:l, :h, :p, :d, 'ACTIVE', :e, :now, :now)",
            {
                "l": lease_id,
                "h": holder,
                "p": purpose,
                "d": digest,
                "e": _expiry(ttl_seconds),
                "now": now,
            },
        )
        _add_keys(conn, lease_id, keys)
    return get_lease(ws, lease_id)


def _add_keys(conn: Connection, lease_id: str, keys: Iterable[str]) -> None:
    for key in sorted({canonical_key(k) for k in keys}):
        if one(
            conn,
            "SELECT 1 AS x FROM lease_objects WHERE lease_id = :l AND object_key = :k",
            {"l": lease_id, "k": key},
        ):
            continue
        execute(
            conn,
            "INSERT INTO lease_objects (lease_id, object_key) VALUES (:l, :k)",
            {"l": lease_id, "k": key},
        )


def _live(conn: Connection, lease_id: str) -> Mapping[str, Any]:
    row = one(conn, "SELECT * FROM leases WHERE lease_id = :l", {"l": lease_id})
    if row is None:
        raise NotFoundError("unknown lease", object=lease_id, check="exists")
    if row["state"] != "ACTIVE" or row["expires_at"] <= format_time(now_utc()):
        # An expired lease may already have been swept past: the holder must start over.
        raise ConflictError(
            "lease expired or released; re-acquire and re-stage",
            object=lease_id,
            check="lease-live",
            digest=row["digest"],
            details={"expiresAt": row["expires_at"], "state": row["state"]},
        )
    return row


def renew_lease(
    ws: Workspace, lease_id: str, *, ttl_seconds: int, keys: Iterable[str] = ()
) -> Lease:
    with ws.db.gate_tx() as conn:
        _live(conn, lease_id)
        execute(
            conn,
            "UPDATE leases SET expires_at = :e, renewed_at = :now WHERE lease_id = :l",
            {"e": _expiry(ttl_seconds), "now": utcnow(), "l": lease_id},
        )
        _add_keys(conn, lease_id, keys)
    return get_lease(ws, lease_id)


def release_lease(ws: Workspace, lease_id: str) -> Lease:
    with ws.db.gate_tx() as conn:
        execute(
            conn,
            "UPDATE leases SET state = 'RELEASED', renewed_at = :now WHERE lease_id = :l AND state = 'ACTIVE'",
            {"now": utcnow(), "l": lease_id},
        )
    return get_lease(ws, lease_id)


def get_lease(ws: Workspace, lease_id: str) -> Lease:
    with ws.db.tx() as conn:
        row = one(conn, "SELECT * FROM leases WHERE lease_id = :l", {"l": lease_id})
        if row is None:
            raise NotFoundError("unknown lease", object=lease_id, check="exists")
        keys = [
            r["object_key"]
            for r in rows(
                conn,
                "SELECT object_key FROM lease_objects WHERE lease_id = :l ORDER BY object_key",
                {"l": lease_id},
            )
        ]
    return Lease(
        lease_id=row["lease_id"],
        holder=row["holder"],
        purpose=row["purpose"],
        subject=row["digest"],
        state=row["state"],
        expires_at=row["expires_at"],
        keys=keys,
    )


def leased_keys(conn: Connection, now: dt.datetime) -> dict[str, str]:
    """Canonical key -> lease id, for every live publisher lease."""
    return {
        row["object_key"]: row["lease_id"]
        for row in rows(
            conn,
            "SELECT o.object_key, l.lease_id FROM lease_objects o JOIN leases l ON l.lease_id = o.lease_id"
            " WHERE l.state = 'ACTIVE' AND l.expires_at > :now",
            {"now": format_time(now)},
        )
    }


def source_pin_keys(entries: Iterable[object]) -> list[str]:
    """Canonical keys of the CAS documents a snapshot's frozen source entries pin."""
    return sorted({canonical_key(uri) for uri, _ in cas_refs(list(entries))})


@dataclass
class PublisherLease:
    """A live publisher lease held by a writer: :meth:`cover` adds a key (and renews the
    lease) *before* the key is written, so no sweep batch can take it in between."""

    ws: Workspace
    lease_id: str
    ttl_seconds: int = PUBLISHER_LEASE_TTL_SECONDS

    def cover(self, *keys: str) -> None:
        renew_lease(self.ws, self.lease_id, ttl_seconds=self.ttl_seconds, keys=keys)


@contextmanager
def publisher_lease(
    ws: Workspace, *, holder: str, ttl_seconds: int = PUBLISHER_LEASE_TTL_SECONDS
) -> Iterator[PublisherLease]:
    """Hold a publisher lease for the life of a staging step; released at the end (also on
    failure: what was staged then is an orphan, protected only by the grace period)."""
    lease = acquire_lease(ws, holder=holder, purpose="publisher", ttl_seconds=ttl_seconds)
    held = PublisherLease(ws, lease.lease_id, ttl_seconds)
    try:
        yield held
    finally:
        release_lease(ws, held.lease_id)
