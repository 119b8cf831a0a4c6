"""Scenario: a fleet simulation's input, parsed strictly from TOML (tomllib).

Every table and key is known; an unknown key, a wrong type or an out-of-range value is a
:class:`ScenarioError` (a refusal naming the file, the key and the check: exit 3).
Sizes are integers (bytes) or strings with a unit ("800GB", "256MiB"); rates are
strings in bits per second ("100Gbit", "100Mbit") or integers in bytes per second.
"""

from __future__ import annotations

import re
import tomllib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from relgate_trust.errors import VerificationError

CHECK_SCENARIO = "sim-scenario"
MAX_SCENARIO_BYTES = 1 << 20
FAULT_KINDS = ("fail", "slow", "rate_limit", "failover", "root_fail")
SLOW_DIRECTIONS = ("rx", "tx", "both")  # both: the NIC capped each way (the chaos lab's 30 % host)

_UNITS = {
    "": 1,
    "B": 1,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "TB": 10**12,
    "KIB": 1 << 10,
    "MIB": 1 << 20,
    "GIB": 1 << 30,
    "TIB": 1 << 40,
}
_RATE_UNITS = {"BIT": 1, "KBIT": 10**3, "MBIT": 10**6, "GBIT": 10**9, "TBIT": 10**12}
_QTY_RE = re.compile(r"\s*([0-9]+(?:\.[0-9]+)?)\s*([A-Za-z]*)\s*")


class ScenarioError(VerificationError):
    """A scenario file the simulator refuses (``check`` names the rule)."""

    check = CHECK_SCENARIO


@dataclass(frozen=True)
class Fault:
    kind: str  # one of FAULT_KINDS
    at_s: float
    count: int = 0  # fail / slow / rate_limit: how many hosts (chosen by the seed)
    direction: str = "rx"  # slow: rx | tx | both (SLOW_DIRECTIONS)
    factor: float = 0.3  # slow: fraction of the NIC left
    rate: float = 0.0  # rate_limit: the serving host's tx in bytes/s
    pause_s: float = 0.0  # failover: control plane paused, then a new leader rebuilds
    stripe: int = 0  # root_fail: whose root dies


@dataclass(frozen=True)
class Scenario:
    name: str
    hosts: int
    racks: int
    checkpoint_bytes: int
    chunk_bytes: int
    block_bytes: int
    stripes: int
    nic: float  # bytes/s, each direction
    oversubscription: float  # ToR: rack NIC sum / uplink
    spine_oversubscription: float
    origin_cap: float  # bytes/s
    efficiency: float  # fraction of the NIC an agent achieves (tbf, CPU)
    report_interval_s: float
    step_s: float
    dead_after_s: float
    slow_fraction: float
    slow_after_s: float
    tree_fanout: int
    swarm_peers: int
    swarm_slots: int
    swarm_pieces: int
    seed: int
    faults: tuple[Fault, ...]

    @property
    def num_chunks(self) -> int:
        return -(-self.checkpoint_bytes // self.chunk_bytes)


def _refuse(where: str, msg: str) -> ScenarioError:
    return ScenarioError(f"scenario {where}: {msg} (check {CHECK_SCENARIO})")


def parse_size(where: str, value: object) -> int:
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    m = _QTY_RE.fullmatch(value) if isinstance(value, str) else None
    if m is None or m.group(2).upper() not in _UNITS:
        raise _refuse(where, f"{value!r} is not a size (bytes, or e.g. '800GB', '4MiB')")
    out = int(float(m.group(1)) * _UNITS[m.group(2).upper()])
    if out <= 0:
        raise _refuse(where, f"{value!r} must be > 0")
    return out


def parse_rate(where: str, value: object) -> float:
    """Bytes per second from '100Gbit' (bits/s) or an integer (bytes/s)."""
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return float(value)
    m = _QTY_RE.fullmatch(value) if isinstance(value, str) else None
    if m is None or m.group(2).upper() not in _RATE_UNITS or float(m.group(1)) <= 0:
        raise _refuse(where, f"{value!r} is not a rate (bytes/s, or e.g. '100Gbit')")
    return float(m.group(1)) * _RATE_UNITS[m.group(2).upper()] / 8


class _Table:
    """One TOML table read key by key; what is left over at the end is refused."""

    def __init__(self, where: str, doc: object) -> None:
        if not isinstance(doc, dict):
            raise _refuse(where, "must be a table")
        self.where, self.doc = where, dict(doc)

    def take(self, key: str, default: Any = None) -> Any:
        if key not in self.doc:
            if default is None:
                raise _refuse(f"{self.where}.{key}", "is required")
            return default
        return self.doc.pop(key)

    def number(self, key: str, default: float | None, lo: float, hi: float) -> float:
        v = self.take(key, default)
        if isinstance(v, bool) or not isinstance(v, int | float) or not lo <= v <= hi:
            raise _refuse(f"{self.where}.{key}", f"{v!r} is not a number in [{lo}, {hi}]")
        return float(v)

    def integer(self, key: str, default: int | None, lo: int, hi: int) -> int:
        v = self.take(key, default)
        if isinstance(v, bool) or not isinstance(v, int) or not lo <= v <= hi:
            raise _refuse(f"{self.where}.{key}", f"{v!r} is not an integer in [{lo}, {hi}]")
        return v

    def done(self) -> None:
        if self.doc:
            raise _refuse(self.where, f"unknown key(s) {sorted(self.doc)}")


def _fault(where: str, doc: object) -> Fault:
    t = _Table(where, doc)
    kind = t.take("kind")
    if kind not in FAULT_KINDS:
        raise _refuse(f"{where}.kind", f"{kind!r} is not one of {list(FAULT_KINDS)}")
    at = t.number("at_s", None, 0, 1e7)
    out = Fault(kind=kind, at_s=at)
    if kind in ("fail", "slow", "rate_limit"):
        out = Fault(kind, at, count=t.integer("count", None, 1, 1 << 20))
    if kind == "slow":
        direction = t.take("direction", "rx")
        if direction not in SLOW_DIRECTIONS:
            raise _refuse(f"{where}.direction", f"{direction!r} is not rx, tx or both")
        out = Fault(kind, at, out.count, direction, t.number("factor", 0.3, 0.001, 1.0))
    elif kind == "rate_limit":
        out = Fault(kind, at, out.count, rate=parse_rate(f"{where}.rate", t.take("rate")))
    elif kind == "failover":
        out = Fault(kind, at, pause_s=t.number("pause_s", None, 0, 3600))
    elif kind == "root_fail":
        out = Fault(kind, at, stripe=t.integer("stripe", 0, 0, 1 << 16))
    t.done()
    return out


def _check(sc: Scenario, where: str) -> Scenario:
    if sc.racks > sc.hosts:
        raise _refuse(f"{where} fleet.racks", f"{sc.racks} racks for {sc.hosts} hosts")
    if sc.chunk_bytes % sc.block_bytes or sc.block_bytes > sc.chunk_bytes:
        raise _refuse(f"{where} checkpoint.block", "must divide the chunk size")
    if sc.stripes > sc.num_chunks:
        raise _refuse(f"{where} distribution.stripes", f"k={sc.stripes} > {sc.num_chunks} chunks")
    for f in sc.faults:
        if f.kind == "root_fail" and f.stripe >= sc.stripes:
            raise _refuse(f"{where} faults", f"root_fail stripe {f.stripe} >= k={sc.stripes}")
        if f.count > sc.hosts:
            raise _refuse(f"{where} faults", f"{f.kind} of {f.count} hosts > {sc.hosts}")
    return sc


def parse_scenario(text: str, where: str = "<scenario>") -> Scenario:
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise _refuse(where, f"is not TOML: {exc}") from None
    top = _Table(where, doc)
    name = top.take("name", Path(where).stem)
    if not isinstance(name, str) or not name:
        raise _refuse(f"{where}.name", "must be a non-empty string")
    seed = top.integer("seed", 1, 0, 2**31)
    fleet = _Table("fleet", top.take("fleet"))
    ckpt = _Table("checkpoint", top.take("checkpoint"))
    net = _Table("network", top.take("network"))
    dist = _Table("distribution", top.take("distribution", {}))
    base = _Table("baselines", top.take("baselines", {}))
    faults = top.take("faults", [])
    if not isinstance(faults, list):
        raise _refuse(f"{where}.faults", "must be an array of tables ([[faults]])")
    top.done()
    report = dist.number("report_interval_s", 2.0, 0.05, 60)
    sc = Scenario(
        name=name,
        hosts=fleet.integer("hosts", None, 1, 1 << 16),
        racks=fleet.integer("racks", 1, 1, 1 << 12),
        checkpoint_bytes=parse_size("checkpoint.size", ckpt.take("size")),
        chunk_bytes=parse_size("checkpoint.chunk", ckpt.take("chunk")),
        block_bytes=parse_size("checkpoint.block", ckpt.take("block")),
        stripes=dist.integer("stripes", 8, 1, 256),
        nic=parse_rate("network.nic", net.take("nic")),
        oversubscription=net.number("oversubscription", 1.0, 1.0, 1000),
        spine_oversubscription=net.number("spine_oversubscription", 1.0, 1.0, 1000),
        origin_cap=parse_rate("network.origin_cap", net.take("origin_cap")),
        efficiency=net.number("efficiency", 1.0, 0.05, 1.0),
        report_interval_s=report,
        step_s=dist.number("step_s", report / 2, 0.01, 60),
        dead_after_s=dist.number("dead_after_s", 3 * report, 0.1, 600),
        slow_fraction=dist.number("slow_fraction", 0.5, 0.01, 1.0),
        slow_after_s=dist.number("slow_after_s", 5 * report, 0.1, 600),
        tree_fanout=base.integer("tree_fanout", 2, 1, 64),
        swarm_peers=base.integer("swarm_peers", 8, 1, 256),
        swarm_slots=base.integer("swarm_slots", 4, 1, 64),
        swarm_pieces=base.integer("swarm_pieces", 256, 1, 1 << 16),
        seed=seed,
        faults=tuple(_fault(f"faults[{i}]", f) for i, f in enumerate(faults)),
    )
    for t in (fleet, ckpt, net, dist, base):
        t.done()
    return _check(sc, where)


def load_scenario(path: str | Path) -> Scenario:
    p = Path(path)
    try:
        with p.open("rb") as fh:
            raw = fh.read(MAX_SCENARIO_BYTES + 1)
    except OSError as exc:
        raise _refuse(str(p), f"cannot be read: {exc.strerror}") from None
    if len(raw) > MAX_SCENARIO_BYTES:
        raise _refuse(str(p), f"is larger than {MAX_SCENARIO_BYTES} bytes")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError:
        raise _refuse(str(p), "is not UTF-8") from None
    return parse_scenario(text, str(p))


__all__ = [
    "CHECK_SCENARIO",
    "Fault",
    "Scenario",
    "ScenarioError",
    "load_scenario",
    "parse_rate",
    "parse_scenario",
    "parse_size",
]
