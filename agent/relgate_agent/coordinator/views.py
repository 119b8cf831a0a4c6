"""Views: the operator's read-only pictures of jobs (ListJobs, GetJobTopology).

A live job is read in two steps: :func:`snapshot` copies what a picture needs under the
coordinator lock (references to immutable values: the published topology, each host's
last bitmap and rates), and :func:`topology_view` computes the picture from the copy
after the lock is released (a bitmap pass per host: never under the lock). A finished job
has no progress cache: its last stored topology, and for its READY hosts every byte.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Collection, Mapping
from dataclasses import dataclass

import numpy as np
from relgate_trust.job_request import JobSpec
from relgate_trust.manifest import CheckpointManifest

from relgate_agent.contracts import (
    ORIGIN,
    STRIPE_DONE,
    JobSummary,
    JobTopology,
    StripeHop,
    StripeView,
)
from relgate_agent.coordinator.jobstate import JobState
from relgate_agent.coordinator.store import JobRow
from relgate_agent.coordinator.topology import Topology, index_topology

# a hop builder: (stripe, host, its downstreams) -> the hop
_Hop = Callable[[int, str, tuple[str, ...]], StripeHop]

UNKNOWN = -1  # bytes done of a host a finished job's records say nothing about


@dataclass(frozen=True)
class HostSnapshot:
    """What the progress cache held of one host when the snapshot was taken."""

    have: bytes
    ready: bool
    stripe_rx_bps: tuple[int, ...]
    bypassed: tuple[int, ...]


@dataclass(frozen=True)
class JobSnapshot:
    job_id: str
    state: str
    topology: Topology
    manifest: CheckpointManifest
    hosts: Mapping[str, HostSnapshot]


def live_summary(job: JobState) -> JobSummary:
    return JobSummary(
        job_id=job.job_id,
        model=job.manifest.model,
        version=job.manifest.version,
        state=job.state,
        hosts_total=len(job.targets),
        hosts_ready=job.ready_count,
        created_at=int(job.created_at),
    )


def with_leader(summary: JobSummary, leader: tuple[str, str, int] | None) -> JobSummary:
    """``summary`` naming its leading replica and lease epoch (``leader``: replica,
    address, epoch; None: no live lease)."""
    if leader is None:
        return summary
    return dataclasses.replace(summary, leader_replica=leader[0], leader_epoch=leader[2])


def stored_summary(row: JobRow) -> JobSummary:
    spec = JobSpec.from_stored(row.spec)
    return JobSummary(
        job_id=row.job_id,
        model=spec.model,
        version=spec.version,
        state=row.state,
        hosts_total=len(row.targets),
        hosts_ready=len(set(row.ready_hosts) & set(row.targets)),
        created_at=int(row.created_at),
    )


def snapshot(job: JobState) -> JobSnapshot:
    """Under the coordinator lock: references only (the topology is replaced, never
    changed, once published; bitmaps and rate tuples are immutable)."""
    return JobSnapshot(
        job.job_id,
        job.state,
        job.topology,
        job.manifest,
        {
            h: HostSnapshot(hp.have, hp.ready, hp.stripe_rx_bps, hp.bypassed)
            for h, hp in job.hosts.items()
        },
    )


def _stripe_ids(manifest: CheckpointManifest, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Each chunk's stripe (chunk index mod k) and size."""
    n = manifest.num_chunks
    sizes = np.fromiter((c.size for c in manifest.chunks), dtype=np.int64, count=n)
    return np.arange(n, dtype=np.int64) % max(k, 1), sizes


def stripe_sizes(manifest: CheckpointManifest, k: int) -> list[int]:
    """Bytes of each stripe's chunks."""
    ids, sizes = _stripe_ids(manifest, k)
    return [int(v) for v in np.bincount(ids, weights=sizes, minlength=k)[:k]]


def verified_bytes(have: bytes, ids: np.ndarray, sizes: np.ndarray, k: int) -> list[int]:
    """Per stripe, the bytes of the chunks ``have`` marks verified (bit i, LSB first in
    byte i/8, is chunk i; a short bitmap holds nothing past its end)."""
    n = len(sizes)
    bits = np.unpackbits(np.frombuffer(have, dtype=np.uint8), bitorder="little")[:n]
    held = np.zeros(n, dtype=np.int64)
    held[: len(bits)] = bits
    return [int(v) for v in np.bincount(ids, weights=sizes * held, minlength=k)[:k]]


def topology_view(snap: JobSnapshot) -> JobTopology:
    """The live job's chains with each hop's reported rate and verified bytes."""
    topo, k = snap.topology, len(snap.topology.stripes)
    ids, sizes = _stripe_ids(snap.manifest, k)
    totals = [int(v) for v in np.bincount(ids, weights=sizes, minlength=k)[:k]]
    done: dict[str, list[int]] = {}
    for h in topo.racks:
        hs = snap.hosts.get(h)
        if hs is None:
            done[h] = [UNKNOWN] * k
        elif hs.ready:
            done[h] = list(totals)
        else:
            done[h] = verified_bytes(hs.have, ids, sizes, k)

    def hop(s: int, h: str, downstreams: tuple[str, ...]) -> StripeHop:
        hs = snap.hosts.get(h)
        rates = hs.stripe_rx_bps if hs is not None else ()
        bypassed = hs is not None and s in hs.bypassed
        rate = rates[s] if s < len(rates) else 0
        return StripeHop(
            host_id=h,
            upstream=topo.stripes[s].parent.get(h) or ORIGIN,
            downstreams=downstreams,
            rx_bytes_per_s=STRIPE_DONE if bypassed else int(rate),
            bytes_done=done[h][s],
            bypassed=bypassed,
        )

    return _view(snap.job_id, snap.state, topo, True, totals, hop)


def stored_view(
    row: JobRow, manifest: CheckpointManifest | None, ready: Collection[str]
) -> JobTopology:
    """A finished job: its last stored topology; a READY host holds every byte, the
    others' progress is unknown (so is every byte count without the manifest)."""
    topo, k = row.topology, len(row.topology.stripes)
    totals = stripe_sizes(manifest, k) if manifest is not None else [UNKNOWN] * k

    def hop(s: int, h: str, downstreams: tuple[str, ...]) -> StripeHop:
        return StripeHop(
            host_id=h,
            upstream=topo.stripes[s].parent.get(h) or ORIGIN,
            downstreams=downstreams,
            rx_bytes_per_s=0,
            bytes_done=totals[s] if h in ready else UNKNOWN,
        )

    return _view(row.job_id, row.state, topo, False, totals, hop)


def _view(
    job_id: str,
    state: str,
    topo: Topology,
    live: bool,
    totals: list[int],
    hop: _Hop,
) -> JobTopology:
    idx = index_topology(topo)
    return JobTopology(
        job_id=job_id,
        state=state,
        topology_version=topo.version,
        live=live,
        stripes=tuple(
            StripeView(
                stripe=s,
                root=chain.root() or "",
                stripe_bytes=totals[s],
                hops=tuple(hop(s, h, idx.downstreams(s, h)) for h in chain.order),
            )
            for s, chain in enumerate(topo.stripes)
        ),
    )


__all__ = [
    "HostSnapshot",
    "JobSnapshot",
    "live_summary",
    "snapshot",
    "stored_summary",
    "stored_view",
    "stripe_sizes",
    "topology_view",
    "verified_bytes",
]
