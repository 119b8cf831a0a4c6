"""Which versions are retained right now, and who holds each one.

A version (snapshot or release) is retained while anything holds it:

* an alias: its active digest, every digest inside its rollback window (the last
  ``rollback_window`` generations), its last ``keep_last`` distinct digests, and any
  digest retired less than ``keep_days`` ago;
* a run that has not ended (FINISHED, CANCELLED, REVOKED, FAILED), and an open permit;
* an explicit or checkpoint pin that is held and not expired;
* a reader lease that is live;
* its own progress: snapshots BUILDING/VALIDATED/APPROVED and releases
  STAGED/VERIFIED/APPROVED are still on their way to an alias.

A version a tombstone hit (a ``fence_hits`` row of the tombstone fence) is refused for
activation, rollback and admission, so no alias generation and no progress holds it: only
a run, a permit, a pin or a reader lease does, and once they end its shards (the erased
sample's bytes) are collected.

A retained release retains its snapshot.  Everything here is read on the connection the
caller gives, so inside :meth:`Database.gate_tx` the answer is ordered against every pin,
lease and sweep batch.
"""

from __future__ import annotations

import datetime as dt
from collections import defaultdict
from collections.abc import Sequence
from typing import Any, Self

from pydantic import Field, model_validator
from sqlalchemy import Connection

from relgate.catalog import alias_table
from relgate.catalog.alias_table import AliasStep
from relgate.catalog.db import Database, execute, one, rows, utcnow
from relgate.catalog.states import RUN_TERMINAL_STATES
from relgate.errors import UsageError
from relgate.integrity.contract import Contract

IN_PROGRESS = {
    "snapshot": ("BUILDING", "VALIDATED", "APPROVED"),
    "release": ("STAGED", "VERIFIED", "APPROVED"),
}
#: Runs hold their root for their lifetime: every state but a terminal one.
TERMINAL_RUN_STATES = RUN_TERMINAL_STATES


def parse_time(text: str) -> dt.datetime:
    value = text.rstrip("Z")
    fmt = "%Y-%m-%dT%H:%M:%S.%f" if "." in value else "%Y-%m-%dT%H:%M:%S"
    return dt.datetime.strptime(value, fmt).replace(tzinfo=dt.UTC)


def format_time(moment: dt.datetime) -> str:
    return moment.astimezone(dt.UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


def now_utc() -> dt.datetime:
    return parse_time(utcnow())


class RetentionPolicy(Contract):
    """How long an alias keeps the versions it pointed at."""

    alias: str
    keep_last: int = 2
    keep_days: int = 7
    rollback_window: int = 1
    keep_raw_sources: bool = True

    def __init__(
        self,
        alias: str,
        keep_last: int = 2,
        keep_days: int = 7,
        rollback_window: int = 1,
        keep_raw_sources: bool = True,
    ) -> None:
        fields: dict[str, Any] = {
            "alias": alias,
            "keep_last": keep_last,
            "keep_days": keep_days,
            "rollback_window": rollback_window,
            "keep_raw_sources": keep_raw_sources,
        }
        super().__init__(**fields)

    @model_validator(mode="after")
    def _bounds(self) -> Self:
        if self.keep_last < 1 or self.keep_days < 0 or self.rollback_window < 0:
            raise UsageError(
                "keep-last must be >= 1; keep-days and rollback-window >= 0",
                object=self.alias,
                check="retention-policy",
            )
        return self


class RetainedVersion(Contract):
    """One retained version and everything that holds it."""

    kind: str
    subject: str = Field(validation_alias="digest", serialization_alias="digest")
    held_by: list[str]


def set_policy(db: Database, policy: RetentionPolicy) -> RetentionPolicy:
    # Through the gate: a policy change moves what is retained, so it is ordered
    # against sweep batches like a pin is.
    with db.gate_tx() as conn:
        execute(conn, "DELETE FROM retention_policies WHERE alias = :a", {"a": policy.alias})
        execute(
            conn,
            "INSERT INTO retention_policies (alias, keep_last, keep_days, rollback_window,"
            " keep_raw_sources, updated_at) VALUES (:a, :n, :d, :w, :r, :now)",
            {
                "a": policy.alias,
                "n": policy.keep_last,
                "d": policy.keep_days,
                "w": policy.rollback_window,
                "r": 1 if policy.keep_raw_sources else 0,
                "now": utcnow(),
            },
        )
    return policy


def get_policy(conn: Connection, alias: str) -> RetentionPolicy:
    row = one(conn, "SELECT * FROM retention_policies WHERE alias = :a", {"a": alias})
    if row is None:
        return RetentionPolicy(alias)
    return RetentionPolicy(
        alias,
        int(row["keep_last"]),
        int(row["keep_days"]),
        int(row["rollback_window"]),
        bool(row["keep_raw_sources"]),
    )


def alias_holds(
    history: Sequence[AliasStep],
    active: str | None,
    policy: RetentionPolicy,
    now: dt.datetime,
) -> dict[str, list[str]]:
    """Digest -> reasons an alias with this history still holds it."""
    held: dict[str, list[str]] = defaultdict(list)
    if active:
        held[active].append("active")
    ordered = sorted(history, key=lambda step: step.generation)
    if not ordered:
        return dict(held)
    current = ordered[-1].generation
    for step in ordered:
        gen = step.generation
        if gen < current and current - gen <= policy.rollback_window:
            held[step.digest].append(f"rollback window (generation {gen})")
    recent: list[str] = []
    for step in reversed(ordered):
        if step.digest not in recent:
            recent.append(step.digest)
    for digest in recent[: policy.keep_last]:
        held[digest].append(f"keep last {policy.keep_last}")
    # Retired = replaced by another digest after its last holding generation.
    last_held: dict[str, int] = {}
    for index, step in enumerate(ordered):
        last_held[step.digest] = index
    for digest, index in last_held.items():
        if digest == active or index + 1 >= len(ordered):
            continue
        retired = parse_time(ordered[index + 1].at)
        if now - retired < dt.timedelta(days=policy.keep_days):
            held[digest].append(f"retired {format_time(retired)} < {policy.keep_days} days")
    return dict(held)


#: (kind, digest) -> why it is retained (the collector's working form; see holders_of).
Holders = dict[tuple[str, str], list[str]]


def holders_of(held: Holders) -> list[RetainedVersion]:
    """The typed, sorted form of :data:`Holders` (one entry per version, holders deduped)."""
    return [
        RetainedVersion(kind=kind, subject=digest, held_by=sorted(set(reasons)))
        for (kind, digest), reasons in sorted(held.items())
    ]


def _kind_of(conn: Connection, digest: str) -> str | None:
    if one(conn, "SELECT 1 AS x FROM releases WHERE digest = :d", {"d": digest}):
        return "release"
    if one(conn, "SELECT 1 AS x FROM snapshots WHERE digest = :d", {"d": digest}):
        return "snapshot"
    return None


def retained_versions(conn: Connection, now: dt.datetime) -> Holders:
    """(kind, digest) -> why it is retained; read on ``conn`` (use the gate to order it).

    This is the one definition of "held": the collector keeps what it returns, and a
    fence advance records hits on (and closes the permits of) every root it returns.
    """
    held: Holders = defaultdict(list)
    _alias_holders(conn, now, held)
    _progress_holders(conn, held)
    # A version a tombstone hit can never be activated, rolled back to or admitted again:
    # its alias generations and its progress hold nothing; only runs, pins and leases do.
    erased = erased_versions(conn)
    for key in [k for k in held if k[1] in erased]:
        del held[key]
    _run_holders(conn, held)
    _pin_holders(conn, format_time(now), held)
    # A retained release needs its snapshot (membership, provenance, re-verification).
    for kind, digest in list(held):
        if kind == "release":
            parent = one(
                conn, "SELECT snapshot_digest FROM releases WHERE digest = :d", {"d": digest}
            )
            if parent is not None:
                held[("snapshot", parent["snapshot_digest"])].append(
                    f"snapshot of release {digest}"
                )
    return dict(held)


def erased_versions(conn: Connection) -> set[str]:
    """Digests of the versions a tombstone hit (recorded by the fence advance)."""
    found = rows(
        conn, "SELECT DISTINCT subject_digest FROM fence_hits WHERE fence_kind = 'tombstone'"
    )
    return {str(r["subject_digest"]) for r in found}


def _alias_holders(conn: Connection, now: dt.datetime, held: Holders) -> None:
    history: dict[str, list[AliasStep]] = defaultdict(list)
    for step in alias_table.steps(conn):
        history[step.name].append(step)
    for alias in alias_table.aliases(conn):
        policy = get_policy(conn, alias.name)
        for digest, reasons in alias_holds(
            history[alias.name], alias.active_digest, policy, now
        ).items():
            held[(str(alias.kind), digest)].extend(f"alias {alias.name}: {r}" for r in reasons)


def _run_holders(conn: Connection, held: Holders) -> None:
    marks = ", ".join(f"'{s}'" for s in TERMINAL_RUN_STATES)
    live_runs = f"SELECT run_id, root_digest FROM runs WHERE state NOT IN ({marks})"  # noqa: S608 constant run states
    for run in rows(conn, live_runs):
        held[("release", run["root_digest"])].append(f"run {run['run_id']}")
    for permit in rows(conn, "SELECT permit_id, root_digest FROM permits WHERE state = 'OPEN'"):
        held[("release", permit["root_digest"])].append(f"permit {permit['permit_id']}")


def pin_label(kind: str, pin_id: str, owner: str) -> str:
    return f"{kind} pin {pin_id} ({owner})"


def lease_label(lease_id: str, holder: str) -> str:
    return f"reader lease {lease_id} ({holder})"


def holder_expiries(conn: Connection) -> dict[str, str]:
    """Holder label -> when it lapses by itself (pins and reader leases with an expiry);
    runs, permits, aliases and unexpiring pins are absent: something must end them."""
    out: dict[str, str] = {}
    for pin in rows(
        conn,
        "SELECT pin_id, kind, owner, expires_at FROM pins"
        " WHERE state = 'HELD' AND expires_at IS NOT NULL",
    ):
        out[pin_label(pin["kind"], pin["pin_id"], pin["owner"])] = str(pin["expires_at"])
    for lease in rows(
        conn, "SELECT lease_id, holder, expires_at FROM leases WHERE state = 'ACTIVE'"
    ):
        out[lease_label(lease["lease_id"], lease["holder"])] = str(lease["expires_at"])
    return out


def _pin_holders(conn: Connection, stamp: str, held: Holders) -> None:
    for pin in rows(
        conn,
        "SELECT pin_id, kind, subject_kind, digest, owner, expires_at FROM pins"
        " WHERE state = 'HELD' AND (expires_at IS NULL OR expires_at > :now)",
        {"now": stamp},
    ):
        held[(pin["subject_kind"], pin["digest"])].append(
            pin_label(pin["kind"], pin["pin_id"], pin["owner"])
        )
    for lease in rows(
        conn,
        "SELECT lease_id, holder, digest FROM leases WHERE state = 'ACTIVE'"
        " AND digest IS NOT NULL AND expires_at > :now",
        {"now": stamp},
    ):
        kind = _kind_of(conn, lease["digest"])
        if kind:
            held[(kind, lease["digest"])].append(lease_label(lease["lease_id"], lease["holder"]))


def _progress_holders(conn: Connection, held: Holders) -> None:
    for kind, states in IN_PROGRESS.items():
        table = "snapshots" if kind == "snapshot" else "releases"
        marks = ", ".join(f"'{s}'" for s in states)
        sql = f"SELECT digest, state FROM {table} WHERE state IN ({marks})"  # noqa: S608 constant table names and states
        for row in rows(conn, sql):
            held[(kind, row["digest"])].append(f"in progress ({row['state']})")


def raw_sources_kept(conn: Connection) -> bool:
    """Raw-source retention is on unless every policy turned it off."""
    policies = rows(conn, "SELECT keep_raw_sources FROM retention_policies")
    return not policies or any(int(p["keep_raw_sources"]) for p in policies)
