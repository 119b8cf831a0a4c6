"""What a version's state means now: the one rule ``show`` and ``lineage`` print.

A version's catalog state is forward-only: a snapshot stays ACTIVE and a release stays
PUBLISHED after its alias moved on or a fence hit it.  Printed as is, "is erased sample X
in any active release?" reads wrong.  :func:`standings` qualifies it:

* **fence-hit**: a tombstone or benchmark fence hit the version (a ``fence_hits`` row); the
  gate refuses to admit, activate, publish or roll back to it;
* **superseded**: an alias held it and now holds another digest, and no alias holds it now.

``state`` is then ``FENCE-HIT`` or ``SUPERSEDED`` instead of the live ACTIVE / PUBLISHED
(fence-hit first); ``catalogState`` keeps the row's own state and ``marks`` lists both.
"""

from __future__ import annotations

from collections.abc import Iterable

from pydantic import Field, StrictInt, StrictStr
from sqlalchemy import Connection

from relgate.catalog.db import rows
from relgate.integrity.contract import Contract, JsonObject

FENCE_HIT = "fence-hit"
SUPERSEDED = "superseded"
#: Catalog states that claim a version is in use: the ones a mark replaces when printed.
LIVE_STATES = frozenset({"ACTIVE", "PUBLISHED"})


class AliasMove(Contract):
    """An alias that held the version and now holds another digest."""

    alias: StrictStr
    generation: StrictInt
    now: StrictStr | None = Field(default=None, serialization_alias="activeDigest")


class Standing(Contract):
    """One version's qualified state (see the module docstring)."""

    catalog_state: StrictStr
    marks: tuple[StrictStr, ...] = ()
    current_on: tuple[StrictStr, ...] = ()
    superseded_on: tuple[AliasMove, ...] = ()
    fence_hit_count: StrictInt = 0

    @property
    def state(self) -> str:
        """``FENCE-HIT`` / ``SUPERSEDED`` for a marked live version, else the row's state."""
        if self.catalog_state in LIVE_STATES:
            for mark in (FENCE_HIT, SUPERSEDED):
                if mark in self.marks:
                    return mark.upper()
        return self.catalog_state

    def fields(self) -> JsonObject:
        """What a printed version carries: ``state`` qualified, the rest as is."""
        return {"state": self.state, **self.to_json()}


def standings(conn: Connection, states: dict[str, str]) -> dict[str, Standing]:
    """The standing of each digest in ``states`` (digest -> its catalog state)."""
    if not states:
        return {}
    digests = sorted(states)
    hits: dict[str, int] = {}
    for row in rows(
        conn, "SELECT subject_digest, COUNT(*) AS n FROM fence_hits GROUP BY subject_digest"
    ):
        if row["subject_digest"] in states:
            hits[str(row["subject_digest"])] = int(row["n"])
    current: dict[str, list[str]] = {}
    active = {}
    for row in rows(conn, "SELECT name, active_digest FROM aliases"):
        active[str(row["name"])] = row["active_digest"]
        if row["active_digest"] in states:
            current.setdefault(str(row["active_digest"]), []).append(str(row["name"]))
    held: dict[str, dict[str, int]] = {}
    for row in rows(
        conn,
        "SELECT name, digest, MAX(generation) AS generation FROM alias_history"
        " GROUP BY name, digest",
    ):
        if row["digest"] in states:
            held.setdefault(str(row["digest"]), {})[str(row["name"])] = int(row["generation"])
    out = {}
    for digest in digests:
        now_on = tuple(sorted(current.get(digest, [])))
        moved = tuple(
            AliasMove(alias=name, generation=generation, now=active.get(name))
            for name, generation in sorted(held.get(digest, {}).items())
            if active.get(name) != digest
        )
        flags = [FENCE_HIT] if hits.get(digest) else []
        if moved and not now_on:
            flags.append(SUPERSEDED)
        out[digest] = Standing(
            catalog_state=states[digest],
            marks=tuple(flags),
            current_on=now_on,
            superseded_on=moved,
            fence_hit_count=hits.get(digest, 0),
        )
    return out


def standing_of(conn: Connection, digest: str, state: str) -> Standing:
    return standings(conn, {digest: state})[digest]


def catalog_states(conn: Connection, kind: str, digests: Iterable[str]) -> dict[str, str]:
    """The catalog state of each known ``kind`` (snapshot/release) digest."""
    wanted = sorted(set(digests))
    if not wanted:
        return {}
    table = {"snapshot": "snapshots", "release": "releases"}[kind]
    sql = f"SELECT state FROM {table} WHERE digest = :d"  # noqa: S608 constant table names
    out = {}
    for digest in wanted:
        found = rows(conn, sql, {"d": digest})
        if found:
            out[digest] = str(found[0]["state"])
    return out
