"""Chaos row of the lab bench: the distribution bench's fleet (16 hosts, 4 racks, 100 Mbit
fair-shared NICs, 256 MiB) run fault-free and then under chaos in the same run: 2 hosts SIGKILLed
mid-transfer, 1 corrupting every block it sends, 1 at 30 % of its NIC, 1 at 30 % of its
upload only (tx-slow: its victims must not be blamed), the leading coordinator SIGKILLed
once and, later, the next leader frozen (SIGSTOP: no FIN, its sockets stay open; three
replicas share the store).
Reported: each run's p50 (and max) time to READY over the surviving hosts and their ratio
(target <= 1.3), READY hosts, the killed hosts' states. Needs root (network namespaces).
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc

from bench.distribution import (
    CHUNK,
    HOSTS,
    RACKS,
    SIZE,
    STRIPES,
    _busy_fraction,
    _machine_busy,
    _make_checkpoint,
    _summary,
    create_lab_job,
)
from bench.record import Comparison, compare

KILLED, CORRUPTER, SLOW, TX_SLOW = ("h02", "h09"), "h05", "h06", "h10"
REPLICAS = 3  # one SIGKILLed, the next frozen, the third leads to the end
TARGET = 1.3
NIC_MBIT = 100


# agent serve flags per --bypass value (agent/bypass.py): the default, none, or the
# experimental slow-hop rules too
BYPASS_ARGS = {"dead": [], "off": ["--no-bypass"], "slow": ["--bypass-slow"]}


def _spec(base: Path, src: Path, pem: Path, chaos: bool, nic: int, bypass: str) -> Any:
    from relgate_lab.netns import LabSpec

    return LabSpec(
        hosts=HOSTS,
        racks=RACKS,
        nic_bytes_per_s=nic,
        state_dir=base / ("lab-chaos" if chaos else "lab-fault-free"),
        trusted_keys=[str(pem)],
        origin_dir=src,
        origin_nic_bytes_per_s=2 * nic,
        report_interval_s=0.5,
        dead_after_s=4.0,
        coordinator_replicas=REPLICAS,  # both runs: the same control plane, faults aside
        nic_overrides={SLOW: int(0.3 * nic)} if chaos else {},
        tx_overrides={TX_SLOW: int(0.3 * nic)} if chaos else {},
        agent_env={CORRUPTER: {"RELGATE_AGENT_FAULT": "corrupt_send=all"}} if chaos else {},
        agent_args={f"h{i:02d}": BYPASS_ARGS[bypass] for i in range(HOSTS)},
    )


class Trace:
    """What the run went through, from GetJob polls: when the topology changed (and which
    hosts changed state then), when faults were injected, and the fleet's verified chunks
    at 10 % steps, so a slow run shows where its time went."""

    def __init__(self) -> None:
        self.events: list[str] = []
        self.version, self.states = 0, {}  # type: ignore[var-annotated]
        self.steps: dict[int, float] = {}

    def mark(self, t: float, what: str) -> None:
        self.events.append(f"{t:6.1f}s {what}")

    def see(self, t: float, st: dict[str, Any]) -> None:
        states = {h["host_id"]: h["state"] for h in st["hosts"]}
        moved = [
            f"{h} {self.states.get(h, '-')}->{s}"
            for h, s in states.items()
            if self.states.get(h) != s and s != "READY"
        ]
        if st["topology_version"] != self.version or moved:
            self.mark(t, f"topology v{st['topology_version']} " + ", ".join(moved))
        self.version, self.states = st["topology_version"], states
        chunks = -(-(st["checkpoint_bytes"] or 1) // CHUNK) * max(1, len(st["hosts"]))
        have = sum(h["chunks_verified"] for h in st["hosts"]) / chunks
        for step in range(10, 101, 10):
            if have * 100 >= step and step not in self.steps:
                self.steps[step] = round(t, 1)

    def summary(self) -> dict[str, Any]:
        return {"events": self.events, "fleet_verified_percent_at_s": self.steps}


_BYPASS = re.compile(r"(h\d\d) bypasses (h\d\d): stripe (\d+): (?:upstream \S+ )?(\S+ \S+)")


def _bypasses(state: dict[str, Any]) -> list[str]:
    """Each bypass an agent logged (agent/bypass.py): 'h03 bypassed h02 on stripe 1 (failed 2)'."""
    out = []
    for log in sorted((Path(state["state_dir"]) / "logs").glob("h*.log")):
        text = log.read_text(errors="replace")
        out += [
            f"{h} bypassed {up} on stripe {s} ({why})" for h, up, s, why in _BYPASS.findall(text)
        ]
    return out


def _received(st: dict[str, Any]) -> dict[str, Any]:
    """Bytes each host received (peers and origin) over S, and the survivors' mean (killed
    and quarantined hosts left out): above 1.0 is bytes fetched twice (end-game races,
    re-sent blocks)."""
    per = {
        h["host_id"]: round((h["rx_bytes"] + h["origin_bytes"]) / SIZE, 3)
        for h in st.get("hosts", [])
    }
    done = [v for h, v in per.items() if h not in (*KILLED, CORRUPTER)]  # quarantined: 0
    return {"per_host": per, "mean_of_survivors": round(sum(done) / max(1, len(done)), 3)}


def _freeze_leader(state: dict[str, Any], tls: Any) -> str:
    """SIGSTOP the replica that answers as the leader now (the one that took over); its
    name, or "" when none answered."""
    from relgate_agent.client import CoordinatorClient

    for i, address in enumerate(state["coordinator_unix"].split(",")):
        name = "coordinator" if i == 0 else f"coordinator-{i}"
        c = CoordinatorClient(address, tls)
        try:
            c.list_hosts(timeout=2)
        except grpc.RpcError:
            continue  # dead, frozen or not the leader
        finally:
            c.close()
        os.kill(int(state["pids"][name]), signal.SIGSTOP)
        return name
    return ""


def run(
    base: Path, src: Path, pem: Path, env: Path, *, chaos: bool, nic: int, bypass: str
) -> dict[str, Any]:
    from relgate_lab.netns import lab_down, lab_up

    from relgate_agent.client import CoordinatorClient, job_to_dict
    from relgate_agent.pki import TlsFiles

    spec = _spec(base, src, pem, chaos, nic, bypass)
    state = lab_up(spec)
    try:
        client = CoordinatorClient(
            state["coordinator_unix"], TlsFiles.from_pki(state["pki"], "operator")
        )
        job, injected, frozen = (
            create_lab_job(client, state, env, HOSTS, wait_s=90, origin_cap_bytes_per_s=2 * nic),
            not chaos,
            not chaos,
        )
        t0 = time.monotonic()
        ready_at: dict[str, float] = {}
        st: dict[str, Any] = {}
        busy0, trace = _machine_busy(), Trace()
        wanted = HOSTS - (len(KILLED) + 1 if chaos else 0)  # the corrupter may be quarantined
        while len(ready_at) < wanted and time.monotonic() - t0 < 600:
            try:
                st = job_to_dict(client.get_job(job))
            except grpc.RpcError as exc:  # the replica taking the lease answers UNAVAILABLE
                waiting = (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED)
                if exc.code() not in waiting:  # (a frozen leader never answers)
                    raise  # a refusal or a bug: the bench reports it, never waits it out
                time.sleep(0.25)
                continue
            trace.see(time.monotonic() - t0, st)
            for h in st["hosts"]:
                if h["state"] == "READY" and h["host_id"] not in ready_at:
                    ready_at[h["host_id"]] = time.monotonic() - t0
            if not injected and st["bytes_moved"] >= 2 * SIZE:
                for name in (*KILLED, "coordinator"):
                    os.kill(int(state["pids"][name]), signal.SIGKILL)
                injected = True
                trace.mark(time.monotonic() - t0, "killed " + "+".join((*KILLED, "coordinator")))
            elif injected and not frozen and st["bytes_moved"] >= 5 * SIZE:
                name = _freeze_leader(state, TlsFiles.from_pki(state["pki"], "operator"))
                frozen = bool(name)
                if frozen:
                    trace.mark(time.monotonic() - t0, f"froze {name} (SIGSTOP, the leader)")
            time.sleep(0.25)
        states = {h["host_id"]: h["state"] for h in st.get("hosts", [])}
        client.close()
        survivors = [t for h, t in ready_at.items() if h not in KILLED and h != CORRUPTER]
        return {
            **_summary(survivors, SIZE / nic),
            "hosts_ready": sum(1 for s in states.values() if s == "READY"),
            "states_of_faulty": {h: states.get(h) for h in (*KILLED, CORRUPTER, SLOW, TX_SLOW)},
            # hosts demoted to leaves, with the reason: victims of the tx-slow host must not be
            "demoted": {
                h["host_id"]: next(e for e in h["errors"] if e.startswith("DEMOTED"))
                for h in st.get("hosts", [])
                if any(e.startswith("DEMOTED") for e in h["errors"])
            },
            "bypassed": _bypasses(state),
            "machine_busy_fraction": _busy_fraction(busy0, _machine_busy()),
            "ready_at_s": {h: round(t, 1) for h, t in sorted(ready_at.items())},
            "received_over_S": _received(st),
            "timeline": trace.summary(),
        }
    finally:
        lab_down(spec.state_dir)


def main(nic_mbit: int = NIC_MBIT, bypass: str = "dead") -> dict[str, Any]:
    from relgate_lab.netns import netns_available

    if not netns_available():
        return {"skipped": "needs root, ip netns and tc (network-namespace lab)"}
    base = Path(tempfile.mkdtemp(prefix="relgate-bench-chaos-"))
    try:
        src, pem, env, _ = _make_checkpoint(base)
        nic = nic_mbit * 1_000_000 // 8
        if bypass not in BYPASS_ARGS:
            return {"error": f"--bypass {bypass!r}: one of {', '.join(BYPASS_ARGS)}"}
        clean = run(base, src, pem, env, chaos=False, nic=nic, bypass=bypass)
        chaos = run(base, src, pem, env, chaos=True, nic=nic, bypass=bypass)
        ratio = round(chaos["p50_s"] / clean["p50_s"], 3) if clean.get("p50_s") else None
        return {
            "workload": f"{HOSTS} hosts / {RACKS} racks, {nic_mbit} Mbit/s NICs (htb per peer), "
            f"origin cap 2B, S={SIZE >> 20} MiB, k={STRIPES}, bypass={bypass}",
            "faultFree": clean,
            "chaos": {
                "faults": f"{'+'.join(KILLED)} SIGKILLed, {CORRUPTER} corrupt_send=all, "
                f"{SLOW} at 30% NIC, {TX_SLOW} at 30% upload only, leading coordinator "
                "SIGKILLed, then the next leader frozen (SIGSTOP)",
                **chaos,
            },
            "ratio": ratio,
            "baseline": "the fault-free run of the same fleet, measured in the same run",
            "target": f"chaos p50 <= {TARGET} x fault-free p50 (survivors)",
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)


def comparisons(result: dict[str, Any]) -> list[Comparison]:
    """Surviving hosts' READY times under the faults against the same fleet fault-free."""
    chaos, free = result["chaos"], result["faultFree"]
    return [
        compare(f"{q} READY time", "s", ("chaos", chaos[k]), ("fault-free", free[k]))
        for q, k in (("p50", "p50_s"), ("max", "max_s"))
    ]
