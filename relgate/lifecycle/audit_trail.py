"""The audit trail outlives the bytes: what garbage collection keeps of a collected version.

A version no longer retained loses its shards (the bulk of its bytes), never its audit
trail: its signed manifest (a snapshot's manifest, a release's root), its membership
table and every document the catalog records for it in ``reports`` (validation and
verification reports, provenance, signed approvals).  They are small next to the shards
and they answer "which samples did finished run R read", ``relgate lineage SAMPLE`` and
``relgate prove`` / ``check-proof`` for a version whose shards are gone.

How long: the workspace's audit retention policy (``relgate retention audit``), counted
from the version's creation; the default keeps the trail forever.  Objects past the policy
become ordinary candidates.  Nothing here fails a plan: an audit document already gone
(collected before this policy existed) is simply not kept.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from pydantic import Field, NonNegativeInt
from sqlalchemy import Connection

from relgate.catalog.db import Database, execute, one, rows, utcnow
from relgate.holds.refs import Ref, version_rows
from relgate.holds.retention import format_time
from relgate.integrity.contract import Contract
from relgate.objects.layout import cas_key, release_envelope_key, snapshot_envelope_key

_POLICY = "audit"
_ENVELOPE_KEY = {"snapshot": snapshot_envelope_key, "release": release_envelope_key}
_TABLE = {"snapshot": "snapshots", "release": "releases"}


class AuditPolicy(Contract):
    """How long a collected version's audit trail is kept (``None``: forever)."""

    keep_days: NonNegativeInt | None = None

    @property
    def forever(self) -> bool:
        return self.keep_days is None


class AuditKept(Contract):
    """A version no longer retained whose audit trail is kept, and what of it."""

    kind: str
    subject: str = Field(validation_alias="digest", serialization_alias="digest")
    state: str
    created_at: str
    objects: list[str]


def _role(subject_kind: str) -> str:
    if subject_kind.endswith("-approval"):
        return "approval"
    return "provenance" if subject_kind.endswith("provenance") else "report"


def get_audit_policy(conn: Connection) -> AuditPolicy:
    row = one(conn, "SELECT keep_days FROM audit_retention WHERE name = :n", {"n": _POLICY})
    if row is None or row["keep_days"] is None:
        return AuditPolicy()
    return AuditPolicy(keep_days=int(row["keep_days"]))


def set_audit_policy(db: Database, policy: AuditPolicy) -> AuditPolicy:
    """Through the gate: the policy moves what a sweep batch may delete."""
    with db.gate_tx() as conn:
        execute(conn, "DELETE FROM audit_retention WHERE name = :n", {"n": _POLICY})
        execute(
            conn,
            "INSERT INTO audit_retention (name, keep_days, updated_at) VALUES (:n, :d, :t)",
            {"n": _POLICY, "d": policy.keep_days, "t": utcnow()},
        )
    return policy


def audit_refs(
    conn: Connection,
    retained: Iterable[tuple[str, str]],
    now: dt.datetime,
    policy: AuditPolicy,
) -> tuple[list[Ref], list[AuditKept]]:
    """The audit documents of every version not retained and inside the policy, from the
    catalog alone (no manifest is opened: a collected version's trail is what it is)."""
    held = set(retained)
    cutoff = None if policy.forever else format_time(now - dt.timedelta(days=policy.keep_days or 0))
    refs: list[Ref] = []
    kept: list[AuditKept] = []
    for kind, table in _TABLE.items():
        found = rows(
            conn,
            f"SELECT digest, state, created_at FROM {table} ORDER BY created_at, digest",  # noqa: S608 constant table names
        )
        versions = [
            r
            for r in found
            if (kind, str(r["digest"])) not in held
            and (cutoff is None or str(r["created_at"]) >= cutoff)
        ]
        catalog = version_rows(conn, kind, [str(r["digest"]) for r in versions])
        for version in versions:
            digest = str(version["digest"])
            row = catalog.get(digest)
            if row is None:
                continue
            trail = [
                Ref(_ENVELOPE_KEY[kind](digest), row.envelope_version, "manifest", digest),
                Ref(cas_key(row.members_digest), row.members_version, "members", digest),
                *(Ref(cas_key(d), v, _role(k), digest) for k, d, v in row.reports),
            ]
            refs.extend(trail)
            kept.append(
                AuditKept(
                    kind=kind,
                    subject=digest,
                    state=str(version["state"]),
                    created_at=str(version["created_at"]),
                    objects=[f"{r.role} {r.name}" for r in trail],
                )
            )
    return refs, kept
