"""Two data centers in the network-namespace lab: origin reads per DC and the WAN's bytes.

Workload: ``hosts`` hosts in 4 racks, every host NIC capped at B = ``nic_mbit`` (tc tbf, both
ways), a bf16 checkpoint of ``size_mib`` (4 MiB chunks, 256 KiB blocks, 4 stripes) served by
the lab's HTTP origin in DC 0. Baseline, measured in the same run: the same fleet in one DC.
Then the racks split into two DCs whose spines are joined by a WAN link capped at
``wan_mbit`` (tbf both ways); the job names DC 0 as the origin's DC.

Figures: per-host completion over S/B for both runs and, for DC 1, over its physical bound
max(S/B, bytes-that-must-cross / WAN rate) with the bytes that crossed measured by the
kernel on the WAN veth; origin bytes per DC over S (the seed: ~1x per DC; here DC 1 reads
none, its stripe roots are its replica); WAN bytes over S and the compressed/raw ratio of
the blocks that crossed. Needs root and ``ip netns`` (no silent fallback).
"""

from __future__ import annotations

import json
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from bench.distribution import create_lab_job
from bench.record import Comparison, compare

LAB_ROOT = Path(__file__).resolve().parents[1] / "agent" / "lab"
if str(LAB_ROOT) not in sys.path:
    sys.path.insert(0, str(LAB_ROOT))

MiB = 1024 * 1024
CHUNK, BLOCK, STRIPES, RACKS = 4 * MiB, 256 * 1024, 4, 4
QUICK: dict[str, int] = {"size_mib": 32}


def _checkpoint(base: Path, size: int) -> tuple[Path, Path, Path]:
    from relgate_trust.manifest import (
        build_manifest,
        generate_private_key,
        sign_manifest,
        write_envelope,
        write_keypair,
    )

    src = base / "origin" / "ckpt"
    src.mkdir(parents=True)
    rng = np.random.default_rng(5)
    for i in range(4):  # bf16 weights: the high halves of normal float32s
        w = (rng.standard_normal(size // 8).astype(np.float32) * 0.02).view(np.uint32)
        (src / f"model-{i:05d}.safetensors").write_bytes((w >> 16).astype(np.uint16).tobytes())
    key = generate_private_key()
    (base / "trusted").mkdir()
    write_keypair(key, base / "signer.key", base / "trusted" / "builder-v1.pem")
    m = build_manifest(src, "bench-model", "v1", chunk_size=CHUNK, block_size=BLOCK)
    env = base / "origin" / "manifest.dsse.json"
    write_envelope(sign_manifest(m, key), env)
    return src, base / "trusted", env


def _run(base: Path, src: Path, trusted: Path, env: Path, z: dict[str, int]) -> dict[str, Any]:
    from relgate_lab.netns import LabSpec, lab_down, lab_up, wan_bytes

    from relgate_agent.client import CoordinatorClient, job_to_dict
    from relgate_agent.pki import TlsFiles

    dcs = z["dcs"]
    spec = LabSpec(
        hosts=z["hosts"],
        racks=RACKS,
        dcs=dcs,
        nic_bytes_per_s=z["nic"],
        wan_bytes_per_s=z["wan"],
        state_dir=base / f"lab-{dcs}dc",
        trusted_keys=[str(trusted)],
        origin_dir=src,
        report_interval_s=0.5,
    )
    state = lab_up(spec)
    try:
        if state["mode"] != "netns":
            raise RuntimeError("the multi-DC bench needs root and `ip netns` (no loopback mode)")
        client = CoordinatorClient(
            state["coordinator_unix"], TlsFiles.from_pki(state["pki"], "operator")
        )
        job_id = create_lab_job(
            client, state, env, z["hosts"], stripes=STRIPES, origin_dc="dc0" if dcs > 1 else ""
        )
        wan0 = wan_bytes(state)
        t0 = time.monotonic()
        ready_at: dict[str, float] = {}
        while len(ready_at) < z["hosts"] and time.monotonic() - t0 < 600:
            for h in job_to_dict(client.get_job(job_id))["hosts"]:
                if h["state"] == "READY" and h["host_id"] not in ready_at:
                    ready_at[h["host_id"]] = time.monotonic() - t0
            time.sleep(0.25)
        client.close()
        wan = {dc: v["in"] - wan0[dc]["in"] for dc, v in wan_bytes(state).items()}
        return {"state": state, "readyAt": ready_at, "wanIn": wan}
    finally:
        lab_down(spec.state_dir)


def _host_stats(state: dict[str, Any], host: str) -> dict[str, int]:
    d = Path(state["hosts"][host]["models_root"]) / ".agent-stats"
    docs = [json.loads(p.read_text()) for p in d.glob("*.json")]
    keys = ("origin_bytes", "wan_wire_bytes", "wan_raw_bytes")
    return {k: sum(int(doc.get(k, 0)) for doc in docs) for k in keys}


def _dc_of(state: dict[str, Any], host: str) -> str:
    labels = state["hosts"][host].get("labels", "")
    return labels.rsplit("dc=", 1)[1] if "dc=" in labels else "dc0"


def main(
    size_mib: int = 128, hosts: int = 8, nic_mbit: int = 100, wan_mbit: int = 50
) -> dict[str, Any]:
    size, nic, wan = size_mib * MiB, nic_mbit * 1_000_000 // 8, wan_mbit * 1_000_000 // 8
    base = Path(tempfile.mkdtemp(prefix="relgate-bench-multidc-"))
    try:
        src, trusted, env = _checkpoint(base, size)
        size = sum(p.stat().st_size for p in src.iterdir())
        z = {"hosts": hosts, "nic": nic, "wan": wan}
        one = _run(base, src, trusted, env, {**z, "dcs": 1})
        two = _run(base, src, trusted, env, {**z, "dcs": 2})
        stats = {h: _host_stats(two["state"], h) for h in two["state"]["hosts"]}
    finally:
        shutil.rmtree(base, ignore_errors=True)
    bound = size / nic
    by_dc: dict[str, list[str]] = {}
    for h in stats:
        by_dc.setdefault(_dc_of(two["state"], h), []).append(h)
    wire = sum(stats[h]["wan_wire_bytes"] for h in by_dc.get("dc1", []))
    raw = sum(stats[h]["wan_raw_bytes"] for h in by_dc.get("dc1", []))
    dc1_bound = max(bound, two["wanIn"].get("dc1", 0) / wan)
    dc1_times = [two["readyAt"][h] for h in by_dc.get("dc1", []) if h in two["readyAt"]]

    def p50(times: list[float]) -> float:
        return round(statistics.median(times), 2) if times else float("nan")

    return {
        "workload": (
            f"{hosts} hosts in {RACKS} racks, NIC {nic_mbit} Mbit/s, bf16 checkpoint "
            f"{size_mib} MiB, {STRIPES} stripes; two DCs of {RACKS // 2} racks joined by a "
            f"{wan_mbit} Mbit/s WAN (tbf), origin in DC 0"
        ),
        "baseline": {
            "oneDcP50Seconds": p50(list(one["readyAt"].values())),
            "S_over_B_s": round(bound, 2),
        },
        "oneDcP50OverSB": round(p50(list(one["readyAt"].values())) / bound, 3),
        "twoDcP50Seconds": p50(list(two["readyAt"].values())),
        "twoDcP50OverOneDc": round(
            p50(list(two["readyAt"].values())) / p50(list(one["readyAt"].values())), 3
        ),
        "dc1P50OverItsBound": round(p50(dc1_times) / dc1_bound, 3),
        "dc1BoundSeconds": round(dc1_bound, 2),
        "originBytesOverSByDc": {
            dc: round(sum(stats[h]["origin_bytes"] for h in hs) / size, 3)
            for dc, hs in sorted(by_dc.items())
        },
        "wanBytesOverS": round(two["wanIn"].get("dc1", 0) / size, 3),
        "wanBlocksCompressedOverRaw": round(wire / raw, 3) if raw else None,
        "hostsReady": {"oneDc": len(one["readyAt"]), "twoDc": len(two["readyAt"])},
        "peakRssMiB": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
    }


def comparisons(result: dict[str, Any]) -> list[Comparison]:
    """Two DCs over the WAN against one DC and S/B."""
    base = result["baseline"]
    return [
        compare(
            "p50 READY time",
            "s",
            ("two DCs", result["twoDcP50Seconds"]),
            ("one DC", base["oneDcP50Seconds"]),
            ("S/B", base["S_over_B_s"]),
        )
    ]
