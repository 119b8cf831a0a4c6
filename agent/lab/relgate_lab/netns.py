"""Network lab: one network namespace per host, a bridge per rack joined by a spine, tbf caps.

With ``dcs`` > 1 the racks are split into data centers (contiguous: rack r is in DC
``r * dcs // racks``), each with its own spine bridge; DC d's spine joins DC 0's through a
veth pair (``wan<d>a`` on DC 0's spine, ``wan<d>b`` on DC d's) capped by tbf at
``wan_bytes_per_s`` both ways, and each host is enrolled with the label ``dc=dc<d>``. The
coordinator and the origin sit in DC 0. :func:`wan_bytes` reads what crossed each WAN link.

Everything lives in namespaces the lab creates (names ``rgl<id>-...``); nothing is added to
the root namespace. A "fabric" namespace holds the rack bridges and the spine bridge; each
host namespace has one veth (``eth0``) into its rack bridge with address 10.77.<rack>.<n>/16;
each coordinator replica has its own namespace on the spine (replica 0 at 10.77.255.1,
replica i at 10.77.255.<10+i>: one replica's link can be dropped while the others keep
theirs, :func:`replica_link`). With ``store="postgres"`` the coordinator's store is a
PostgreSQL server in its own namespace at 10.77.255.3 (:mod:`relgate_lab.pgstore`), so a
replica cut off from the network loses the store too. Each host NIC is capped in both
directions (egress on the host side, and on the fabric side toward the host), shared
fairly among its peers by an htb class per peer (``fair_nics``, the default: a real host's
fq_codel shares its NIC among flows; see :func:`_fair_cap`) or, with ``fair_nics=False``,
by one ``tc tbf`` FIFO; every lab interface gets ``gso_max_size 60000`` so the shaper does
not have to split 64 KiB GSO super-packets in software (measured: without it, tbf
splitting eats the CPU).

The coordinator also listens on a unix socket under the lab state directory, which is how
tools in the root namespace reach it (filesystem sockets cross network namespaces).

Without root (or without ``ip netns``) the lab falls back to plain loopback processes
without caps. ``lab_down`` stops every process by PID and deletes every namespace.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

from relgate_trust.datacenter import rack_dc, with_dc

from relgate_agent.client import CoordinatorClient
from relgate_agent.errors import AgentError
from relgate_agent.pki import TlsFiles, ensure_dev_pki
from relgate_lab import lab_env, pgstore

SUBNET_PREFIX = "10.77"
COORD_PORT = 7470
LEASE_TTL_S = 5.0
AGENT_PORT = 7480
AGENT_CLI = [sys.executable, "-m", "relgate_agent", "--json"]
# agents run through the lab entry point: faults from agent_env are installed as hooks
FAULTY_AGENT_CLI = [sys.executable, "-m", "relgate_lab.faulty_agent", "--json"]
LAB_CLI = [sys.executable, "-m", "relgate_lab", "--json"]


@dataclass
class LabSpec:
    hosts: int = 8
    racks: int = 2
    nic_bytes_per_s: int = 100_000_000 // 8
    state_dir: Path = Path("var/lab")
    trusted_keys: list[str] = field(default_factory=list)
    coordinator_listen: str = ""
    journal_interval_s: float = 2.0
    report_interval_s: float = 1.0
    dead_after_s: float = 6.0
    force_loopback: bool = False
    labels: str = "cluster=lab"
    agent_env: dict[str, dict[str, str]] = field(default_factory=dict)
    agent_args: dict[str, list[str]] = field(default_factory=dict)  # host -> extra serve flags
    extra_hosts_env: dict[str, str] = field(default_factory=dict)
    origin_dir: Path | None = None  # served over HTTP from its own namespace on the spine
    origin_nic_bytes_per_s: int = 0  # tbf on the origin NIC (the origin bandwidth cap)
    start_agents: bool = True
    dcs: int = 1  # data centers (racks split among them); DC 0 holds the origin
    wan_bytes_per_s: int = 0  # tbf on each DC's WAN link to DC 0 (0 = uncapped)
    # coordinator replicas sharing the store (> 1: `--ha`, a leader lease of LEASE_TTL_S)
    coordinator_replicas: int = 1
    nic_overrides: dict[str, int] = field(default_factory=dict)  # host -> its NIC bytes/s
    # host -> its upload bytes/s only (egress on the host side; its download keeps its NIC)
    tx_overrides: dict[str, int] = field(default_factory=dict)
    # the coordinator store: "sqlite" (a file every replica opens) or "postgres" (a server
    # on the lab network: a replica whose link is dropped loses it; netns mode only)
    store: str = "sqlite"
    # host NICs share their cap fairly among peers (an htb class per peer, as a real host's
    # fq_codel does: see _fair_cap); False: one tbf FIFO per direction (unfair among flows)
    fair_nics: bool = True


def netns_available() -> bool:
    if os.geteuid() != 0 or shutil.which("ip") is None or shutil.which("tc") is None:
        return False
    try:
        subprocess.run(["ip", "netns", "list"], check=True, capture_output=True, timeout=10)  # noqa: S607 - iproute2 with an argv list we built
    except (OSError, subprocess.SubprocessError):
        return False
    return True


def _ip(*args: str) -> None:
    res = subprocess.run(["ip", *args], check=False, capture_output=True, text=True, timeout=30)  # noqa: S603, S607 - iproute2 with an argv list we built
    if res.returncode != 0:
        raise AgentError(f"ip {' '.join(args)} failed: {res.stderr.strip()}")


def _tc(ns: str, *args: str) -> None:
    cmd = ["ip", "netns", "exec", ns, "tc", *args]
    res = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=30)  # noqa: S603 - iproute2 with an argv list we built
    if res.returncode != 0:
        raise AgentError(f"tc {' '.join(args)} in {ns} failed: {res.stderr.strip()}")


def _tbf(ns: str, dev: str, rate_bytes: int) -> None:
    burst = max(64 * 1024, rate_bytes // 50)  # >= rate/HZ with room for a 64 KiB GSO packet
    _tc(
        ns,
        "qdisc",
        "replace",
        "dev",
        dev,
        "root",
        "tbf",
        "rate",
        f"{rate_bytes * 8}bit",
        "burst",
        str(burst),
        "latency",
        "100ms",
    )


def _fair_cap(ns: str, dev: str, rate_bytes: int, peers: Sequence[str], key: str) -> None:
    """Cap ``dev`` at ``rate_bytes`` and share it fairly among ``peers`` (addresses matched
    on ``key``: ``dst`` for an egress, ``src`` for the fabric side toward a host), as a
    real host's fq_codel shares its NIC among its flows. A bare tbf queues every flow in
    one FIFO: TCP then shares a capped upload unfairly (one child of a 30 % uploader still
    received at speed while another crawled, and the judge read the crawler as rx-slow).
    This kernel has neither fq, fq_codel nor sfq: an htb class per peer (DRR among equals,
    each guaranteed its 1/n and borrowing up to the cap) does the same; everything else
    (the origin, the coordinator) shares one more class."""
    bit = rate_bytes * 8
    share = max(8, bit // (len(peers) + 1))
    burst = max(64 * 1024, rate_bytes // 50)  # as _tbf: room for a 64 KiB GSO packet
    leaf = f"htb rate {share}bit ceil {bit}bit burst {burst} cburst {burst} quantum 60000"
    lines = [
        f"qdisc replace dev {dev} root handle 1: htb default 2",
        f"class add dev {dev} parent 1: classid 1:1 htb rate {bit}bit burst {burst} cburst {burst}",
        f"class add dev {dev} parent 1:1 classid 1:2 {leaf}",
    ]
    for j, peer in enumerate(peers, start=10):
        lines.append(f"class add dev {dev} parent 1:1 classid 1:{j:x} {leaf}")
        lines.append(
            f"filter add dev {dev} parent 1: protocol ip prio 1 u32 "
            f"match ip {key} {peer}/32 flowid 1:{j:x}"
        )
    cmd = ["ip", "netns", "exec", ns, "tc", "-batch", "-"]
    res = subprocess.run(  # noqa: S603 - iproute2 with an argv list we built
        cmd, input="\n".join(lines) + "\n", check=False, capture_output=True, text=True, timeout=60
    )
    if res.returncode != 0:
        raise AgentError(f"tc -batch (fair cap on {dev}) in {ns} failed: {res.stderr.strip()}")


def host_names(spec: LabSpec) -> list[tuple[str, str]]:
    """(host_id, rack) for every lab host, racks filled round-robin."""
    return [(f"h{i:02d}", f"r{i % spec.racks}") for i in range(spec.hosts)]


def host_labels(spec: LabSpec, rack: str) -> str:
    """A host's enrollment labels: the lab's, plus ``dc=dc<d>`` with more than one DC."""
    return with_dc(spec.labels, rack_dc(int(rack[1:]), spec.racks, spec.dcs))


def _spine_of_rack(spec: LabSpec, rack: int) -> str:
    dc = rack_dc(rack, spec.racks, spec.dcs)
    return "spine" if dc in ("", "dc0") else f"spine{dc[2:]}"


def _spine(dc: int) -> str:
    return "spine" if dc == 0 else f"spine{dc}"


def _save(state_dir: Path, state: dict[str, Any]) -> None:
    tmp = state_dir / "lab.json.tmp"
    tmp.write_text(json.dumps(state, indent=2, sort_keys=True))
    os.replace(tmp, state_dir / "lab.json")


def _spawn(
    cmd: list[str], log: Path, env: dict[str, str] | None = None
) -> tuple[int, dict[str, Any]]:
    fh = open(log, "a")  # noqa: SIM115 - inherited by the child
    proc = subprocess.Popen(  # noqa: S603 - an argv list we built
        cmd,
        stdout=subprocess.PIPE,
        stderr=fh,
        text=True,
        env=lab_env({**os.environ, **(env or {})}),
        start_new_session=True,
    )
    fh.close()
    if proc.stdout is None:  # stdout=PIPE always gives one
        raise AgentError(f"{cmd[0]}: no stdout pipe")
    line = proc.stdout.readline()
    proc.stdout.close()
    if not line:
        proc.wait(10)
        raise AgentError(f"{' '.join(cmd[:8])} exited early; see {log}")
    return proc.pid, json.loads(line)


def _veth_into(fabric: str, peer: str, ns: str, bridge: str) -> None:
    """A veth pair: ``peer`` on ``bridge`` in the fabric, ``eth0`` in ``ns``."""
    _ip("-n", fabric, "link", "add", peer, "type", "veth", "peer", "name", "eth0", "netns", ns)
    _ip("-n", fabric, "link", "set", peer, "master", bridge, "up")


@dataclass
class _Lab:
    """A lab being brought up: its spec, state document and where things live."""

    spec: LabSpec
    state_dir: Path
    state: dict[str, Any]
    use_netns: bool
    prefix: str

    @property
    def logs(self) -> Path:
        return self.state_dir / "logs"

    @property
    def sock(self) -> Path:
        return self.replica_sock(0)

    def replica_sock(self, i: int) -> Path:
        return self.state_dir / ("coordinator.sock" if i == 0 else f"coordinator-{i}.sock")

    def save(self) -> None:
        _save(self.state_dir, self.state)

    def add_ns(self, ns: str) -> None:
        _ip("netns", "add", ns)
        self.state["namespaces"].append(ns)
        self.save()
        _ip("-n", ns, "link", "set", "lo", "up")

    def wrap(self, ns: str) -> list[str]:
        return ["ip", "netns", "exec", ns] if self.use_netns else []


def replica_name(i: int) -> str:
    return "coordinator" if i == 0 else f"coordinator-{i}"


def _spine_port(lab: _Lab, fabric: str, ns: str, veth: str, address: str) -> None:
    """Namespace ``ns`` (new) on the spine through fabric port ``veth``, at ``address``."""
    lab.add_ns(ns)
    _veth_into(fabric, veth, ns, "spine")
    _ip("-n", ns, "addr", "add", f"{address}/16", "dev", "eth0")
    _ip("-n", ns, "link", "set", "eth0", "up")


def _build_fabric(lab: _Lab) -> str:
    """Fabric namespace (rack bridges on a spine) and a namespace per coordinator replica."""
    fabric = f"{lab.prefix}-fab"
    lab.add_ns(fabric)
    for d in range(max(lab.spec.dcs, 1)):
        _ip("-n", fabric, "link", "add", _spine(d), "type", "bridge")
        _ip("-n", fabric, "link", "set", _spine(d), "up")
        if d > 0:
            _wan_link(lab, fabric, d)
    for r in range(lab.spec.racks):
        br = f"rack{r}"
        _ip("-n", fabric, "link", "add", br, "type", "bridge")
        _ip("-n", fabric, "link", "set", br, "up")
        _ip("-n", fabric, "link", "add", f"up{r}", "type", "veth", "peer", "name", f"dn{r}")
        _ip("-n", fabric, "link", "set", f"up{r}", "master", _spine_of_rack(lab.spec, r), "up")
        _ip("-n", fabric, "link", "set", f"dn{r}", "master", br, "up")
    # each coordinator replica sits on the spine, in its own namespace
    for i in range(lab.spec.coordinator_replicas):
        suffix = "" if i == 0 else str(i)
        address = f"{SUBNET_PREFIX}.255.{1 if i == 0 else 10 + i}"
        _spine_port(lab, fabric, f"{lab.prefix}-co{suffix}", f"vco{suffix}", address)
        lab.state["replicas"][replica_name(i)] = {
            "ns": f"{lab.prefix}-co{suffix}",
            "address": address,
        }
    return fabric


def _wan_link(lab: _Lab, fabric: str, dc: int) -> None:
    """DC ``dc``'s spine joined to DC 0's by a veth pair, tbf-capped both ways."""
    near, far = f"wan{dc}a", f"wan{dc}b"
    _ip("-n", fabric, "link", "add", near, "type", "veth", "peer", "name", far)
    _ip("-n", fabric, "link", "set", near, "master", "spine", "up")
    _ip("-n", fabric, "link", "set", far, "master", _spine(dc), "up")
    for dev in (near, far):
        _ip("-n", fabric, "link", "set", "dev", dev, "gso_max_size", "60000")
        if lab.spec.wan_bytes_per_s:
            _tbf(fabric, dev, lab.spec.wan_bytes_per_s)
    lab.state.setdefault("wan", {})[f"dc{dc}"] = {"near": near, "far": far}


def wan_bytes(state: dict[str, Any]) -> dict[str, dict[str, int]]:
    """Bytes that crossed each DC's WAN link so far: ``{"dc1": {"in": n, "out": n}}``
    ("in": from DC 0 into the DC, "out": back), read from the fabric's veth counters."""
    fabric = f"rgl{state['id']}-fab"
    return {
        dc: {"in": _tx_bytes(fabric, devs["near"]), "out": _tx_bytes(fabric, devs["far"])}
        for dc, devs in state.get("wan", {}).items()
    }


def _tx_bytes(ns: str, dev: str) -> int:
    cmd = ["ip", "netns", "exec", ns, "cat", f"/sys/class/net/{dev}/statistics/tx_bytes"]
    res = subprocess.run(cmd, check=True, capture_output=True, text=True, timeout=30)  # noqa: S603 - an argv list we built
    return int(res.stdout)


def replica_link(state: dict[str, Any], name: str, how: str) -> None:
    """Drop or restore coordinator replica ``name``'s network path on its own side:
    ``down`` (link down: nothing in or out), ``egress-drop`` (it still receives, and sends
    nothing: a tbf whose 40-byte bucket no frame fits, every TCP segment being longer, and
    a 1-byte queue; tbf because lab kernels may lack netem and tc actions), ``up`` (both
    undone)."""
    ns = state["replicas"][name]["ns"]
    if how == "down":
        _ip("-n", ns, "link", "set", "eth0", "down")
    elif how == "egress-drop":
        _tc(
            ns,
            "qdisc",
            "replace",
            "dev",
            "eth0",
            "root",
            "tbf",
            "rate",
            "8bit",
            "burst",
            "40",
            "limit",
            "1",
        )
    elif how == "up":
        with contextlib.suppress(AgentError):  # no qdisc installed: nothing to remove
            _tc(ns, "qdisc", "del", "dev", "eth0", "root")
        _ip("-n", ns, "link", "set", "eth0", "up")
    else:
        raise AgentError(f"unknown link fault {how!r} (down, egress-drop, up)")


def _start_store(lab: _Lab, fabric: str) -> str:
    """A PostgreSQL store in its own namespace on the spine; the replicas' DSN."""
    address = f"{SUBNET_PREFIX}.255.3"
    _spine_port(lab, fabric, f"{lab.prefix}-db", "vdb", address)
    base, server = pgstore.prepare(f"{SUBNET_PREFIX}.0.0/16")
    lab.state["store_dir"] = str(base)
    lab.save()
    with open(lab.logs / "store.log", "a") as log:
        proc = subprocess.Popen(  # noqa: S603 - an argv list we built
            [*lab.wrap(f"{lab.prefix}-db"), *pgstore.server_argv(base, server, address)],
            stdout=log,
            stderr=log,
            start_new_session=True,
        )
    lab.state["pids"]["store"] = proc.pid
    lab.save()
    pgstore.wait_ready(base, proc)
    return pgstore.dsn(address)


def _build_origin_ns(lab: _Lab, fabric: str) -> None:
    org_ns = f"{lab.prefix}-org"
    _spine_port(lab, fabric, org_ns, "vorg", f"{SUBNET_PREFIX}.255.2")
    _ip("-n", org_ns, "link", "set", "dev", "eth0", "gso_max_size", "60000")
    if lab.spec.origin_nic_bytes_per_s:
        _tbf(org_ns, "eth0", lab.spec.origin_nic_bytes_per_s)
    lab.state["origin_ns"] = org_ns


def _build_hosts(lab: _Lab, fabric: str) -> None:
    names = host_names(lab.spec)
    addrs = {h: f"{SUBNET_PREFIX}.{int(rack[1:])}.{10 + i}" for i, (h, rack) in enumerate(names)}
    for h, rack in names:
        ns = f"{lab.prefix}-{h}"
        lab.add_ns(ns)
        peer = f"v{h}"
        _veth_into(fabric, peer, ns, f"rack{rack[1:]}")
        addr = addrs[h]
        _ip("-n", ns, "addr", "add", f"{addr}/16", "dev", "eth0")
        _ip("-n", ns, "link", "set", "eth0", "up")
        for n, dev in ((ns, "eth0"), (fabric, peer)):
            _ip("-n", n, "link", "set", "dev", dev, "gso_max_size", "60000")
        # host NIC cap both ways: upload on the host side, download on the fabric side
        nic = lab.spec.nic_overrides.get(h, lab.spec.nic_bytes_per_s)
        up = lab.spec.tx_overrides.get(h, nic)
        if lab.spec.fair_nics:
            others = [a for o, a in addrs.items() if o != h]
            _fair_cap(ns, "eth0", up, others, "dst")
            _fair_cap(fabric, peer, nic, others, "src")
        else:
            _tbf(ns, "eth0", up)
            _tbf(fabric, peer, nic)
        lab.state["hosts"][h] = {
            "rack": rack,
            "ns": ns,
            "address": addr,
            "labels": host_labels(lab.spec, rack),
        }
    lab.save()


def _start_coordinator(lab: _Lab, pki: Path, db: str) -> None:
    """Every replica (pids ``coordinator``, ``coordinator-1``, ...): one store, one lease."""
    spec, listening, unix = lab.spec, [], []
    ha = ["--ha", "--lease-ttl", str(LEASE_TTL_S)] if spec.coordinator_replicas > 1 else []
    for i in range(spec.coordinator_replicas):
        name = replica_name(i)
        replica = lab.state["replicas"].get(name, {"ns": "", "address": "127.0.0.1"})
        listen = spec.coordinator_listen or (
            f"{replica['address']}:{COORD_PORT}" if lab.use_netns else "127.0.0.1:0"
        )
        pid, info = _spawn(
            [
                *lab.wrap(replica["ns"]),
                *AGENT_CLI,
                "coordinator",
                "serve",
                "--listen",
                listen,
                "--listen",
                f"unix:{lab.replica_sock(i)}",
                "--db",
                db,
                "--trusted-keys",
                *spec.trusted_keys,
                "--dead-after",
                str(spec.dead_after_s),
                "--report-interval",
                str(spec.report_interval_s),
                "--pki",
                str(pki),
                *ha,
            ],
            lab.logs / f"{name}.log",
        )
        lab.state["pids"][name] = pid
        listening.append(info["listening"])
        unix.append(f"unix:{lab.replica_sock(i)}")
    lab.state["coordinator"] = ",".join(listening)
    lab.state["coordinator_unix"] = ",".join(unix)
    lab.save()


def _start_origin(lab: _Lab, origin_dir: Path) -> None:
    org_host = f"{SUBNET_PREFIX}.255.2" if lab.use_netns else "127.0.0.1"
    pid, oinfo = _spawn(
        [
            *lab.wrap(lab.state.get("origin_ns", "")),
            *LAB_CLI,
            "origin-serve",
            "--dir",
            str(Path(origin_dir).resolve()),
            "--listen",
            f"{org_host}:{8080 if lab.use_netns else 0}",
        ],
        lab.logs / "origin.log",
    )
    lab.state["pids"]["origin"] = pid
    lab.state["origin_url"] = oinfo["origin"]
    lab.save()


def _start_agent(lab: _Lab, h: str, hinfo: dict[str, Any], pki: Path) -> None:
    spec = lab.spec
    root = lab.state_dir / "hosts" / h / "models"
    root.mkdir(parents=True, exist_ok=True)
    pid, ainfo = _spawn(
        [
            *lab.wrap(hinfo["ns"]),
            *FAULTY_AGENT_CLI,
            "agent",
            "serve",
            "--host-id",
            h,
            "--rack",
            hinfo["rack"],
            "--labels",
            hinfo.get("labels", spec.labels),
            "--coordinator",
            lab.state["coordinator"],
            "--models-root",
            str(root),
            "--trusted-keys",
            *spec.trusted_keys,
            "--listen",
            f"{hinfo['address']}:{AGENT_PORT if lab.use_netns else 0}",
            "--journal-interval",
            str(spec.journal_interval_s),
            "--report-interval",
            str(spec.report_interval_s),
            "--pki",
            str(pki),
            *spec.agent_args.get(h, []),
        ],
        lab.logs / f"{h}.log",
        {**spec.extra_hosts_env, **spec.agent_env.get(h, {})},
    )
    lab.state["pids"][h] = pid
    hinfo["models_root"] = str(root)
    hinfo["data_address"] = ainfo["dataAddress"]
    lab.save()


def _new_lab(spec: LabSpec) -> _Lab:
    state_dir = spec.state_dir.resolve()
    state_dir.mkdir(parents=True, exist_ok=True)
    if (state_dir / "lab.json").exists():
        raise AgentError(
            f"a lab is already up in {state_dir}; run `python -m relgate_lab down` first"
        )
    if not spec.trusted_keys:
        raise AgentError("lab up needs --trusted-keys")
    use_netns = netns_available() and not spec.force_loopback
    lab_id = secrets.token_hex(2)
    state: dict[str, Any] = {
        "id": lab_id,
        "mode": "netns" if use_netns else "loopback",
        "namespaces": [],
        "pids": {},
        "hosts": {},
        "replicas": {},
        "state_dir": str(state_dir),
        "nic_bytes_per_s": spec.nic_bytes_per_s if use_netns else 0,
    }
    lab = _Lab(spec, state_dir, state, use_netns, f"rgl{lab_id}")
    lab.save()
    lab.logs.mkdir(exist_ok=True)
    with contextlib.suppress(FileNotFoundError):
        lab.sock.unlink()
    return lab


def lab_up(spec: LabSpec) -> dict[str, Any]:
    """Bring a lab up (namespaces when root, else loopback); its state document."""
    lab = _new_lab(spec)
    try:
        db = str(lab.state_dir / "coordinator.sqlite")
        if spec.store not in ("sqlite", "postgres"):
            raise AgentError(f"unknown lab store {spec.store!r} (sqlite, postgres)")
        if spec.store == "postgres" and not lab.use_netns:
            raise AgentError("the lab's PostgreSQL store needs the network-namespace lab")
        if lab.use_netns:
            fabric = _build_fabric(lab)
            if spec.store == "postgres":
                db = _start_store(lab, fabric)
            if spec.origin_dir is not None:
                _build_origin_ns(lab, fabric)
            _build_hosts(lab, fabric)
        else:
            for h, rack in host_names(spec):
                lab.state["hosts"][h] = {
                    "rack": rack,
                    "ns": "",
                    "address": "127.0.0.1",
                    "labels": host_labels(spec, rack),
                }
        # a dev fleet CA + coordinator/operator/host certificates: no set-up, mutual TLS anyway
        pki = ensure_dev_pki(lab.state_dir, {h: i["rack"] for h, i in lab.state["hosts"].items()})
        lab.state["pki"] = str(pki)
        _start_coordinator(lab, pki, db)
        enroll_hosts(
            lab.state["coordinator_unix"],
            pki,
            {h: (i["rack"], i["labels"]) for h, i in lab.state["hosts"].items()},
        )
        if spec.origin_dir is not None:
            _start_origin(lab, spec.origin_dir)
        for h, hinfo in lab.state["hosts"].items():
            if spec.start_agents:
                _start_agent(lab, h, hinfo, pki)
            else:
                hinfo["models_root"] = str(lab.state_dir / "hosts" / h / "models")
    except BaseException:
        lab_down(lab.state_dir)
        raise
    return lab.state


def enroll_hosts(coordinator: str, pki: Path, hosts: dict[str, tuple[str, str]]) -> None:
    """Enroll hosts (host id -> (rack, "k=v,..." labels)) with the operator certificate."""
    c = CoordinatorClient(coordinator, TlsFiles.from_pki(pki, "operator"))
    try:
        for h, (rack, labels) in hosts.items():
            c.enroll_host(
                h,
                rack,
                dict(i.split("=", 1) for i in labels.split(",") if "=" in i),
                timeout=30,
            )
    finally:
        c.close()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a zombie child of this process counts as dead once reaped
    with contextlib.suppress(ChildProcessError):
        done, _ = os.waitpid(pid, os.WNOHANG)
        if done == pid:
            return False
    return True


def stop_pid(pid: int, timeout: float = 10.0) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and _alive(pid):
        time.sleep(0.05)
    if _alive(pid):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and _alive(pid):
            time.sleep(0.05)


def lab_down(state_dir: Path) -> dict[str, Any]:
    """Stop every lab process by PID and delete every namespace the lab created."""
    state_dir = Path(state_dir).resolve()
    path = state_dir / "lab.json"
    if not path.exists():
        return {"stopped": [], "namespaces_deleted": [], "note": "no lab state"}
    state = json.loads(path.read_text())
    stopped = []
    pids = state.get("pids", {})
    # agents first, then the coordinator replicas, the store they write to last
    for name in sorted(pids, key=lambda n: (n == "store", n.startswith("coordinator"))):
        stop_pid(int(pids[name]))
        stopped.append(name)
    deleted = []
    for ns in reversed(state.get("namespaces", [])):
        cmd = ["ip", "netns", "delete", ns]
        res = subprocess.run(cmd, check=False, capture_output=True, text=True, timeout=30)  # noqa: S603 - iproute2 with an argv list we built
        if res.returncode == 0:
            deleted.append(ns)
    if state.get("store_dir"):
        shutil.rmtree(state["store_dir"], ignore_errors=True)
    for sock in state_dir.glob("coordinator*.sock"):
        with contextlib.suppress(FileNotFoundError):
            sock.unlink()
    path.unlink()
    return {"stopped": stopped, "namespaces_deleted": deleted}


def serve_origin(directory: Path, host: str, port: int) -> None:
    """A ranged-GET HTTP origin for the lab (the object store stand-in); runs until killed.

    Serves files under ``directory`` with ``Range: bytes=a-b`` support using sendfile. The
    origin's bandwidth cap is the tbf on its namespace NIC, like a real storage front end.
    """
    root = Path(directory).resolve()

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def do_GET(self) -> None:
            rel = self.path.split("?", 1)[0].lstrip("/")
            target = (root / rel).resolve()
            if root not in target.parents or not target.is_file():
                self.send_error(404)
                return
            size = target.stat().st_size
            start, end = 0, size - 1
            m = re.fullmatch(r"bytes=(\d+)-(\d*)", self.headers.get("Range", ""))
            if m:
                start = int(m.group(1))
                end = min(int(m.group(2)) if m.group(2) else size - 1, size - 1)
                if start > end:
                    self.send_error(416)
                    return
                self.send_response(206)
                self.send_header("Content-Range", f"bytes {start}-{end}/{size}")
            else:
                self.send_response(200)
            self.send_header("Content-Length", str(end - start + 1))
            self.end_headers()
            self.wfile.flush()
            with open(target, "rb") as fh:
                offset, remaining = start, end - start + 1
                while remaining > 0:
                    sent = os.sendfile(self.connection.fileno(), fh.fileno(), offset, remaining)
                    if sent == 0:
                        break
                    offset += sent
                    remaining -= sent

    server = ThreadingHTTPServer((host, port), Handler)
    server.daemon_threads = True
    print(
        json.dumps({"origin": f"http://{host}:{server.server_port}", "pid": os.getpid()}),
        flush=True,
    )
    server.serve_forever()
