"""The manifest envelope from peers, not through the coordinator (real processes, sockets,
mutual TLS on both planes).

A host that registers once other hosts report holding the job's verified manifest is
named up to three of them (same rack first) and fetches the envelope over the data plane
(FETCH_MANIFEST), verifying it with its own trusted keys. A source that serves a forged
envelope (an enrolled host with a valid certificate, lying) is skipped and named in the
host's errors; the next source serves it; the coordinator never sends the 2.5 MB.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import Any

import grpc
from agent_harness import HOSTS, Cluster, assert_placed, job_spec

from relgate_agent.dataplane.transport import OP_FETCH_MANIFEST, DataServer
from relgate_agent.pki import GRPC_TLS_OPTIONS, data_server_context, grpc_channel_credentials
from relgate_agent.proto import distribution_pb2 as pb
from relgate_agent.proto import distribution_pb2_grpc as pbg
from relgate_agent.rpc import GRPC_CLIENT_OPTIONS


def _stats(cluster: Cluster, host: str, job: str) -> dict[str, Any]:
    d = cluster.models_root(host) / ".agent-stats"
    (path,) = sorted(d.glob(f"{job}.*.json"))
    return json.loads(path.read_text())


def _create(cluster: Cluster, checkpoint: dict[str, Any]) -> str:
    c = cluster.client()
    try:
        # the late hosts join the running job when their watch opens
        return c.create_job(**job_spec(checkpoint, ready_threshold_ppm=1_000_000)).job_id
    finally:
        c.close()


def _holders(cluster: Cluster, job: str, n: int) -> bool:
    st = cluster.status(job)
    return sum(h["state"] in ("TRANSFERRING", "READY") for h in st["hosts"]) >= n


class ForgedSource:
    """The data plane of a lying host: it serves the job's envelope with one byte flipped
    (its signature no longer verifies) for the digest the coordinator names."""

    def __init__(self, digest: str, envelope: bytes) -> None:
        forged = bytearray(envelope)
        forged[len(forged) // 2] ^= 0x01
        self.held = (digest, bytes(forged))
        self.served = 0
        self.closed = False

    def envelope(self) -> tuple[str, bytes]:
        self.served += 1
        return self.held

    def count_tx(self, n: int) -> None:
        pass

    def stripe_blocks(self, stripe: int) -> list[int]:
        return []  # it serves no stripe (its downstreams are refused and report it)


class Liar:
    """An enrolled fleet host with a valid certificate that heartbeats, registers and keeps
    reporting that it holds the verified manifest, while its data plane serves a forged
    envelope and refuses every stripe."""

    name, rack = "h90", "r9"

    def __init__(self, cluster: Cluster, envelope: bytes, digest: str) -> None:
        cluster.enrolled.setdefault(self.name, (self.rack, "cluster=inf-a"))
        assert cluster.pki  # issues its certificate: a real, enrolled fleet host
        cluster.enroll_host(self.name, self.rack)
        creds = grpc_channel_credentials(cluster.tls(self.name))
        self.channel = grpc.secure_channel(
            cluster.coordinator, creds, options=GRPC_CLIENT_OPTIONS + GRPC_TLS_OPTIONS
        )
        self.stub = pbg.AgentServiceStub(self.channel)
        self.source = ForgedSource(digest, envelope)
        self.digest = digest
        self.server = DataServer(
            "127.0.0.1",
            0,
            lambda job: self.source,  # type: ignore[arg-type,return-value]
            tls=data_server_context(cluster.tls(self.name)),
            authorize=lambda job, peer, op, stripe, topo: None if op == OP_FETCH_MANIFEST else "no",
        )
        self.server.start()
        self.stop = threading.Event()
        request = pb.WatchRequest(
            host_id=self.name, rack=self.rack, data_address=self.server.address
        )
        self.watch = self.stub.Watch(request)
        next(self.watch)  # heartbeated: a live, enrolled target of the next job

    def register(self, job: str) -> None:
        request = pb.RegisterRequest(
            job_id=job, host_id=self.name, rack=self.rack, data_address=self.server.address
        )
        self.stub.Register(request, timeout=10)

    def keep_claiming(self, job: str) -> None:
        """ "I hold the verified manifest", every half second, until closed."""

        def lie() -> None:
            while not self.stop.wait(0.5):
                request = pb.ReportProgressRequest(
                    job_id=job,
                    host_id=self.name,
                    rack=self.rack,
                    data_address=self.server.address,
                    manifest_digest=self.digest,
                )
                self.stub.ReportProgress(request, timeout=10)

        threading.Thread(target=lie, daemon=True).start()

    def close(self) -> None:
        self.stop.set()
        self.watch.cancel()
        self.server.stop()
        self.channel.close()


def test_a_late_host_takes_the_envelope_from_a_peer_and_skips_a_forged_one(
    cluster: Cluster, checkpoint: dict[str, Any]
) -> None:
    m = checkpoint["manifest"]
    cluster.start_coordinator()
    first = HOSTS[:6]
    for h, r in first:
        cluster.start_agent(h, r)
    cluster.wait_registered(len(first))
    # the liar sits in the late hosts' rack r9, so it is named first to them
    liar = Liar(cluster, Path(checkpoint["envelope"]).read_bytes(), m.digest)
    job = _create(cluster, checkpoint)
    try:
        liar.register(job)
        cluster.wait_for(lambda: _holders(cluster, job, len(first)), 60, "first hosts hold it")
        liar.keep_claiming(job)
        cluster.wait_for(lambda: _reported(cluster, job), 30, "the first hosts reported")
        late = [("h06", "r9"), ("h07", "r9")]
        for h, r in late:
            cluster.start_agent(h, r)
        cluster.wait_for(
            lambda: all(_ready(cluster, job, h) for h, _ in [*first, *late]), 120, "all READY"
        )
        for h, _ in [*first, *late]:
            assert_placed(cluster, checkpoint, h)
        errors = {h["host_id"]: h["errors"] for h in cluster.status(job)["hosts"]}
        honest = {h for h, _ in [*first, *late]}
        for h, _ in late:
            came_from = _stats(cluster, h, job)["manifest_from"]
            assert came_from in honest - {h}, (h, came_from)  # a peer, not the coordinator
        # the liar is named first (alone in r9 when h06 registers): its forged copy was
        # fetched, refused by h06's own keys and reported, and h06 took the next source
        assert any(
            e.startswith("MANIFEST_SOURCE") and f"from={liar.name}" in e for e in errors["h06"]
        )
        assert liar.source.served >= 1
        # and it reported itself alive while serving nobody: its downstreams' complaints made
        # it a leaf, so they finished without it
        assert any(e.startswith("DEMOTED not serving") for e in errors[liar.name])
        # the first hosts registered in one storm: one copy per rack from the coordinator
        sent = [_stats(cluster, h, job)["manifest_from"] for h, _ in first]
        assert 1 <= sent.count("coordinator") <= 2, sent
    finally:
        liar.close()


def _reported(cluster: Cluster, job: str) -> bool:
    st = cluster.status(job)
    return all(h["chunks_verified"] > 0 for h in st["hosts"] if h["host_id"] != "h90")


def _ready(cluster: Cluster, job: str, host: str) -> bool:
    return any(h["host_id"] == host and h["state"] == "READY" for h in cluster.status(job)["hosts"])
