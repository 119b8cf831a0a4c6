"""Checkpoint fan-out in the network-namespace lab: relgate striped chains vs naive HTTP pull.

Workload: 16 hosts in 4 racks, every host NIC capped at B = 100 Mbit/s (htb, a class per peer, both
directions); one origin HTTP server on the spine whose NIC is capped at 2B; a 256 MiB
checkpoint (4 files; 4 MiB chunks, 256 KiB blocks, 8 stripes).

* relgate: coordinator + one agent per host namespace, origin cap 2B, ready threshold 100%.
* naive: every host pulls every file from the origin with curl, all hosts at once.
* bittorrent: aria2c leechers + opentracker, the origin as the only seed. No baseline is
  skipped silently: missing Debian tools are installed when running as root, otherwise the
  bench fails with the command to run.
* calibration: ``python -m relgate_agent simulate agent/scenarios/lab-16.toml --json`` (when
  the command and scenario exist) and the simulated p50 beside the measured one.

Results are ratios against the physical bound measured in the same run: per-host completion
time over S/B (the time one host needs to receive S bytes at its NIC rate), and origin bytes
over S. CPU is the lab processes' CPU seconds over wall seconds (cores busy; the machine
has os.cpu_count() cores).
"""

from __future__ import annotations

import json
import os
import re
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.record import Comparison, compare

# the network-namespace lab lives outside the installed agent (agent/lab/relgate_lab)
LAB_ROOT = Path(__file__).resolve().parents[1] / "agent" / "lab"
if str(LAB_ROOT) not in sys.path:
    sys.path.insert(0, str(LAB_ROOT))

MiB = 1024 * 1024
HOSTS, RACKS = 16, 4
NIC = 100_000_000 // 8  # bytes/s
ORIGIN_CAP = 2 * NIC
SIZE = 256 * MiB
CHUNK, BLOCK, STRIPES = 4 * MiB, 256 * 1024, 8


def _cpu_seconds(pids: list[int]) -> float:
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12]) + int(fields[13]) + int(fields[14])) / tick
    return total


def _machine_busy() -> tuple[float, float]:
    vals = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = vals[3] + vals[4]
    return float(sum(vals) - idle), float(sum(vals))


def _busy_fraction(before: tuple[float, float], after: tuple[float, float]) -> float:
    return round((after[0] - before[0]) / max(after[1] - before[1], 1.0), 3)


def _make_checkpoint(base: Path) -> tuple[Path, Path, Path, Any]:
    from relgate_trust.manifest import (
        build_manifest,
        generate_private_key,
        sign_manifest,
        write_envelope,
        write_keypair,
    )

    src = base / "origin"
    src.mkdir(parents=True)
    per = SIZE // 4
    for i in range(4):
        with open(src / f"model-{i + 1:05d}-of-00004.safetensors", "wb") as fh:
            for _ in range(per // MiB):
                fh.write(os.urandom(MiB))
    key = generate_private_key()
    keys = base / "keys"
    keys.mkdir()
    write_keypair(key, keys / "signer.key", keys / "builder-v1.pem")
    m = build_manifest(src, "bench-model", "v1", CHUNK, BLOCK)
    env = base / "manifest.dsse.json"
    write_envelope(sign_manifest(m, key), env)
    return src, keys / "builder-v1.pem", env, m


SWARM_TOOLS = ("aria2c", "opentracker", "mktorrent")
SWARM_INSTALL = ["apt-get", "install", "-y", "--no-install-recommends"]
SWARM_PACKAGES = ["aria2", "opentracker", "mktorrent"]
LAB_SCENARIO = Path(__file__).resolve().parents[1] / "agent" / "scenarios" / "lab-16.toml"
CALIBRATION_TARGET = 0.15  # simulated p50 within 15% of the measured p50


def ensure_swarm_tools() -> None:
    """Install aria2, opentracker and mktorrent from Debian when missing (root only);
    otherwise fail with the exact command: the BitTorrent baseline is never skipped."""
    if all(shutil.which(t) for t in SWARM_TOOLS):
        return
    cmd = " ".join(SWARM_INSTALL + SWARM_PACKAGES)
    if os.geteuid() != 0:
        raise SystemExit(f"bench distribution: the BitTorrent baseline needs: sudo {cmd}")
    for attempt in ([], ["apt-get", "update"]):
        if attempt:
            subprocess.run(attempt, check=False, capture_output=True)
        done = subprocess.run(SWARM_INSTALL + SWARM_PACKAGES, check=False, capture_output=True)
        if done.returncode == 0 and all(shutil.which(t) for t in SWARM_TOOLS):
            return
    missing = [t for t in SWARM_TOOLS if not shutil.which(t)]
    raise SystemExit(f"bench distribution: {cmd} failed; still missing {missing}")


def sim_command(scenario: Path = LAB_SCENARIO) -> list[str]:
    return [sys.executable, "-m", "relgate_agent", "simulate", str(scenario), "--json"]


def calibration(measured_p50_s: float | None) -> dict[str, Any]:
    """Simulated p50 of the lab's shape beside the measured p50 (target: within 15%)."""
    if not LAB_SCENARIO.exists():
        return {"skipped": f"no scenario {LAB_SCENARIO.relative_to(LAB_ROOT.parents[1])}"}
    run = subprocess.run(sim_command(), capture_output=True, text=True, check=False, timeout=600)
    if run.returncode != 0:
        return {"skipped": f"simulate failed (exit {run.returncode}): {run.stderr[-300:]}"}
    sim_p50 = float(json.loads(run.stdout)["p50Seconds"])
    out: dict[str, Any] = {"simulated_p50_s": round(sim_p50, 2), "measured_p50_s": measured_p50_s}
    if measured_p50_s:
        err = (sim_p50 - measured_p50_s) / measured_p50_s
        out |= {"relative_error": round(err, 3), "target": f"|error| <= {CALIBRATION_TARGET}"}
    return out


def _summary(times: list[float], bound: float) -> dict[str, Any]:
    return {
        "p50_s": round(statistics.median(times), 2),
        "max_s": round(max(times), 2),
        "p50_over_S_B": round(statistics.median(times) / bound, 3),
        "max_over_S_B": round(max(times) / bound, 3),
        "hosts_done": len(times),
    }


SERVING_HOST, SERVING_RATE = "h03", 40_000_000 // 8  # the seed's serving host: 40 Mbit/s
TX_SLOW_SHARE = 0.3  # a tx-slow host's upload, as a share of its NIC


# how a host's errors say the coordinator judged it (slowness, complaints, bad data, removal)
JUDGED = ("DEMOTED", "QUARANTINED", "REMOVED", "spliced out")


def run_relgate(
    base: Path,
    src: Path,
    pem: Path,
    env: Path,
    *,
    serving: str = "",
    tx_slow: str = "",
    run: int = 0,
) -> dict[str, Any]:
    """One distribution in the lab; with ``serving``, that host runs ``--max-rate 40 Mbit``
    (it serves inference); with ``tx_slow``, that host's upload alone is capped at 30 % of
    its NIC (on its egress alone). The figures cover everyone else; ``judged`` lists every
    host the coordinator demoted, quarantined or removed, with its reasons."""
    from relgate_lab.netns import LabSpec, lab_down, lab_up

    from relgate_agent.client import CoordinatorClient, job_to_dict

    variant = "-serving" if serving else "-txslow" if tx_slow else ""
    spec = LabSpec(
        hosts=HOSTS,
        racks=RACKS,
        nic_bytes_per_s=NIC,
        # a lab of its own per run: a host that kept the last run's copy is READY at once
        state_dir=base / f"lab-relgate{variant}{f'-{run}' if run else ''}",
        trusted_keys=[str(pem)],
        agent_args={serving: ["--max-rate", str(SERVING_RATE)]} if serving else {},
        tx_overrides={tx_slow: int(TX_SLOW_SHARE * NIC)} if tx_slow else {},
        origin_dir=src,
        origin_nic_bytes_per_s=ORIGIN_CAP,
        report_interval_s=0.5,
    )
    state = lab_up(spec)
    try:
        from relgate_agent.pki import TlsFiles

        client = CoordinatorClient(
            state["coordinator_unix"], TlsFiles.from_pki(state["pki"], "operator")
        )
        job_id = create_lab_job(client, state, env, HOSTS, origin_cap_bytes_per_s=ORIGIN_CAP)
        pids = [int(p) for p in state["pids"].values()]
        sent0 = _origin_tx_bytes(state["origin_ns"])
        cpu0, busy0, t0 = _cpu_seconds(pids), _machine_busy(), time.monotonic()
        ready_at: dict[str, float] = {}
        st: dict[str, Any] = {}
        while len(ready_at) < HOSTS and time.monotonic() - t0 < 900:
            st = job_to_dict(client.get_job(job_id))
            for h in st["hosts"]:
                if h["state"] == "READY" and h["host_id"] not in ready_at:
                    ready_at[h["host_id"]] = time.monotonic() - t0
            time.sleep(0.25)
        wall = time.monotonic() - t0
        cpu = _cpu_seconds(pids) - cpu0
        busy = _busy_fraction(busy0, _machine_busy())
        sent = _origin_tx_bytes(state["origin_ns"]) - sent0
        st = job_to_dict(client.get_job(job_id))
        client.close()
        errors = sum(len(h["errors"]) for h in st["hosts"])
        others = [t for h, t in ready_at.items() if h not in (serving, tx_slow)]
        judged = {
            h["host_id"]: [e for e in h["errors"] if e.startswith(JUDGED)]
            for h in st["hosts"]
            if any(e.startswith(JUDGED) for e in h["errors"])
        }
        return {
            **_summary(others, SIZE / NIC),
            "judged": judged,
            "ready_at_s": {h: round(t, 1) for h, t in sorted(ready_at.items())},
            "origin_bytes_over_S": round(st["origin_bytes"] / SIZE, 3),
            "origin_nic_bytes_over_S": round(sent / SIZE, 3),
            "cpu_cores_busy": round(cpu / wall, 2),
            "machine_busy_fraction": busy,
            "reported_errors": errors,
        }
    finally:
        lab_down(spec.state_dir)


def create_lab_job(
    client: Any,
    state: dict[str, Any],
    env: Path,
    hosts: int,
    wait_s: float = 60,
    stripes: int = STRIPES,
    **extra: Any,
) -> str:
    """The bench job on a lab's fleet once all ``hosts`` agents have checked in (a job
    planned earlier is cancelled and planned again); ``extra``: more CreateJob fields."""
    deadline = time.monotonic() + wait_s
    while True:
        job = client.create_job(
            model="bench-model",
            version="v1",
            manifest_uri=str(env),
            origin_uri=state["origin_url"],
            target_selector="cluster=lab",
            ready_threshold_ppm=1_000_000,
            stripes=stripes,
            **extra,
        )
        if job.hosts_total == hosts:
            return str(job.job_id)
        client.cancel_job(job.job_id)
        if time.monotonic() > deadline:
            raise RuntimeError("agents did not register")
        time.sleep(0.5)


def _origin_tx_bytes(ns: str) -> int:
    """Bytes the origin NIC actually sent (tbf qdisc counters): physical origin load."""
    out = subprocess.run(
        ["ip", "netns", "exec", ns, "tc", "-s", "qdisc", "show", "dev", "eth0"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    m = re.search(r"Sent (\d+) bytes", out)
    return int(m.group(1)) if m else 0


# aria2c flags shared by the origin seed and every leecher
_ARIA2_COMMON = (
    "--enable-dht=false",
    "--bt-enable-lpd=false",
    "--seed-ratio=0.0",
    "--summary-interval=0",
    "--console-log-level=warn",
    "--file-allocation=none",
    "--bt-max-peers=0",
)


@dataclass(frozen=True)
class _Swarm:
    """Where the BitTorrent swarm runs: origin namespace, tracker address, torrent, logs."""

    origin_ns: str
    tracker_ip: str
    torrent: Path
    tracker_root: Path
    logs: Path


def run_bittorrent(base: Path, src: Path) -> dict[str, Any]:
    """aria2c swarm (Debian aria2 + opentracker + mktorrent), origin as the only seed."""
    from relgate_lab.netns import LabSpec, lab_down, lab_up, stop_pid

    spec = LabSpec(
        hosts=HOSTS,
        racks=RACKS,
        nic_bytes_per_s=NIC,
        state_dir=base / "lab-bt",
        trusted_keys=[str(base / "keys" / "builder-v1.pem")],
        origin_dir=src,
        origin_nic_bytes_per_s=ORIGIN_CAP,
        start_agents=False,
    )
    state = lab_up(spec)
    pids: list[int] = []
    try:
        swarm = _prepare_swarm(base, src, state["origin_ns"], state["origin_url"])
        _start_tracker_and_seed(swarm, src, pids)
        return _measure_swarm(base, swarm, state["hosts"], pids)
    finally:
        for pid in reversed(pids):
            stop_pid(pid)
        lab_down(spec.state_dir)


def _prepare_swarm(base: Path, src: Path, origin_ns: str, origin_url: str) -> _Swarm:
    """Make the torrent of ``src`` and whitelist its info hash in the tracker's root."""
    tracker_ip = origin_url.split("//")[1].split(":", maxsplit=1)[0]
    torrent = base / "ckpt.torrent"
    torrent.unlink(missing_ok=True)
    subprocess.run(
        [
            "mktorrent",
            "-l",
            "22",
            "-a",
            f"http://{tracker_ip}:6969/announce",
            "-o",
            str(torrent),
            str(src),
        ],
        check=True,
        capture_output=True,
    )
    show = subprocess.run(
        ["aria2c", "-S", str(torrent)], capture_output=True, text=True, check=True
    ).stdout
    m = re.search(r"Info Hash: ([0-9a-f]{40})", show)
    assert m, show
    chroot = base / "tracker"
    chroot.mkdir(exist_ok=True)
    (chroot / "whitelist").write_text(m.group(1) + "\n")
    return _Swarm(
        origin_ns=origin_ns,
        tracker_ip=tracker_ip,
        torrent=torrent,
        tracker_root=chroot,
        logs=base / "lab-bt" / "logs",
    )


def _spawn(pids: list[int], cmd: list[str], log: Path) -> None:
    """Start ``cmd`` in its own session, output to ``log``; its PID is added to ``pids``."""
    with open(log, "w") as fh:
        pids.append(subprocess.Popen(cmd, stdout=fh, stderr=fh, start_new_session=True).pid)


def _start_tracker_and_seed(swarm: _Swarm, src: Path, pids: list[int]) -> None:
    """opentracker, then the origin's aria2c seed, both in the origin namespace."""
    _spawn(
        pids,
        [
            "ip",
            "netns",
            "exec",
            swarm.origin_ns,
            "opentracker",
            "-i",
            swarm.tracker_ip,
            "-p",
            "6969",
            "-P",
            "6969",
            "-d",
            str(swarm.tracker_root),
            "-w",
            "whitelist",
            "-u",
            "nobody",
        ],
        swarm.logs / "opentracker.log",
    )
    time.sleep(0.5)
    _spawn(
        pids,
        [
            "ip",
            "netns",
            "exec",
            swarm.origin_ns,
            "aria2c",
            *_ARIA2_COMMON,
            "--bt-seed-unverified=true",
            f"--dir={src.parent}",
            str(swarm.torrent),
        ],
        swarm.logs / "seeder.log",
    )
    time.sleep(1.0)


def _measure_swarm(
    base: Path, swarm: _Swarm, hosts: dict[str, Any], pids: list[int]
) -> dict[str, Any]:
    """Start every host's leecher at once; completion times and origin load."""
    sent0 = _origin_tx_bytes(swarm.origin_ns)
    busy0, t0 = _machine_busy(), time.time()
    done_dir = base / "bt-done"
    done_dir.mkdir(exist_ok=True)
    _start_leechers(base, swarm, hosts, done_dir, pids)
    deadline = time.time() + 900
    while len(list(done_dir.iterdir())) < HOSTS and time.time() < deadline:
        time.sleep(0.25)
    times = [float(p.read_text()) - t0 for p in done_dir.iterdir()]
    busy = _busy_fraction(busy0, _machine_busy())
    sent = _origin_tx_bytes(swarm.origin_ns) - sent0
    return {
        **_summary(times, SIZE / NIC),
        "origin_bytes_over_S": round(sent / SIZE, 3),
        "origin_nic_bytes_over_S": round(sent / SIZE, 3),
        "machine_busy_fraction": busy,
    }


def _start_leechers(
    base: Path, swarm: _Swarm, hosts: dict[str, Any], done_dir: Path, pids: list[int]
) -> None:
    """One aria2c per host namespace; its completion hook writes a timestamp to ``done_dir``."""
    for h, info in hosts.items():
        out = Path(info["models_root"]) / "bt"
        out.mkdir(parents=True, exist_ok=True)
        hook = base / f"hook-{h}.sh"
        hook.write_text(f"#!/bin/sh\ndate +%s.%N > {done_dir / h}\n")
        hook.chmod(0o755)
        _spawn(
            pids,
            [
                "ip",
                "netns",
                "exec",
                info["ns"],
                "aria2c",
                *_ARIA2_COMMON,
                f"--dir={out}",
                f"--on-bt-download-complete={hook}",
                str(swarm.torrent),
            ],
            swarm.logs / f"aria2-{h}.log",
        )


def run_naive(base: Path, src: Path) -> dict[str, Any]:
    from relgate_lab.netns import LabSpec, lab_down, lab_up

    spec = LabSpec(
        hosts=HOSTS,
        racks=RACKS,
        nic_bytes_per_s=NIC,
        state_dir=base / "lab-naive",
        trusted_keys=[str(base / "keys" / "builder-v1.pem")],
        origin_dir=src,
        origin_nic_bytes_per_s=ORIGIN_CAP,
        start_agents=False,
    )
    state = lab_up(spec)
    try:
        files = sorted(p.name for p in src.iterdir())
        done: dict[str, float] = {}
        procs: dict[str, subprocess.Popen[bytes]] = {}
        sent0 = _origin_tx_bytes(state["origin_ns"])
        busy0, t0 = _machine_busy(), time.monotonic()
        for h, info in state["hosts"].items():
            out = Path(info["models_root"]) / "naive"
            out.mkdir(parents=True, exist_ok=True)
            script = " && ".join(f"curl -sf -o {out / f} {state['origin_url']}/{f}" for f in files)
            procs[h] = subprocess.Popen(["ip", "netns", "exec", info["ns"], "sh", "-c", script])

        def wait(h: str, p: subprocess.Popen[bytes]) -> None:
            p.wait()
            if p.returncode == 0:
                done[h] = time.monotonic() - t0

        threads = [threading.Thread(target=wait, args=item) for item in procs.items()]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        busy = _busy_fraction(busy0, _machine_busy())
        sent = _origin_tx_bytes(state["origin_ns"]) - sent0
        return {
            **_summary(list(done.values()), SIZE / NIC),
            "origin_bytes_over_S": float(len(done)),
            "origin_nic_bytes_over_S": round(sent / SIZE, 3),
            "machine_busy_fraction": busy,
        }
    finally:
        lab_down(spec.state_dir)


def main() -> dict[str, Any]:
    from relgate_lab.netns import netns_available

    if not netns_available():
        return {"skipped": "needs root, ip netns and tc (network-namespace lab)"}
    if shutil.which("curl") is None:
        return {"skipped": "needs curl for the naive baseline"}
    ensure_swarm_tools()
    base = Path(tempfile.mkdtemp(prefix="relgate-bench-dist-"))
    try:
        src, pem, env, _ = _make_checkpoint(base)
        relgate = run_relgate(base, src, pem, env)
        serving = run_relgate(base, src, pem, env, serving=SERVING_HOST)
        naive = run_naive(base, src)
        bt = run_bittorrent(base, src)
        return {
            "workload": (
                f"{HOSTS} hosts / {RACKS} racks, NIC B={NIC * 8 // 1_000_000} Mbit/s (tbf), origin cap 2B, "
                f"S={SIZE // MiB} MiB, chunk {CHUNK // MiB} MiB, block {BLOCK // 1024} KiB, k={STRIPES}"
            ),
            "S_over_B_s": round(SIZE / NIC, 2),
            "relgate": relgate,
            "relgateWithServingHost": {
                "servingHost": f"{SERVING_HOST} at --max-rate {SERVING_RATE * 8 // 1_000_000} Mbit/s",
                **serving,
                "othersP100OverFaultFreeP100": round(serving["max_s"] / relgate["max_s"], 3)
                if relgate.get("max_s")
                else None,
                "target": "every other host within 1.2 x of the fault-free run",
            },
            "naive_http_pull": naive,
            "bittorrent_aria2": bt,
            "calibration": calibration(relgate.get("p50_s")),
            "baseline": "S/B, the physical bound of one host's NIC (naive pull and BitTorrent beside)",
            "ratio": relgate.get("p50_over_S_B"),
            "peakRssMiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
            "target": "relgate p50 <= 1.10 x S/B, max <= 1.20 x S/B, origin NIC <= 1.02 x S",
            "speedup_max": round(naive["max_s"] / relgate["max_s"], 2)
            if relgate.get("max_s")
            else None,
        }
    finally:
        shutil.rmtree(base, ignore_errors=True)


def comparisons(result: dict[str, Any]) -> list[Comparison]:
    """relgate's p50 and max READY time against S/B, BitTorrent and naive pull, and the
    origin's NIC bytes against theirs."""
    ours, bt, naive = result["relgate"], result["bittorrent_aria2"], result["naive_http_pull"]
    times = [
        compare(
            f"{q} READY time",
            "s",
            ("relgate", ours[k]),
            ("S/B", result["S_over_B_s"]),
            ("BitTorrent (aria2)", bt[k]),
            ("naive HTTP pull", naive[k]),
        )
        for q, k in (("p50", "p50_s"), ("max", "max_s"))
    ]
    origin = compare(
        "origin NIC bytes",
        "x S",
        ("relgate", ours["origin_nic_bytes_over_S"]),
        ("BitTorrent (aria2)", bt["origin_nic_bytes_over_S"]),
        ("naive HTTP pull", naive["origin_nic_bytes_over_S"]),
    )
    return [*times, origin]


if __name__ == "__main__":
    print(json.dumps(main(), indent=2))
