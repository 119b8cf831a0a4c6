"""A linearizability check of the gate: what clients saw against what the catalog holds.

Clients record one :class:`GateEvent` per operation (an admission or an alias CAS) with
its real-time interval; :func:`read_history` reads the gate's durable state.  The gate is
linearizable when one total order explains both, which :func:`violations` checks through
its consequences:

* every permit id is unique, every permit a client was given is stored (durable) and
  every stored permit was given to a client (no phantom admission);
* every run record names a stored permit of the same root, one run per permit;
* the revoke fence is never exceeded: no permit was issued on a root at or above a fence
  entry that hit it, and every permit issued below it is closed (with its runs ended);
* the audit sequences are gap-free (alias generations 1..n per alias, fence entries
  1..watermark) and in commit order (alias history times do not go back);
* an alias CAS from one expected generation has exactly one winner, and it is the one
  stored at the next generation;
* real-time order: an operation that started after another finished observed a gate
  state (generation, both watermarks) at least as new.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Literal

from sqlalchemy import Connection

from relgate.catalog.db import rows
from relgate.catalog.states import RUN_LIVE_STATES
from relgate.integrity.contract import Contract


class GateEvent(Contract):
    """One client operation as the client saw it (``started``/``finished``: monotonic
    clock, comparable across processes); a fence event carries the watermarks it set."""

    op: Literal["admit", "activate", "fence"]
    ok: bool
    started: float
    finished: float
    alias: str = ""
    root: str | None = None
    permit_id: str | None = None
    run_id: str | None = None
    expected_generation: int | None = None
    generation: int | None = None
    tombstone_watermark: int | None = None
    benchmark_fence: int | None = None
    error: str | None = None


class GateHistory(Contract):
    """The catalog side of a history: permits, runs, alias history, fences and hits."""

    permits: list[dict[str, str | int | None]]
    runs: list[dict[str, str | None]]
    alias_history: list[dict[str, str | int]]
    fence_hits: list[dict[str, str | int]]
    tombstone_seqs: list[int]
    benchmark_seqs: list[int]
    watermarks: tuple[int, int]


def read_history(conn: Connection) -> GateHistory:
    fences = rows(conn, "SELECT tombstone_watermark, benchmark_fence FROM fences WHERE id = 1")
    return GateHistory(
        permits=rows(
            conn,
            "SELECT permit_id, root_digest, alias, generation, tombstone_watermark,"
            " benchmark_fence, state FROM permits",
        ),
        runs=rows(conn, "SELECT run_id, permit_id, root_digest, state FROM runs"),
        alias_history=rows(conn, "SELECT name, generation, digest, at FROM alias_history"),
        fence_hits=rows(conn, "SELECT subject_digest, fence_kind, fence_seq FROM fence_hits"),
        tombstone_seqs=[int(r["seq"]) for r in rows(conn, "SELECT seq FROM tombstones")],
        benchmark_seqs=[int(r["seq"]) for r in rows(conn, "SELECT seq FROM benchmark_items")],
        watermarks=(int(fences[0]["tombstone_watermark"]), int(fences[0]["benchmark_fence"])),
    )


def _permit_violations(events: list[GateEvent], history: GateHistory) -> list[str]:
    out: list[str] = []
    stored = Counter(str(p["permit_id"]) for p in history.permits)
    out += [f"permit {p} stored {n} times" for p, n in sorted(stored.items()) if n > 1]
    given = Counter(e.permit_id for e in events if e.op == "admit" and e.ok and e.permit_id)
    out += [f"permit {p} given to {n} clients" for p, n in sorted(given.items()) if n > 1]
    out += [f"permit {p} was given but is not stored" for p in sorted(set(given) - set(stored))]
    out += [f"permit {p} is stored but no client got it" for p in sorted(set(stored) - set(given))]
    by_id = {str(p["permit_id"]): p for p in history.permits}
    per_permit = Counter(str(r["permit_id"]) for r in history.runs)
    for run in history.runs:
        permit = by_id.get(str(run["permit_id"]))
        if permit is None:
            out.append(f"run {run['run_id']} names permit {run['permit_id']}, never issued")
        elif permit["root_digest"] != run["root_digest"]:
            out.append(f"run {run['run_id']} is on another root than its permit")
    out += [f"permit {p} has {n} runs" for p, n in sorted(per_permit.items()) if n > 1]
    for event in events:
        permit = by_id.get(str(event.permit_id))
        if event.op == "admit" and event.ok and permit is not None:
            seen = (permit["generation"], permit["tombstone_watermark"], permit["benchmark_fence"])
            told = (event.generation, event.tombstone_watermark, event.benchmark_fence)
            if seen != told:
                out.append(f"permit {event.permit_id}: client saw {told}, catalog holds {seen}")
    return out


def _fence_violations(history: GateHistory) -> list[str]:
    out: list[str] = []
    for name, seqs, mark in (
        ("tombstone", history.tombstone_seqs, history.watermarks[0]),
        ("benchmark", history.benchmark_seqs, history.watermarks[1]),
    ):
        if sorted(seqs) != list(range(1, mark + 1)):
            out.append(f"{name} fence entries are not 1..{mark} without gaps")
    first_hit: dict[tuple[str, str], int] = {}
    for hit in history.fence_hits:
        key = (str(hit["subject_digest"]), str(hit["fence_kind"]))
        first_hit[key] = min(first_hit.get(key, int(hit["fence_seq"])), int(hit["fence_seq"]))
    live_runs = defaultdict(list)
    for run in history.runs:
        if run["state"] in RUN_LIVE_STATES:
            live_runs[str(run["permit_id"])].append(str(run["run_id"]))
    for permit in history.permits:
        for kind, column in (
            ("tombstone", "tombstone_watermark"),
            ("benchmark", "benchmark_fence"),
        ):
            seq = first_hit.get((str(permit["root_digest"]), kind))
            if seq is None:
                continue
            if int(permit[column] or 0) >= seq:
                out.append(
                    f"permit {permit['permit_id']} issued after {kind} entry {seq} hit its root"
                )
            elif permit["state"] == "OPEN":
                out.append(f"permit {permit['permit_id']} still open after {kind} entry {seq}")
            if live_runs.get(str(permit["permit_id"])):
                out.append(f"runs {live_runs[str(permit['permit_id'])]} live on a revoked root")
    return out


def _alias_violations(events: list[GateEvent], history: GateHistory) -> list[str]:
    out: list[str] = []
    by_alias: dict[str, list[dict[str, str | int]]] = defaultdict(list)
    for row in history.alias_history:
        by_alias[str(row["name"])].append(row)
    stored: dict[tuple[str, int], str] = {}
    for alias, entries in by_alias.items():
        ordered = sorted(entries, key=lambda r: int(r["generation"]))
        if [int(r["generation"]) for r in ordered] != list(range(1, len(ordered) + 1)):
            out.append(f"alias {alias} generations are not 1..{len(ordered)} without gaps")
        times = [str(r["at"]) for r in ordered]
        if times != sorted(times):
            out.append(f"alias {alias} history is not in commit order")
        stored.update({(alias, int(r["generation"])): str(r["digest"]) for r in ordered})
    attempts: dict[tuple[str, int], list[GateEvent]] = defaultdict(list)
    for event in events:
        if event.op == "activate" and event.expected_generation is not None:
            attempts[(event.alias, event.expected_generation)].append(event)
    for (alias, expected), tried in sorted(attempts.items()):
        winners = [e for e in tried if e.ok]
        if len(winners) != 1:
            out.append(f"alias {alias} CAS from generation {expected}: {len(winners)} winners")
        elif stored.get((alias, expected + 1)) != winners[0].root:
            out.append(f"alias {alias} generation {expected + 1} is not the CAS winner's root")
    return out


def _marks(event: GateEvent) -> tuple[int, int]:
    return (event.tombstone_watermark or 0, event.benchmark_fence or 0)


def _real_time_violations(events: list[GateEvent]) -> list[str]:
    """An operation that began after another ended saw a state at least as new: both
    watermarks (global) and the alias generation (per alias)."""
    out: list[str] = []
    done = [e for e in events if e.ok]
    ended = sorted(done, key=lambda e: e.finished)
    marks = (0, 0)
    generations: dict[str, int] = defaultdict(int)
    index = 0
    for event in sorted(done, key=lambda e: e.started):
        while index < len(ended) and ended[index].finished < event.started:
            prior = ended[index]
            marks = (max(marks[0], _marks(prior)[0]), max(marks[1], _marks(prior)[1]))
            if prior.alias and prior.generation is not None:
                generations[prior.alias] = max(generations[prior.alias], prior.generation)
            index += 1
        seen = _marks(event)
        if seen[0] < marks[0] or seen[1] < marks[1]:
            out.append(f"{event.op} saw watermarks {seen} after {marks} committed")
        if event.alias and (event.generation or 0) < generations[event.alias]:
            out.append(
                f"{event.op} on {event.alias} saw generation {event.generation}"
                f" after {generations[event.alias]} committed"
            )
    return out


def violations(events: list[GateEvent], history: GateHistory) -> list[str]:
    """Every way ``events`` and ``history`` are not one linearizable gate history."""
    return [
        *_permit_violations(events, history),
        *_fence_violations(history),
        *_alias_violations(events, history),
        *_real_time_violations(events),
    ]
